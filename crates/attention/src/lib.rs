//! Diffusion U-Net bottleneck attention blocks on Candle, each matching one PyTorch class.
//!
//! Every block mirrors the PyTorch forward it was ported from, loads its weights under the
//! exact PyTorch `state_dict()` names through a [`candle_nn::VarBuilder`], and takes a config
//! struct that deserializes from the PyTorch constructor's keyword arguments.
//!
//! | module | source |
//! |---|---|
//! | [`ddpm`] | lucidrains' `denoising-diffusion-pytorch` 2.x (`Attention`, `LinearAttention`) |
//! | [`annotated_diffusion`] | the Hugging Face "Annotated Diffusion" blog post |
//! | [`ldm`] | CompVis latent-diffusion / Stable Diffusion (`ldm.modules.attention`, `ldm.modules.diffusionmodules.model`) |
//! | [`openai`] | OpenAI guided/improved-diffusion and ldm `openaimodel.py` `AttentionBlock` |
//! | [`diffusers`] | diffusers 0.42.1: `Attention`, `FeedForward`, `BasicTransformerBlock`, `Transformer2DModel` |
//! | [`fastai`] | the fast.ai course (course22p2) `SelfAttention` classes |
//! | [`torch`] | `torch.nn.MultiheadAttention` (2.15) |
//! | [`textbook`] | the "Attention Is All You Need" textbook classes |
//!
//! All of them compute attention through one core, [`sdpa`]; head splitting lives in
//! [`heads`], and the shared layers (projections, convolutions, norms) in [`layers`], which run
//! on the CPU through the packed-weight GEMM and norm kernels of [`cpu_kernels`] (f32 weights,
//! AVX2 + FMA or AVX-512; Candle's ops elsewhere, or everywhere with
//! `UNET_ATTENTION_LAYERS=candle`).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::VarBuilder;
//! use unet_attention::diffusers::{Attention, AttentionConfig};
//!
//! fn main() -> anyhow::Result<()> {
//!     let dev = Device::Cpu;
//!     // The VAE mid-block attention of Stable Diffusion, with the kwargs diffusers uses.
//!     let cfg: AttentionConfig = unet_attention::config::from_str(
//!         "diffusers.Attention",
//!         r#"{"query_dim": 512, "heads": 1, "dim_head": 512, "eps": 1e-6, "norm_num_groups": 32,
//!             "residual_connection": true, "bias": true, "upcast_softmax": true,
//!             "_from_deprecated_attn_block": true}"#,
//!     )?;
//!     let vb = unsafe {
//!         VarBuilder::from_mmaped_safetensors(&["vae/diffusion_pytorch_model.safetensors"], DType::F32, &dev)?
//!     };
//!     let attn = Attention::new(vb.pp("decoder.mid_block.attentions.0"), &cfg)?;
//!     let x = Tensor::randn(0f32, 1., (1, 512, 32, 32), &dev)?;
//!     let y = attn.forward(&x, None, None)?;
//!     assert_eq!(y.dims(), x.dims());
//!     Ok(())
//! }
//! ```

pub mod annotated_diffusion;
pub mod config;
pub mod cpu_kernels;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ddpm;
pub mod diffusers;
pub mod error;
pub mod fastai;
pub mod heads;
pub mod layers;
pub mod ldm;
pub mod openai;
pub mod sdpa;
mod setting;
pub mod textbook;
pub mod torch;
pub mod trace;
mod validate;

pub use error::{Error, Result};

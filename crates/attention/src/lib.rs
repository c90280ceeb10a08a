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
//! | [`models`] | whole models from those blocks: diffusers 0.42.1 `UNet2DConditionModel` (SD 1.x, 2.x, XL) |
//!
//! All of them compute attention through one core, [`sdpa`]; head splitting lives in
//! [`heads`], and the shared layers (projections, convolutions, norms) in [`layers`], which run
//! on the CPU through the packed-weight GEMM and norm kernels of [`cpu_kernels`] (f32 weights,
//! AVX2 + FMA or AVX-512; Candle's ops elsewhere, or everywhere with
//! `UNET_ATTENTION_LAYERS=candle`).
//!
//! ## Layers
//!
//! The modules are layered, bottom first: a module uses only modules on lines above its own
//! (modules on one line do not use each other), so the imports run one way and there is no
//! circle. `tests/attention/layering.rs` reads this list and fails on any `crate::` path that breaks it;
//! `docs/architecture.md` explains the layers.
//!
//! 1. [`error`], `test_support` — the error type ([`Error`], [`Result`]); what the tests share.
//! 2. [`config`], [`trace`], [`float64_run`], [`weights`] — configs read from PyTorch kwargs; the
//!    trace recorder; how a float64 run treats PyTorch's float32 steps (the twin conventions);
//!    weights that remember what was read from them (the one tracker the folder loaders and
//!    `unet-parity` share).
//! 3. [`files`], `cpu`, `cuda_plan` — files from strangers (regular files only, JSON and
//!    safetensors headers read within bounds, sharded indexes honoured, model folders); the bottom
//!    of the CPU kernels: instruction set, cache sizes, settings, scratch, `exp`/`erf`, the AVX2
//!    and AVX-512 microkernels and the AMX bf16 tile, `contiguous`; the fused CUDA attention
//!    kernel's launch plan (pure arithmetic, run through the CPU emulation in tests).
//! 4. [`cpu_kernels`], `cuda` — the CPU kernels (layer GEMM, Winograd, norms, the attention kernel);
//!    the fused CUDA attention kernel, the cuDNN convolution (feature `cudnn`) and the TF32 mode.
//! 5. [`ops`], [`heads`] — tensor ops with PyTorch's rounding; head splitting.
//! 6. `validate` — argument checks of the blocks and the attention core.
//! 7. [`sdpa`] — the attention core.
//! 8. [`layers`] — the shared layers (projections, convolutions, norms).
//! 9. [`annotated_diffusion`], [`ddpm`], [`diffusers`], [`fastai`], [`textbook`], [`torch`] —
//!    block families.
//! 10. [`ldm`] — block families built on the ones above (diffusers' `Attention`).
//! 11. [`openai`] — block families built on [`ldm`].
//! 12. [`models`] — whole models built from the block families (diffusers' `UNet2DConditionModel`).
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
pub(crate) mod cpu;
pub mod cpu_kernels;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod cuda_plan;
pub mod ddpm;
pub mod diffusers;
pub mod error;
pub mod fastai;
pub mod files;
pub mod float64_run;
pub mod heads;
pub mod layers;
pub mod ldm;
pub mod models;
pub mod openai;
pub mod ops;
pub mod sdpa;
#[cfg(test)]
pub(crate) mod test_support;
pub mod textbook;
pub mod torch;
pub mod trace;
mod validate;
pub mod weights;

pub use error::{Error, FileError, Result};

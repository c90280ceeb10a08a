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
//! | [`ldm`] | CompVis latent-diffusion / Stable Diffusion `ldm.modules.attention` |
//! | [`diffusers`] | `diffusers.models.attention_processor.Attention` (0.42.1) |
//! | [`fastai`] | the fast.ai course (course22p2) `SelfAttention` classes |
//! | [`torch`] | `torch.nn.MultiheadAttention` (2.15) |
//! | [`textbook`] | the "Attention Is All You Need" textbook classes |
//!
//! All of them compute attention through one core, [`sdpa`]; head splitting lives in
//! [`heads`], and the shared layers (projections, norms) in [`layers`].

pub mod annotated_diffusion;
pub mod config;
pub mod ddpm;
pub mod diffusers;
pub mod error;
pub mod fastai;
pub mod heads;
pub mod layers;
pub mod ldm;
pub mod sdpa;
pub mod textbook;
pub mod torch;

pub use error::{Error, Result};

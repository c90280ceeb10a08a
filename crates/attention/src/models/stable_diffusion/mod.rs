//! Drop-in replacements for candle-transformers 0.11.1's
//! `candle_transformers::models::stable_diffusion::{unet_2d, vae}`: the same module paths, type
//! names, public config fields, `Default`s and method signatures, so that a pipeline written
//! against candle-transformers builds on our diffusers-exact models by changing its `use` lines:
//!
//! ```ignore
//! // use candle_transformers::models::stable_diffusion::{unet_2d, vae};
//! use unet_attention::models::stable_diffusion::{unet_2d, vae};
//! ```
//!
//! Each config converts to the diffusers `config.json` kwargs our models take
//! (`to_diffusers`); what candle-transformers' configs cannot express takes diffusers' defaults
//! (each module's docs list them). Errors are this crate's [`Error`](crate::Error), which converts
//! into `candle_core::Error` (`?` works in code returning `candle_core::Result`).
//! docs/candle-transformers.md ("Switching from candle-transformers") says what differs.

pub mod unet_2d;
pub mod vae;

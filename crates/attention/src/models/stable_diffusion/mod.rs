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
//! (each module's docs list them). Errors are this crate's [`Error`], which converts
//! into `candle_core::Error` (`?` works in code returning `candle_core::Result`).
//! docs/candle-transformers.md ("Switching from candle-transformers") says what differs.
//!
//! Strict, as the folder loaders (`UNet2DConditionModel::load`) are: a config the drop-in cannot
//! build is refused, and so is a `VarBuilder` holding weights under its prefix that the model
//! built from the config does not read (named, with the closest name it read): weights of another
//! shape of model than the config describes (a deeper transformer, another resnet, block or
//! attention, SDXL's `add_embedding`, a quant conv switched off) are not silently left out.
//! Candle's `VarBuilder` cannot list its names, so they are found by asking it about the names
//! near the ones read (`crate::weights::unread_near`); a `VarBuilder` that claims every name
//! (`VarBuilder::zeros`) is not checked.

pub mod unet_2d;
pub mod vae;

use crate::weights::{unread_near, unused_list, Recording};
use crate::{Error, Result};
use candle_nn::VarBuilder;

/// How many unread weights the error names (then `and N more`).
const SHOWN: usize = 8;

/// `build` on a recording view of `vs`, then the weights under `vs`'s prefix it did not read
/// (`extra`: optional modules to ask about, besides the names near the ones read) refused by
/// name, with `hint` on what to do.
fn build_strict<T>(
    vs: VarBuilder,
    block: &'static str,
    extra: &[String],
    hint: &str,
    build: impl FnOnce(VarBuilder) -> Result<T>,
) -> Result<T> {
    let (rec, vb) = Recording::new(vs);
    let model = build(vb)?;
    let unread = unread_near(&rec, extra);
    if unread.is_empty() {
        return Ok(model);
    }
    let read: Vec<String> = rec.read().into_iter().collect();
    let prefix = match rec.prefix() {
        p if p.is_empty() => "the VarBuilder's root".to_string(),
        p => format!("the VarBuilder's prefix `{p}`"),
    };
    Err(Error::weights(
        block,
        format!(
            "{} weight(s) under {prefix} not read by the model this config builds (a strict load_state_dict \
             refuses them): {}; {hint}",
            unread.len(),
            unused_list(&unread, &read, SHOWN)
        ),
    ))
}

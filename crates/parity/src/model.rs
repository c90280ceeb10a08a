//! A diffusers model folder to its mid block in one call: `config.json` gives the block and its
//! kwargs ([`unet_attention::diffusers::model_config`]), the folder's weights
//! (`diffusion_pytorch_model.safetensors`, its sharded index, or the `.bin` pickle; read by
//! header and on demand, never whole) give the tensors under the block's prefix.
//!
//! ```no_run
//! use candle_core::{DType, Device};
//! use unet_attention::diffusers::MidBlock;
//!
//! # fn main() -> anyhow::Result<()> {
//! // A diffusers folder: `unet/` of a Stable Diffusion pipeline (or its `config.json`).
//! let mid = unet_parity::model::mid_block("sd15/unet", None, &Device::Cpu, DType::F32)?;
//! if let MidBlock::UNetMidBlock2DCrossAttn(block) = &mid.block {
//!     // block.forward(hidden_states, temb, encoder_hidden_states, attention_mask, encoder_attention_mask)
//! }
//! println!("{} at `{}`", mid.config.block_id(), mid.prefix);
//! // The VAE has two: name the one you want.
//! let _decoder = unet_parity::model::mid_block("sd15/vae", Some("decoder.mid_block"), &Device::Cpu, DType::F32)?;
//! # Ok(())
//! # }
//! ```

use crate::checkpoint::{Checkpoint, PrefixView};
use crate::error::{ParityError, Result};
use crate::weights::TrackedWeights;
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use unet_attention::diffusers::model_config::{mid_blocks, MidBlockSpec};
use unet_attention::diffusers::{MidBlock, MidBlockConfig};

/// Weight files a diffusers model folder holds, in the order they are looked for.
pub use unet_attention::files::folder::{weight_file, WEIGHT_FILES};

/// A mid block built from a model folder.
pub struct ModelMidBlock {
    /// Where it sits in the model's state dict, as a `VarBuilder` prefix (`mid_block`,
    /// `decoder.mid_block`; `""` for a ControlNet's whole mid block).
    pub prefix: String,
    /// Its config, typed (serializes back to the PyTorch kwargs).
    pub config: MidBlockConfig,
    /// The block.
    pub block: MidBlock,
    /// The weight file it was loaded from.
    pub weights: PathBuf,
}

/// The folder's `config.json` and weight file (`model` may also be the `config.json` itself), as
/// `unet_attention::files::folder` finds them for the library's model loaders.
pub fn model_files(model: &Path) -> Result<(PathBuf, PathBuf)> {
    let files = unet_attention::files::folder::ModelFiles::find(model)?;
    Ok((files.config, files.weights))
}

/// The mid block specs the model's `config.json` describes (keys the class does not have are
/// refused, naming them).
pub fn specs(config: &Path) -> Result<Vec<MidBlockSpec>> {
    let bad = |message: String| ParityError::Checkpoint {
        path: config.to_path_buf(),
        message,
    };
    let json = crate::files::read_json(config)?;
    mid_blocks(&json, None, false).map_err(|e| bad(e.to_string()))
}

/// Every mid block of the model at `model` (a folder or its `config.json`), built on `device`
/// in `dtype`: one for a U-Net, two for a VAE (`encoder.mid_block`, `decoder.mid_block`).
pub fn mid_blocks_of(model: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<Vec<ModelMidBlock>> {
    let (config, weights) = model_files(model.as_ref())?;
    let checkpoint = Arc::new(Checkpoint::open(&weights)?);
    specs(&config)?
        .iter()
        .map(|spec| build(spec, &checkpoint, &config, &weights, device, dtype))
        .collect()
}

/// The mid block of the model at `model` (a folder or its `config.json`): the only one, or the
/// one at `prefix` (`decoder.mid_block`) when the model has several.
pub fn mid_block(
    model: impl AsRef<Path>,
    prefix: Option<&str>,
    device: &Device,
    dtype: DType,
) -> Result<ModelMidBlock> {
    let model = model.as_ref();
    let (config, weights) = model_files(model)?;
    let specs = specs(&config)?;
    let names = || {
        let all: Vec<String> = specs.iter().map(|s| format!("`{}` ({})", s.prefix, s.block)).collect();
        if all.is_empty() {
            "none".into()
        } else {
            all.join(", ")
        }
    };
    let spec = match prefix {
        Some(p) => {
            let p = p.trim_end_matches('.');
            specs.iter().find(|s| s.prefix == p).ok_or_else(|| {
                ParityError::Usage(format!(
                    "{}: no mid block at prefix `{p}`; the model's: {}",
                    model.display(),
                    names()
                ))
            })?
        }
        None if specs.len() == 1 => &specs[0],
        None => {
            return Err(ParityError::Usage(format!(
                "{}: the model has {} mid blocks ({}); name one with `prefix`",
                model.display(),
                specs.len(),
                names()
            )))
        }
    };
    let checkpoint = Arc::new(Checkpoint::open(&weights)?);
    build(spec, &checkpoint, &config, &weights, device, dtype)
}

fn build(
    spec: &MidBlockSpec,
    checkpoint: &Arc<Checkpoint>,
    config: &Path,
    weights: &Path,
    device: &Device,
    dtype: DType,
) -> Result<ModelMidBlock> {
    let typed = spec.typed().map_err(|e| ParityError::Checkpoint {
        path: config.to_path_buf(),
        message: e.to_string(),
    })?;
    let source = TrackedWeights::from_source(Arc::new(PrefixView::new(checkpoint.clone(), "")?));
    let vb = source.var_builder(dtype, device);
    let vb = if spec.prefix.is_empty() { vb } else { vb.pp(spec.prefix) };
    let block = MidBlock::new(vb, &typed).map_err(|e| ParityError::block(weights, spec.block, e))?;
    Ok(ModelMidBlock {
        prefix: spec.prefix.to_string(),
        config: typed,
        block,
        weights: weights.to_path_buf(),
    })
}

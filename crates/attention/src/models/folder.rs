//! Loading a whole model from a diffusers model folder (the `unet/` or `vae/` of a pipeline, as
//! `ModelMixin.from_pretrained` reads it): `config.json` and `diffusion_pytorch_model.safetensors`,
//! or the shards its `diffusion_pytorch_model.safetensors.index.json` lists.
//!
//! As strict as PyTorch's `load_state_dict(strict=True)`: a weight the model needs and the files
//! lack is named by the constructor (with the closest name present), and a weight in the files the
//! model never read is refused by name (with the closest name it read) after the model is built.
//! The files are a stranger's and are read by [`crate::files`], as `unet-parity` reads them:
//! regular files only (a FIFO is refused, never opened), `config.json` and the index up to a size
//! bound, shard names confined to the folder, the index's `weight_map` honoured, safetensors headers
//! checked before any tensor is read, and no file mapped.

use crate::files::folder::ModelFiles;
use crate::files::shards::SafetensorsFiles;
use crate::weights::{unused_list, TrackedWeights};
use crate::{Error, Result};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// How many unread weights an error names (then `and N more`).
pub(crate) const SHOWN: usize = 8;

/// A model folder's `config.json` (as read: the model's config parses it, checking the class) and
/// its weight files.
pub(crate) struct ModelFolder {
    pub config: Value,
    weights: Arc<SafetensorsFiles>,
}

impl ModelFolder {
    /// Read `folder`'s `config.json` and the headers of its weight files.
    pub fn open(folder: &Path, block: &'static str) -> Result<Self> {
        let files = ModelFiles::find(folder)?;
        if files.is_pickle() {
            return Err(Error::weights(
                block,
                format!(
                    "{}: a torch.save .bin checkpoint, which this loader does not read (convert it to \
                     safetensors first; `unet-parity` reads it)",
                    files.weights.display()
                ),
            ));
        }
        Ok(Self {
            config: files.read_config()?,
            weights: Arc::new(SafetensorsFiles::open(&files.weights)?),
        })
    }

    /// Build the model with `build` on the folder's weights (converted to `dtype`, on `device`),
    /// then refuse weights it never read.
    pub fn build<T>(
        &self,
        block: &'static str,
        dtype: DType,
        device: &Device,
        build: impl FnOnce(VarBuilder) -> Result<T>,
    ) -> Result<T> {
        let tracked = TrackedWeights::from_source(self.weights.clone());
        let model = build(tracked.var_builder(dtype, device))?;
        let unused = tracked.unused();
        if unused.is_empty() {
            return Ok(model);
        }
        Err(Error::weights(
            block,
            format!(
                "{} weight(s) in {} not used by the model (a strict load_state_dict refuses them): {}",
                unused.len(),
                self.describe(),
                unused_list(&unused, &tracked.read(), SHOWN)
            ),
        ))
    }

    fn describe(&self) -> String {
        let files: Vec<&Path> = self.weights.files().collect();
        match files.as_slice() {
            [one] => one.display().to_string(),
            many => format!("{} shards of {}", many.len(), self.weights.path().display()),
        }
    }
}

//! Loading a whole model from a diffusers model folder (the `unet/` or `vae/` of a pipeline, as
//! `ModelMixin.from_pretrained` reads it): `config.json` and `diffusion_pytorch_model.safetensors`,
//! or the shards its `diffusion_pytorch_model.safetensors.index.json` lists.
//!
//! As strict as PyTorch's `load_state_dict(strict=True)`: a weight the model needs and the files
//! lack is named by the constructor (Candle's missing-tensor error), and a weight in the files the
//! model never read is refused by name after the model is built. The files are treated as a
//! stranger's: `config.json` and the index are read up to a size bound, the index's shard names
//! must be plain file names in the folder, and the safetensors headers are checked by the
//! `safetensors` crate before any tensor is read.

use crate::{Error, Result};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most `config.json` or an index may hold: real ones are a few KiB.
const MAX_JSON_BYTES: u64 = 4 << 20;

/// A model folder's `config.json` (as read: the model's config parses it, checking the class) and
/// its weight files.
pub(crate) struct ModelFolder {
    pub config: Value,
    files: Vec<PathBuf>,
}

impl ModelFolder {
    /// Read `folder`'s `config.json` and find its weight files.
    pub fn open(folder: &Path, block: &'static str) -> Result<Self> {
        Ok(Self {
            config: read_json(&folder.join("config.json"), block)?,
            files: weight_files(folder, block)?,
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
        // SAFETY: the files are memory-mapped read-only; as Candle's own loaders, we assume
        // nobody truncates them while the model is being built (the tensors are copied out).
        let st = unsafe { MmapedSafetensors::multi(&self.files)? };
        let all: BTreeSet<String> = st.tensors().into_iter().map(|(name, _)| name).collect();
        let tracked = Tracked {
            inner: st,
            used: Mutex::new(BTreeSet::new()),
        };
        let used = std::sync::Arc::new(tracked);
        let vb = VarBuilder::from_backend(Box::new(Shared(used.clone())), dtype, device.clone());
        let model = build(vb)?;
        let read = used
            .used
            .lock()
            .map_err(|_| Error::config(block, "weight tracking poisoned"))?;
        let unused: Vec<&String> = all.iter().filter(|n| !read.contains(*n)).collect();
        if !unused.is_empty() {
            let shown: Vec<String> = unused.iter().take(8).map(|n| format!("`{n}`")).collect();
            let more = unused.len().saturating_sub(shown.len());
            return Err(Error::weights(
                block,
                format!(
                    "{} weight(s) in {} not used by the model (a strict load_state_dict refuses them): {}{}",
                    unused.len(),
                    self.describe(),
                    shown.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        Ok(model)
    }

    fn describe(&self) -> String {
        match self.files.as_slice() {
            [one] => one.display().to_string(),
            many => format!("{} shards", many.len()),
        }
    }
}

/// A JSON file of at most [`MAX_JSON_BYTES`].
fn read_json(path: &Path, block: &'static str) -> Result<Value> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| candle_core::Error::from(e).with_path(path))?;
    let mut text = String::new();
    file.take(MAX_JSON_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| candle_core::Error::from(e).with_path(path))?;
    if text.len() as u64 > MAX_JSON_BYTES {
        return Err(Error::config(
            block,
            format!("{}: larger than {} MiB", path.display(), MAX_JSON_BYTES >> 20),
        ));
    }
    serde_json::from_str(&text).map_err(|e| Error::config(block, format!("{}: {e}", path.display())))
}

/// The weight files of a folder: the single safetensors file, or the shards its index lists
/// (plain file names in the folder; anything else is refused).
fn weight_files(folder: &Path, block: &'static str) -> Result<Vec<PathBuf>> {
    let single = folder.join("diffusion_pytorch_model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index_path = folder.join("diffusion_pytorch_model.safetensors.index.json");
    if !index_path.is_file() {
        return Err(Error::weights(
            block,
            format!(
                "{}: neither diffusion_pytorch_model.safetensors nor its .index.json is there \
                 (a .bin checkpoint? convert it to safetensors first)",
                folder.display()
            ),
        ));
    }
    let index = read_json(&index_path, block)?;
    let map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::weights(block, format!("{}: no `weight_map` object", index_path.display())))?;
    let mut names = BTreeSet::new();
    for (key, file) in map {
        let file = file.as_str().filter(|f| is_plain_file_name(f)).ok_or_else(|| {
            Error::weights(
                block,
                format!(
                    "{}: weight_map[{key:?}] = {file}: expected a file name in the folder",
                    index_path.display()
                ),
            )
        })?;
        names.insert(file.to_string());
    }
    if names.is_empty() {
        return Err(Error::weights(
            block,
            format!("{}: `weight_map` is empty", index_path.display()),
        ));
    }
    Ok(names.into_iter().map(|n| folder.join(n)).collect())
}

/// A name with no directory part (no separator, not `.` or `..`).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']) && !name.contains(':')
}

/// The safetensors and the names the model read from them.
struct Tracked {
    inner: MmapedSafetensors,
    used: Mutex<BTreeSet<String>>,
}

/// [`Tracked`] shared between the `VarBuilder` and the loader.
struct Shared(std::sync::Arc<Tracked>);

impl Shared {
    fn mark(&self, name: &str) {
        if let Ok(mut used) = self.0.used.lock() {
            used.insert(name.to_string());
        }
    }
}

impl SimpleBackend for Shared {
    fn get(&self, s: Shape, name: &str, _init: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.0.inner.load(name, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!("shape mismatch for {name}"),
                expected: s,
                got: t.shape().clone(),
            }
            .bt());
        }
        self.mark(name);
        t.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.0.inner.load(name, dev)?;
        self.mark(name);
        t.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.inner.get(name).is_ok()
    }
}

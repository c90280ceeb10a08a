//! A diffusers model folder (the `unet/` or `vae/` of a pipeline, as `ModelMixin.from_pretrained`
//! reads it): `config.json` and one weight file of [`WEIGHT_FILES`], the first that is there.
//! A weight file that is there but is not a regular file (a FIFO, a folder) is still the one
//! found, so that reading it says what is wrong instead of another file being taken.

use super::FileError;
use std::path::{Path, PathBuf};

/// Weight files a diffusers model folder holds, in the order they are looked for.
pub const WEIGHT_FILES: &[&str] = &[
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.bin",
];

/// The first of [`WEIGHT_FILES`] in `folder` that exists (of any kind; see the module docs).
pub fn weight_file(folder: &Path) -> Option<PathBuf> {
    WEIGHT_FILES
        .iter()
        .map(|f| folder.join(f))
        .find(|p| std::fs::metadata(p).is_ok())
}

/// A model folder's files: its `config.json` and its weight file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    pub config: PathBuf,
    pub weights: PathBuf,
}

impl ModelFiles {
    /// The files of the folder `model` (or of the folder of `model` when it names the
    /// `config.json` itself); an error naming the folder when either is missing.
    pub fn find(model: &Path) -> Result<Self, FileError> {
        let (folder, config) = if model.is_dir() {
            (model.to_path_buf(), model.join("config.json"))
        } else {
            (
                model.parent().unwrap_or(Path::new(".")).to_path_buf(),
                model.to_path_buf(),
            )
        };
        if std::fs::metadata(&config).is_err() {
            return Err(FileError::content(
                &config,
                "a diffusers model folder holds config.json; this one has none",
            ));
        }
        let weights = weight_file(&folder).ok_or_else(|| {
            FileError::content(
                &folder,
                format!("no weights: expected one of {}", WEIGHT_FILES.join(", ")),
            )
        })?;
        Ok(Self { config, weights })
    }

    /// The `config.json`, read as [`super::read_json`] reads it.
    pub fn read_config(&self) -> Result<serde_json::Value, FileError> {
        super::read_json(&self.config)
    }

    /// Whether the weights are a `torch.save` pickle (`.bin`), which only `unet-parity` reads.
    pub fn is_pickle(&self) -> bool {
        self.weights.extension().is_some_and(|e| e == "bin")
    }
}

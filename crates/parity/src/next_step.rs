//! What to do next with a file or folder that holds no parity bundle: the hints that the errors
//! "no parity bundles found" (a folder) and "not a parity bundle" (a file) end with. A model
//! checkpoint (a state dict without `parity.*` metadata) or a diffusers model folder
//! (`config.json` beside its weights) is told apart, and the message names the three ways on:
//! `scripts/export_own.py` (bundles from a diffusers model folder), `unet-parity detect` (the mid
//! blocks a checkpoint holds) and `check --weights` (a checkpoint's weights on a bundle's inputs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folder holding `config.json` among the folders of `checkpoints` and `folder`.
fn model_folder<'a>(folder: Option<&'a Path>, checkpoints: &'a [PathBuf]) -> Option<&'a Path> {
    checkpoints
        .iter()
        .filter_map(|c| c.parent())
        .chain(folder)
        .find(|d| d.join("config.json").is_file())
}

fn show(path: &Path) -> String {
    let s = path.display().to_string();
    if s.is_empty() {
        ".".into()
    } else {
        s
    }
}

/// The commands that apply to the checkpoint `file` and, when there is one, its model folder.
fn commands(file: &Path, folder: Option<&Path>) -> String {
    let file = show(file);
    let export = match folder {
        Some(dir) => format!(
            "`scripts/export_own.py {0} --out DIR` (Python with diffusers; docs/checkpoints.md) writes bundles \
             of this diffusers model's mid blocks, and `scripts/export_own.py {0} --whole --out DIR` one of the \
             whole model (a UNet2DConditionModel or AutoencoderKL, every module's output recorded), to check \
             with `check --trace DIR`",
            show(dir)
        ),
        None => "`scripts/export_own.py MODEL_FOLDER --out DIR` writes bundles from a diffusers model folder \
                 (config.json beside the weights; docs/checkpoints.md)"
            .into(),
    };
    format!(
        "{export}; `unet-parity detect {file}` names the mid blocks it holds and their prefixes; \
         `unet-parity check BUNDLE --weights {file} --prefix P` runs a bundle with its weights \
         (weights/mid/ holds the committed mid-block bundles)"
    )
}

/// The end of "no parity bundles found" for `folder`, whose walk skipped `checkpoints`
/// (safetensors files without `parity.*` metadata). Empty for a folder with neither checkpoints
/// nor `config.json`.
pub(crate) fn no_bundles(folder: &Path, checkpoints: &[PathBuf]) -> String {
    // In a pipeline folder, a diffusers model's weights (`unet/`, `vae/`) before a text encoder's.
    let diffusers = checkpoints.iter().find(|c| {
        c.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("diffusion_pytorch_model"))
    });
    let first = diffusers.or(checkpoints.first());
    let model = model_folder(Some(folder), first.map(std::slice::from_ref).unwrap_or_default());
    let Some(first) = first else {
        return match model {
            Some(dir) => format!(
                "; {} is a model folder (config.json) without safetensors weights: {}",
                show(dir),
                commands(Path::new("WEIGHTS"), Some(dir))
            ),
            None => String::new(),
        };
    };
    let what = match checkpoints.len() {
        1 => "a model checkpoint".to_string(),
        n => format!("{n} model checkpoints"),
    };
    format!(
        "; it holds {what} without parity metadata ({}), not bundles: {}",
        show(first),
        commands(first, model)
    )
}

/// The end of "metadata `parity.format` is missing" for the file `path`: `None` when the file has
/// some `parity.*` metadata or tensor (a damaged bundle, whose error needs no hint).
pub(crate) fn not_a_bundle(path: &Path, metadata: &BTreeMap<String, String>, names: &[&str]) -> Option<String> {
    let parity = |s: &str| s.starts_with("parity.");
    if metadata.keys().any(|k| parity(k)) || names.iter().any(|n| parity(n)) {
        return None;
    }
    // A state dict's keys are module paths (`mid_block.resnets.0.conv1.weight`).
    let Some(key) = names.iter().find(|n| n.contains('.')) else {
        return Some(
            ": the file has no `parity.*` metadata or tensors. A bundle is written by scripts/parity_bundle.py's \
             `export_bundle` (docs/exporting.md)"
                .into(),
        );
    };
    let folder = path.parent().filter(|d| d.join("config.json").is_file());
    Some(format!(
        ": it looks like a model checkpoint (a state dict of {} tensors such as `{key}`). {}",
        names.len(),
        commands(path, folder)
    ))
}

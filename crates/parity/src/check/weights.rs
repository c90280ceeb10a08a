//! Where a check's weights and config come from: `--weights` or the checkpoint a bundle
//! references (`parity.weights`, `parity.prefix`, `parity.weights_key`, read as `torch.load`
//! would) or the bundle's own state dict, `--config` (a diffusers `config.json`, resolved to the
//! bundle's mid block as `unet_attention::diffusers::model_config` reads it) or `parity.config`,
//! and the weights the block left unread (a strict `load_state_dict` would refuse them).

use super::Options;
use crate::bundle::Bundle;
use crate::checkpoint::{Checkpoint, PrefixView};
use crate::error::{ParityError, Result};
use crate::weights::{unused_list, TrackedWeights};
use std::path::Path;
use std::sync::Arc;

/// How many unread weights a refusal names (then `and N more`).
const SHOWN_UNUSED: usize = 32;

/// The block's weights: `--weights` (a checkpoint under a prefix), else the checkpoint the bundle
/// references (`parity.weights`, relative to the bundle's folder, with `parity.prefix`), else the
/// bundle's own state dict. A bundle may not both hold weights and reference a checkpoint.
pub(crate) fn weight_source(bundle: &Bundle, opts: &Options) -> Result<TrackedWeights> {
    let path = bundle.path.as_path();
    let embedded = bundle.weights();
    let referenced = bundle.metadata.get("parity.weights");
    let (file, prefix) = match (&opts.weights, referenced) {
        (Some(w), _) => (w.file.clone(), w.prefix.clone()),
        (None, Some(rel)) => {
            if !embedded.is_empty() {
                return Err(ParityError::bundle(
                    path,
                    format!(
                        "the bundle holds {} weights and also references `parity.weights` = {rel:?}; keep one",
                        embedded.len()
                    ),
                ));
            }
            referenced_checkpoint(path, &bundle.metadata).unwrap_or_default()
        }
        (None, None) => return Ok(TrackedWeights::new(embedded)),
    };
    let checkpoint = Arc::new(Checkpoint::open(&file)?);
    // A checkpoint's values are checked as they are read, as a bundle's own are (`check_values`).
    Ok(TrackedWeights::from_source(Arc::new(PrefixView::new(checkpoint, &prefix)?)).counting_non_finite())
}

/// The checkpoint a bundle at `path` with `metadata` references, and the prefix in it:
/// `parity.weights` relative to the bundle's folder, `parity.prefix` under `parity.weights_key`
/// (the top-level pickle entry holding the state dict); `None` when it references none.
pub(crate) fn referenced_checkpoint(
    path: &Path,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Option<(std::path::PathBuf, String)> {
    let rel = metadata.get("parity.weights")?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let prefix = metadata.get("parity.prefix").cloned().unwrap_or_default();
    let prefix = match metadata.get("parity.weights_key") {
        Some(key) => format!("{key}.{prefix}"),
        None => prefix,
    };
    Some((dir.join(rel), prefix))
}

/// The block's constructor kwargs: from `--config` (a diffusers `config.json`) when given, else
/// `parity.config`.
pub(super) fn block_config(
    bundle: &Bundle,
    opts: &Options,
    block: &'static str,
    weights_at: Option<&str>,
) -> Result<(serde_json::Value, Option<String>)> {
    let Some(file) = &opts.model_config else {
        return Ok((bundle.config.clone(), None));
    };
    let json = crate::files::read_json(file)?;
    let bad = |message: String| ParityError::Checkpoint {
        path: file.clone(),
        message,
    };
    let specs = unet_attention::diffusers::model_config::mid_blocks(&json, None, opts.allow_unknown_config)
        .map_err(|e| bad(e.to_string()))?;
    let matching: Vec<_> = specs.iter().filter(|s| s.block == block).collect();
    // The VAE has an encoder and a decoder mid block of the same config: any will do, but prefer
    // the one the weights come from.
    let spec = matching
        .iter()
        .find(|s| {
            weights_at.is_some_and(|w| w.contains(&format!("`{}", s.key_prefix())) || w.contains(&s.key_prefix()))
        })
        .or(matching.first())
        .ok_or_else(|| {
            bad(if specs.is_empty() {
                format!("the model has no mid block, and the bundle's block is {block}")
            } else {
                format!(
                    "the model's mid block is {}, not {block}",
                    specs.iter().map(|s| s.block).collect::<Vec<_>>().join(", ")
                )
            })
        })?;
    Ok((spec.config.clone(), Some(file.display().to_string())))
}

/// Refuse weights read from a checkpoint (`--weights`, `parity.weights`) that hold NaN or
/// infinite values, naming them, as a bundle's own are refused: a comparison with them proves
/// nothing, and our NaN output would blame the port.
pub(super) fn check_finite(path: &Path, weights: &TrackedWeights) -> Result<()> {
    let found = weights.non_finite();
    if found.is_empty() {
        return Ok(());
    }
    let described: Vec<String> = found
        .iter()
        .take(SHOWN_UNUSED)
        .map(|(name, [nan, pos, neg])| {
            let parts: Vec<String> = [(nan, "NaN"), (pos, "+inf"), (neg, "-inf")]
                .iter()
                .filter(|(n, _)| **n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            format!("weight `{name}` has {}", parts.join(", "))
        })
        .collect();
    let more = found.len().saturating_sub(described.len());
    let place = weights.location().unwrap_or_default();
    Err(ParityError::Invalid {
        path: path.to_path_buf(),
        message: format!(
            "non-finite values in the checkpoint {place}: {}{} (a comparison with them proves nothing: the model \
             itself is broken, not the port)",
            described.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        ),
    })
}

/// Weights the block did not read. For a bundle's own state dict, all of them; for a checkpoint,
/// only those under the top-level names the block used (`mid_attn.extra` when it read
/// `mid_attn.*`), since the rest of the model shares the prefix.
fn unused_weights(weights: &TrackedWeights) -> Vec<String> {
    let unused = weights.unused();
    if weights.location().is_none() {
        return unused;
    }
    let first = |n: &str| n.split('.').next().unwrap_or("").to_string();
    let used: std::collections::BTreeSet<String> = weights
        .names()
        .filter(|n| !unused.contains(n))
        .map(|n| first(n))
        .collect();
    unused.into_iter().filter(|n| used.contains(&first(n))).collect()
}

/// Fail on weights the block did not read, with the closest used name for each (unless
/// `Options::allow_unused`).
pub(super) fn check_unused(path: &Path, block: &str, weights: &TrackedWeights, opts: &Options) -> Result<()> {
    let unused = unused_weights(weights);
    if unused.is_empty() || opts.allow_unused {
        return Ok(());
    }
    let place = weights.location().map(|l| format!(" in {l}")).unwrap_or_default();
    Err(ParityError::bundle(
        path,
        format!(
            "{} weights{place} not used by {block}: {} (pass --allow-unused to ignore)",
            unused.len(),
            unused_list(&unused, &weights.read(), SHOWN_UNUSED)
        ),
    ))
}

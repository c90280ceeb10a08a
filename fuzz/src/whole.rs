//! Arbitrary bytes as a whole-model bundle (`diffusers.UNet2DConditionModel`,
//! `diffusers.AutoencoderKL`), read as if it lay in `weights/whole/`, so that its `parity.weights`
//! reaches the committed checkpoints (`../models/diffusers_sd1/...`): the bundle checks, the
//! model's config, the checkpoint read through its header (or index), the whole forward on inputs
//! of any shape, and, when the last byte is odd, the stage comparison (`--trace`). Also the
//! memory estimate of the same header. Errors are expected; a panic, an abort or a runaway
//! allocation is a bug. Seeds: the committed whole-model bundles without their stages.

use std::path::Path;
use unet_parity::bundle::Bundle;
use unet_parity::check::{check_bundle, Options};

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let path = super::repo_root().join("weights/whole/fuzz.safetensors");
    let Ok(bundle) = Bundle::from_bytes(Path::new(&path), data) else {
        return;
    };
    let _ = unet_parity::memory::estimate(&bundle.metadata, &bundle.infos, unet_parity::bundle::Load::All, None);
    let opts = Options {
        trace: data.last().is_some_and(|b| b & 1 == 1),
        ..Options::default()
    };
    let _ = check_bundle(&bundle, &opts);
}

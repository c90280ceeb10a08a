//! Arbitrary bytes as a bundle file: the safetensors reader, the bundle validation, block
//! construction from whatever metadata and config survive, the forward and the comparison.
//! Errors are the expected outcome; a panic, an abort or a runaway allocation is a bug.
use std::path::Path;
use unet_parity::bundle::Bundle;
use unet_parity::check::{check_bundle, Options};

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let Ok(bundle) = Bundle::from_bytes(Path::new("fuzz.safetensors"), data) else {
        return;
    };
    // The last byte picks the options, so that the unused-weight path and runs in another
    // dtype than the bundle's (against its float64 output) are reached too.
    let flags = data.last().copied().unwrap_or(0);
    let dtype = ["", "f64", "f32", "f16", "bf16"][(flags >> 1) as usize % 5];
    let opts = Options {
        allow_unused: flags & 1 != 0,
        dtype: unet_parity::bundle::parse_dtype(dtype),
        ..Options::default()
    };
    let _ = check_bundle(&bundle, &opts);
}

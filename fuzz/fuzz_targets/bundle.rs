//! Arbitrary bytes as a bundle file: the safetensors reader, the bundle validation, block
//! construction from whatever metadata and config survive, the forward and the comparison.
//! Errors are the expected outcome; a panic, an abort or a runaway allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use unet_parity::bundle::Bundle;
use unet_parity::check::{check_bundle, Options};

fuzz_target!(|data: &[u8]| {
    let Ok(bundle) = Bundle::from_bytes(Path::new("fuzz.safetensors"), data) else {
        return;
    };
    // The last byte picks the options, so both dtypes and the unused-weight path are reached.
    let flags = data.last().copied().unwrap_or(0);
    let opts = Options {
        allow_unused: flags & 1 != 0,
        dtype: (flags & 2 != 0).then_some(unet_parity::bundle::parse_dtype("f64").unwrap()),
        ..Options::default()
    };
    let _ = check_bundle(&bundle, &opts);
});

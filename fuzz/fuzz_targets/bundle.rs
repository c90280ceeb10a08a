//! Arbitrary bytes as a bundle file: the safetensors reader, the bundle validation, block
//! construction from whatever metadata and config survive, the forward and the comparison.
//! Errors are the expected outcome; a panic, an abort or a runaway allocation is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::bundle::run(data));

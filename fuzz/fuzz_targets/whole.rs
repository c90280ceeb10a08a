//! See `fuzz/src/whole.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::whole::run(data));

//! See `fuzz/src/folder.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::folder::run(data));

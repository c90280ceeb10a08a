//! Arbitrary text as `parity.config` for every registry block, with the weights and inputs of
//! a committed bundle of that block (`weights/`, all small): config deserialization, block
//! construction, the forward and the comparison. The first byte picks the block, the second
//! the bundle; the rest is the config text. Errors are fine; a panic or an abort is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::config::run(data));

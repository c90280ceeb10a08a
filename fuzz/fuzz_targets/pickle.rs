//! Arbitrary bytes as a pickle, straight into the tool's own reader (`crates/parity/src/pickle/mod.rs`),
//! without the zip archive around it that the `checkpoint` target builds: every opcode, limit
//! and the flattening walk, as fast as libFuzzer can feed them. Errors are expected; a panic, an
//! abort, a stack overflow or a runaway allocation is a bug. A read that succeeds must keep
//! its own promises: tensor records whose elements and offset fit their storage.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::pickle::run(data));

//! Arbitrary bytes as the `data.pkl` of a `torch.save` zip archive (and, from the last byte, as a
//! whole file): the checkpoint reader (the pickle reader's opcodes and limits, the flattening walk, sections,
//! lazy tensor reads) and `detect`. Errors are expected; a panic, an abort or a stack overflow is
//! a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::checkpoint::run(data));

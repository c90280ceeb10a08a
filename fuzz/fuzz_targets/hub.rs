//! A Hub cache built from the input (refs holding any text or linking anywhere, snapshot files
//! that are files, folders, FIFOs or links into `blobs/`, out of the cache or to /dev/stdin),
//! then resolved offline with a `--revision` and `--subfolder` from the input too. Whatever the
//! cache holds, a file the resolution returns lies inside the cache (links followed), and nothing
//! blocks (libFuzzer's `-timeout` catches a hang on a FIFO).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::hub::run(data));

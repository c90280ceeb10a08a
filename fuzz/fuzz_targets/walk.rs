//! A folder tree built from the input (folders, bundle-named files, FIFOs and symbolic links to
//! `.`, `..`, `/`, siblings and /dev/stdin), then searched as `check FOLDER` searches it, and each
//! bundle found read as `check` reads it. The walk must end (no loop through links), find each
//! file once, stay inside the tree, and never block on a FIFO (libFuzzer's `-timeout` catches a
//! hang).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unet_parity_fuzz::walk::run(data));

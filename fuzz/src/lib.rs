//! The fuzz targets' bodies, one module each: `fuzz_targets/<name>.rs` hands libFuzzer's input to
//! `<name>::run`, and the workspace's stable test `crates/parity/tests/hostile/fuzz_smoke.rs`
//! includes these same files and runs them over the committed corpus and a bounded number of
//! mutations of it (so CI runs every target, without a nightly compiler or libFuzzer). Each module
//! finds the repository through `super::repo_root()`.

pub mod bundle;
pub mod checkpoint;
pub mod config;
pub mod folder;
pub mod hub;
pub mod pickle;
pub mod walk;
pub mod whole;

/// The repository (this package is its `fuzz/` folder).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

//! What this binary's modules share: `max_diff`, `naive_attention`, `seeded_randn` and `values_f64` (the crate's own
//! `src/test_support.rs`, the one its unit tests use) and the paths of the committed files.

use std::path::PathBuf;

#[path = "../../src/test_support.rs"]
mod test_support;
pub use test_support::{max_diff, naive_attention, seeded_randn, values_f64};

/// `weights/<rel>` at the repository root: the committed bundles and model checkpoints.
pub fn weights(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../weights")
        .join(rel)
}

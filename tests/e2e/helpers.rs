//! What the whole-model tests share: paths from the repository root, a bundle's tensors, and the
//! largest absolute difference of two tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// `rel` from the repository root.
pub fn root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every tensor of the safetensors file `rel` (a bundle: `parity.input.*`, `parity.output.*`).
pub fn bundle(rel: &str) -> BTreeMap<String, Tensor> {
    candle_core::safetensors::load(root(rel), &Device::Cpu)
        .unwrap()
        .into_iter()
        .collect()
}

/// max |a − b| over all elements (same dtype and shape).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

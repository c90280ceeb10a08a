//! What the crate's tests share: the `#[cfg(test)]` modules under `src/` (as
//! `crate::test_support`) and the integration tests of `tests/attention` (which compile this file
//! again through `#[path]`), so it names nothing of the crate.

use candle_core::{DType, Tensor};

/// The largest `|a − b|` over all elements, computed in f64 whatever the tensors' float dtype.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    (f64(a) - f64(b))
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

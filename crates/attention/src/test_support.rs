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

/// Every element of `t` (any float dtype, any shape), in f64, row-major.
pub fn values_f64(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Normal f32 values on the CPU from a fixed seed (and the shape), so that a test judges the same
/// numbers on every run and under every kernel choice. (The unit tests' alone.)
#[allow(dead_code)]
pub fn seeded_randn(shape: &[usize], seed: u64) -> Tensor {
    let mut state = shape.iter().fold(
        0x2545_f491_4f6c_dd1d ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        |h, &d| (h ^ d as u64).wrapping_mul(0x100_0000_01b3),
    ) | 1;
    let mut uniform = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()
}

/// Attention in f64 on plain row-major values, the tests' reference: `q` is (heads, lq, d), `k`
/// (heads, lk, d), `v` (heads, lk, dv) for `dims` = (heads, lq, lk, d, dv); `score(head, i, j,
/// q_i·k_j)` gives the logit (the caller's scale and mask); out (heads, lq, dv) =
/// `Σ_j e^(s_j − max)·v_j / Σ_j e^(s_j − max)`, or `empty` for a row whose logits are all −∞.
#[allow(dead_code)]
pub fn naive_attention(
    (q, k, v): (&[f64], &[f64], &[f64]),
    (heads, lq, lk, d, dv): (usize, usize, usize, usize, usize),
    score: impl Fn(usize, usize, usize, f64) -> f64,
    empty: f64,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(heads * lq * dv);
    for h in 0..heads {
        for i in 0..lq {
            let qi = &q[(h * lq + i) * d..][..d];
            let s: Vec<f64> = (0..lk)
                .map(|j| {
                    let kj = &k[(h * lk + j) * d..][..d];
                    score(h, i, j, qi.iter().zip(kj).map(|(a, b)| a * b).sum())
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                out.extend(std::iter::repeat_n(empty, dv));
                continue;
            }
            let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for c in 0..dv {
                out.push((0..lk).map(|j| w[j] * v[(h * lk + j) * dv + c]).sum::<f64>() / sum);
            }
        }
    }
    out
}

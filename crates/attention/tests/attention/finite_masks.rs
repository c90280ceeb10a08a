//! The attention core's CPU paths under large finite additive masks (issue 55): the conventions
//! that mask with `torch.finfo(float32).min`, `finfo(float16).min`, −1e10, −1e9 or −10000
//! instead of −∞, on a wholly masked first key block and wholly masked rows, causal masks, and
//! left and right key padding, in f32, f16 and bf16. The tiled CPU kernel (`Flash`, `Auto`) and
//! the chunked path against the reference path (torch's default tolerances, as `sdpa_paths`),
//! and every path against PyTorch's semantics: the logit of a masked key is the f32 sum of its
//! score and the mask, so a row whose keys all carry −1e9 (or −1e10, or finfo(f32).min) has
//! equal logits and averages v over its keys uniformly, which `fmaf(x, k, −fl(m·k))` (the fused
//! CUDA kernel's fold before the fix) does not give; in f32, the whole output against f64
//! softmax of those f32 logits.
//!
//! The 200-key shapes are one key block of the CPU kernels and of the chunked half-precision
//! arithmetic: what the chunked path computes on a GPU too (there it takes all keys as one
//! block); 1100 keys are three blocks of 512, the first wholly masked. (−∞ on every key of a row
//! keeps its documented result: 0 on the tiled kernel in every dtype and in half precision, NaN
//! on the f32 reference and chunked paths: `sdpa_paths::rows_without_keys`.)

use crate::common::{naive_attention, values_f64};
use candle_core::{DType, Device, Tensor};
use unet_attention::sdpa::{default_scale, sdpa_with, SdpaPath};

/// Batch b masks with `VALUES[b]`.
const VALUES: [f32; 5] = [f32::MIN, -65504.0, -1e10, -1e9, -1e4];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Pattern {
    /// The first `n` keys of every row and every key of every fifth row.
    FirstKeys(usize),
    /// Key j masked for query i where j > i (PyTorch's `is_causal`, aligned top left).
    Causal,
    /// Batch b's first keys, `pads(b)` of them (all of them in batch 2).
    LeftPad,
    /// Batch b's last keys, `pads(b + 2)` of them (all of them in batch 0).
    RightPad,
}

fn pads(b: usize, lk: usize) -> usize {
    [64, 100, lk, lk - 1, 5][b % 5].min(lk)
}

/// (B, 1, Lq, Lk) in f32.
fn mask(pattern: Pattern, (b, lq, lk): (usize, usize, usize)) -> Tensor {
    let m: Vec<f32> = (0..b * lq * lk)
        .map(|x| {
            let (bi, i, j) = (x / (lq * lk), x / lk % lq, x % lk);
            let masked = match pattern {
                Pattern::FirstKeys(n) => j < n || i % 5 == 4,
                Pattern::Causal => j > i,
                Pattern::LeftPad => j < pads(bi, lk),
                Pattern::RightPad => j >= lk - pads(bi + 2, lk),
            };
            if masked {
                VALUES[bi]
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(m, (b, 1, lq, lk), &Device::Cpu).unwrap()
}

fn randn(dims: &[usize], seed: u64, dtype: DType) -> Tensor {
    crate::common::seeded_randn(dims, seed).to_dtype(dtype).unwrap()
}

/// q and k of −1, 0 and 1: with a scale of 1/8 or 1/4 every path forms the same logits exactly
/// (the scores are multiples of the scale, and such a score plus −10000 or −65504 is
/// representable in f32), so the paths can be held to torch's tolerances on rows whose logits are
/// all near −10000: with rounded scores, one path's logit there can be one f32 step (2^-10 at
/// −10000, 2^-8 at −65504) from another's, a relative 1e-3 in that key's weight.
fn ternary(dims: &[usize], seed: u64, dtype: DType) -> Tensor {
    let x = crate::common::seeded_randn(dims, seed);
    x.round().unwrap().clamp(-1f32, 1f32).unwrap().to_dtype(dtype).unwrap()
}

/// torch.testing.assert_close's defaults: (rtol, atol).
fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1.3e-6, 1e-5),
        DType::F16 => (1e-3, 1e-5),
        _ => (1.6e-2, 1e-5),
    }
}

/// The first element of `got` off `want` by more than `atol + rtol·|want|` (or not finite).
fn first_off(got: &[f64], want: &[f64], dtype: DType) -> Option<(usize, f64, f64)> {
    let (rtol, atol) = tol(dtype);
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (a, b))| !a.is_finite() || (*a - *b).abs() > atol + rtol * b.abs())
        .map(|(i, (a, b))| (i, *a, *b))
}

/// f64 attention of the rounded inputs from logits rounded to f32 (score·scale in f32 plus the
/// f32 mask, as PyTorch forms them), (B, H, Lq, D).
fn f64_reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Vec<f64> {
    let (b, h, lq, d) = q.dims4().unwrap();
    let lk = k.dim(2).unwrap();
    let m = values_f64(mask);
    let score =
        |bh: usize, i: usize, j: usize, dot: f64| ((dot * scale) as f32 + m[(bh / h * lq + i) * lk + j] as f32) as f64;
    naive_attention(
        (&values_f64(q), &values_f64(k), &values_f64(v)),
        (b * h, lq, lk, d, d),
        score,
        f64::NAN,
    )
}

/// Rows (b, h, i) whose keys all carry the same mask value of −1e9 or below (equal f32 logits:
/// the score vanishes in the sum), with the mean of v over the keys each should give.
fn uniform_rows(v: &Tensor, mask: &Tensor, h: usize) -> Vec<(usize, Vec<f64>)> {
    let (b, _, lk, d) = v.dims4().unwrap();
    let (_, _, lq, _) = mask.dims4().unwrap();
    let (m, vals) = (values_f64(mask), values_f64(v));
    let mut rows = vec![];
    for bh in 0..b * h {
        let bi = bh / h;
        let mean: Vec<f64> = (0..d)
            .map(|c| (0..lk).map(|j| vals[(bh * lk + j) * d + c]).sum::<f64>() / lk as f64)
            .collect();
        for i in 0..lq {
            let row = &m[(bi * lq + i) * lk..][..lk];
            if row[0] <= -1e9 && row.iter().all(|&x| x == row[0]) {
                rows.push((bh * lq + i, mean.clone()));
            }
        }
    }
    rows
}

fn check(dtype: DType, (b, h, lq, lk, d): (usize, usize, usize, usize, usize), pattern: Pattern) -> usize {
    let what = format!("{dtype:?} {:?} {pattern:?}", (b, h, lq, lk, d));
    let (q, k, v) = (
        ternary(&[b, h, lq, d], 1, dtype),
        ternary(&[b, h, lk, d], 2, dtype),
        randn(&[b, h, lk, d], 3, dtype),
    );
    let m = mask(pattern, (b, lq, lk));
    let scale = default_scale(d);
    assert!(
        [0.125, 0.25].contains(&scale),
        "{what}: a scale the scores are exact multiples of"
    );
    let want = values_f64(&sdpa_with(SdpaPath::Reference, &q, &k, &v, Some(&m), scale).unwrap());
    let uniform = uniform_rows(&v, &m, h);
    for path in [SdpaPath::Reference, SdpaPath::Flash, SdpaPath::Chunked, SdpaPath::Auto] {
        let got = values_f64(&sdpa_with(path, &q, &k, &v, Some(&m), scale).unwrap());
        if let Some((i, a, w)) = first_off(&got, &want, dtype) {
            panic!("{what} {path}: element {i} is {a}, the reference path gives {w}");
        }
        for (row, mean) in &uniform {
            if let Some((c, a, w)) = first_off(&got[row * d..][..d], mean, dtype) {
                panic!("{what} {path}: row {row} (every key masked alike), column {c}: {a}, the mean of v is {w}");
            }
        }
        if dtype == DType::F32 {
            let exact = f64_reference(&q, &k, &v, &m, scale);
            if let Some((i, a, w)) = first_off(&got, &exact, dtype) {
                panic!("{what} {path}: element {i} is {a}, f64 softmax of the f32 logits gives {w}");
            }
        }
    }
    uniform.len()
}

#[test]
fn every_cpu_path_averages_rows_masked_by_a_large_finite_value() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut uniform = 0;
        for pattern in [
            Pattern::FirstKeys(64),
            Pattern::Causal,
            Pattern::LeftPad,
            Pattern::RightPad,
        ] {
            uniform += check(dtype, (5, 2, 33, 200, 64), pattern);
        }
        uniform += check(dtype, (5, 1, 9, 1100, 16), Pattern::FirstKeys(512));
        uniform += check(dtype, (5, 1, 9, 1100, 16), Pattern::RightPad);
        // The rows checked for the mean of v, in the batches of finfo(f32).min, −1e10 and −1e9:
        // every fifth row (6 of 33 × 2 heads, 1 of 9), and the wholly padded batches (33 × 2 heads
        // left and right, 9 right).
        assert_eq!(uniform, 3 * 12 + 3 + 66 + 66 + 9, "{dtype:?}");
    }
}

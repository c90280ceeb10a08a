//! Every implementation of the attention core against the reference path on random inputs:
//! head dims 32, 40, 64, 160, 512 (and odd ones), odd token counts, queries ≠ keys, several key
//! blocks, additive and padding masks (full, broadcast over heads/queries, strided), f32, f16 and
//! bf16, and the eager (softmax-then-matmul) form with both scale kinds.
//!
//! Tolerances are `torch.testing.assert_close`'s defaults for the dtype (f32: rtol 1.3e-6, atol
//! 1e-5; f16: rtol 1e-3, atol 1e-5; bf16: rtol 1.6e-2, atol 1e-5), elementwise
//! `|ours − ref| ≤ atol + rtol·|ref|`.

use crate::common::values_f64;
use candle_core::{DType, Device, Tensor};
use unet_attention::sdpa::{default_scale, eager_attention_with, sdpa_with, Scale, SdpaPath};

const PATHS: [SdpaPath; 3] = [SdpaPath::Flash, SdpaPath::Chunked, SdpaPath::Auto];

fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1.3e-6, 1e-5),
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        _ => unreachable!(),
    }
}

fn assert_close(got: &Tensor, want: &Tensor, dtype: DType, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    assert_eq!(got.dtype(), want.dtype(), "{what}");
    let (rtol, atol) = tol(dtype);
    let (g, w) = (values_f64(got), values_f64(want));
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(a.is_finite() && b.is_finite(), "{what}: element {i}: {a} vs {b}");
        let excess = (a - b).abs() - (atol + rtol * b.abs());
        if excess > worst.0 {
            worst = (excess, i);
        }
    }
    let i = worst.1;
    assert!(worst.0 <= 0.0, "{what}: element {i}: {} vs reference {}", g[i], w[i]);
}

std::thread_local! {
    /// The generator's state, the same at the start of every test (each runs on its own thread),
    /// so every run sees the same inputs: Candle's CPU `randn` cannot be seeded, and a test that
    /// draws new inputs each run can fail on one run in many.
    static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0x9E37_79B9_7F4A_7C15) };
}

/// Standard normal samples: a 64-bit LCG (Knuth's MMIX constants) and Box–Muller.
fn normal_samples(n: usize) -> Vec<f32> {
    let uniform = || {
        STATE.with(|s| {
            let x = s
                .get()
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            s.set(x);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        })
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

/// A random tensor of `dims`, scaled by `scale`, in `dtype`.
fn randn(dims: &[usize], scale: f64, dtype: DType) -> Tensor {
    let n = dims.iter().product();
    (Tensor::from_vec(normal_samples(n), dims, &Device::Cpu).unwrap() * scale)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[derive(Debug, Clone, Copy)]
enum MaskKind {
    None,
    /// Additive `(Lq, Lk)` mask of random values, broadcast over batch and heads.
    Additive,
    /// Key padding `(B, 1, 1, Lk)`: -inf on the last keys of each batch element.
    Padding,
    /// Full `(B, H, Lq, Lk)` additive mask with some -inf (never a whole row).
    Full,
    /// A `(Lk, Lq)` mask transposed: strided along the keys.
    Strided,
}

fn mask(kind: MaskKind, dims: (usize, usize, usize, usize), dtype: DType) -> Option<Tensor> {
    let (b, h, lq, lk) = dims;
    let dev = Device::Cpu;
    match kind {
        MaskKind::None => None,
        MaskKind::Additive => Some(randn(&[lq, lk], 2.0, dtype)),
        MaskKind::Padding => {
            let mut m = vec![0f32; b * lk];
            for bi in 0..b {
                // Batch element bi keeps its first lk - bi - 1 keys (at least one).
                let keep = lk.saturating_sub(bi + 1).max(1);
                for j in keep..lk {
                    m[bi * lk + j] = f32::NEG_INFINITY;
                }
            }
            Some(
                Tensor::from_vec(m, (b, 1, 1, lk), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
        }
        MaskKind::Full => {
            let n = b * h * lq * lk;
            let r = normal_samples(n);
            let m: Vec<f32> = r
                .iter()
                .enumerate()
                .map(|(i, &x)| if x > 1.0 && i % lk != 0 { f32::NEG_INFINITY } else { x })
                .collect();
            Some(
                Tensor::from_vec(m, (b, h, lq, lk), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
        }
        MaskKind::Strided => Some(randn(&[lk, lq], 1.0, dtype).t().unwrap()),
    }
}

/// `dims` = (batch, heads, q tokens, k tokens, head dim, v head dim).
fn check(dtype: DType, dims: (usize, usize, usize, usize, usize, usize), kind: MaskKind) {
    let (b, h, lq, lk, d, dv) = dims;
    let q = randn(&[b, h, lq, d], 1.5, dtype);
    let k = randn(&[b, h, lk, d], 1.5, dtype);
    let v = randn(&[b, h, lk, dv], 1.0, dtype);
    let m = mask(kind, (b, h, lq, lk), dtype);
    let scale = default_scale(d);
    let want = sdpa_with(SdpaPath::Reference, &q, &k, &v, m.as_ref(), scale).unwrap();
    for path in PATHS {
        let got = sdpa_with(path, &q, &k, &v, m.as_ref(), scale).unwrap();
        assert_close(&got, &want, dtype, &format!("sdpa {path} {dtype:?} {dims:?} {kind:?}"));
    }
    if dtype == DType::F32 {
        for s in [Scale::Mul(scale), Scale::Div((d as f64).sqrt())] {
            let want = eager_attention_with(SdpaPath::Reference, &q, &k, &v, m.as_ref(), s).unwrap();
            for path in PATHS {
                let got = eager_attention_with(path, &q, &k, &v, m.as_ref(), s).unwrap();
                assert_close(&got, &want, dtype, &format!("eager {path} {s:?} {dims:?} {kind:?}"));
            }
        }
    }
}

const SHAPES: [(usize, usize, usize, usize, usize, usize); 9] = [
    (2, 3, 7, 11, 32, 32),
    (1, 2, 33, 29, 40, 40),
    (2, 2, 65, 77, 64, 64),
    (1, 2, 17, 77, 160, 160),
    (1, 1, 70, 600, 512, 512),
    (1, 1, 130, 1100, 64, 64),
    (3, 1, 5, 1, 8, 3),
    (1, 3, 1, 9, 5, 7),
    (2, 1, 300, 19, 13, 20),
];

#[test]
fn every_path_matches_the_reference_f32() {
    let kinds = [
        MaskKind::None,
        MaskKind::Additive,
        MaskKind::Padding,
        MaskKind::Full,
        MaskKind::Strided,
    ];
    for (i, dims) in SHAPES.into_iter().enumerate() {
        check(DType::F32, dims, kinds[i % kinds.len()]);
        check(DType::F32, dims, MaskKind::None);
    }
}

#[test]
fn every_path_matches_the_reference_f16_bf16() {
    let kinds = [
        MaskKind::Padding,
        MaskKind::Additive,
        MaskKind::None,
        MaskKind::Strided,
        MaskKind::Full,
    ];
    for dtype in [DType::F16, DType::BF16] {
        for (i, dims) in SHAPES.into_iter().enumerate() {
            check(dtype, dims, kinds[i % kinds.len()]);
        }
    }
}

#[test]
fn rank3_inputs_and_f64_masks() {
    let dtype = DType::F32;
    let (q, k, v) = (
        randn(&[3, 9, 16], 1.0, dtype),
        randn(&[3, 14, 16], 1.0, dtype),
        randn(&[3, 14, 5], 1.0, dtype),
    );
    let m = randn(&[3, 9, 14], 1.0, DType::F64);
    let want = sdpa_with(SdpaPath::Reference, &q, &k, &v, Some(&m), 0.3).unwrap();
    for path in PATHS {
        let got = sdpa_with(path, &q, &k, &v, Some(&m), 0.3).unwrap();
        assert_close(&got, &want, dtype, &format!("rank 3 {path}"));
    }
}

#[test]
fn f64_runs_on_the_reference_arithmetic() {
    let (q, k, v) = (
        randn(&[1, 2, 9, 16], 1.0, DType::F64),
        randn(&[1, 2, 14, 16], 1.0, DType::F64),
        randn(&[1, 2, 14, 16], 1.0, DType::F64),
    );
    let want = values_f64(&sdpa_with(SdpaPath::Reference, &q, &k, &v, None, 0.25).unwrap());
    for path in PATHS {
        let got = values_f64(&sdpa_with(path, &q, &k, &v, None, 0.25).unwrap());
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err < 1e-14, "{path}: {err}");
    }
}

#[test]
fn rows_without_keys() {
    // Row 0 of the mask blocks every key: torch's SDPA kernels give 0 there (the tiled kernel,
    // every dtype); softmax-then-matmul gives NaN (eager form, and the reference f32 sdpa).
    let (lq, lk, d) = (4, 600, 8);
    let mut m = vec![0f32; lq * lk];
    m[..lk].fill(f32::NEG_INFINITY);
    let mask = Tensor::from_vec(m, (lq, lk), &Device::Cpu).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (q, k, v) = (
            randn(&[1, 1, lq, d], 1.0, dtype),
            randn(&[1, 1, lk, d], 1.0, dtype),
            randn(&[1, 1, lk, d], 1.0, dtype),
        );
        let mh = mask.to_dtype(dtype).unwrap();
        let got = values_f64(&sdpa_with(SdpaPath::Flash, &q, &k, &v, Some(&mh), 0.3).unwrap());
        assert!(got[..d].iter().all(|&x| x == 0.0), "{dtype:?}");
        assert!(got[d..].iter().all(|x| x.is_finite()), "{dtype:?}");
        if dtype == DType::F32 {
            let got =
                values_f64(&eager_attention_with(SdpaPath::Flash, &q, &k, &v, Some(&mh), Scale::Mul(0.3)).unwrap());
            assert!(got[..d].iter().all(|x| x.is_nan()));
            assert!(got[d..].iter().all(|x| x.is_finite()));
        }
    }
}

#[test]
fn env_names_parse() {
    for p in [SdpaPath::Auto, SdpaPath::Reference, SdpaPath::Chunked, SdpaPath::Flash] {
        assert_eq!(p.name().parse::<SdpaPath>().unwrap(), p);
        assert_eq!(p.name().to_uppercase().parse::<SdpaPath>().unwrap(), p);
    }
    let err = "fast".parse::<SdpaPath>().unwrap_err();
    assert!(err.contains("auto, reference, chunked, flash"), "{err}");
}

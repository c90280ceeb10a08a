//! The fused attention kernels under large finite additive masks, run on the CPU through the
//! emulator (issue 55): the conventions that mask with a finite value rather than −∞ —
//! `torch.finfo(float32).min` and `finfo(float16).min` (Hugging Face's), −1e10 and −1e9
//! (`masked_fill`) and −10000 — on a wholly masked first key tile and wholly masked rows, causal
//! masks, left and right key padding, with the keys unsplit and split 3 ways (so that a split sees
//! only masked keys of a row), in every f16/bf16 kernel form: `base` (`expf`), `exp2` (`_e2`,
//! the default), 8 warps with `ex2`, `r32` (`_r32_e2`), and head dims over 256 on the wide
//! kernel (`_wide_e2`, `_wide`, and `_wide32_e2` with an A100's shared memory); and f32.
//!
//! What PyTorch gives, and the reference here (f64, from logits rounded to f32 as PyTorch adds an
//! f32 mask to f32 scores): a key whose logit is the mask value weighs e^(mask − max) ≈ 0 beside
//! an unmasked key, and a row whose keys all carry the same mask value gets equal logits
//! (score + −1e9 rounds to −1e9), whose softmax is uniform: the mean of v over those keys. Before
//! the fix the `_e2` kernels took such a row's exponents as `fmaf(x, k, −fl(m·k))` and returned
//! NaN (−1e9 in f16, −1e10, finfo(f32).min) or zeros for it.

use super::{bound, case, run, Case, Mask, A100, H100};
use crate::cuda_plan::emulator::runner;
use crate::cuda_plan::{Dims, FusedVariant, GpuLimits};
use candle_core::DType;

/// The mask values, batch b taking `VALUES[b % 5]`: finfo(f32).min, finfo(f16).min, −1e10,
/// −1e9, −10000.
pub(super) const VALUES: [f32; 5] = [f32::MIN, -65504.0, -1e10, -1e9, -1e4];

/// Where the mask value goes (everywhere else 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Pattern {
    /// (B, 1, Lq, Lk): the first 64 keys of every row (the first key tile, or two of 32), and
    /// every key of every fifth row.
    FirstTile,
    /// (B, 1, Lq, Lk), causal as PyTorch's `is_causal` (aligned top left): key j masked for query
    /// i where j > i; with Lq < Lk the last keys are masked in every row.
    Causal,
    /// Key padding, (B, 1, 1, Lk): batch b's first `pads(b)` keys (every key in one batch).
    LeftPad,
    /// Key padding, (B, 1, 1, Lk): batch b's last `pads(b)` keys (every key in one batch).
    RightPad,
}

impl Pattern {
    const ALL: [Pattern; 4] = [Pattern::FirstTile, Pattern::Causal, Pattern::LeftPad, Pattern::RightPad];

    /// Keys batch b pads (key padding): more than a key tile, all of them, one short of all, a
    /// few; the left and right patterns give each value a different length.
    fn pads(self, b: usize, lk: usize) -> usize {
        let lengths = [64, 100, lk, lk - 1, 5];
        let shift = if self == Pattern::RightPad { 2 } else { 0 };
        lengths[(b + shift) % 5].min(lk)
    }
}

/// The mask's elements and (b, h, q, k) strides (broadcast over heads; over queries too for key
/// padding).
pub(super) fn elements(pattern: Pattern, dims: &Dims) -> (Vec<f32>, [i64; 4]) {
    let Dims { b, lq, lk, .. } = *dims;
    let value = |bi: usize| VALUES[bi % VALUES.len()];
    match pattern {
        Pattern::FirstTile | Pattern::Causal => {
            let masked = |i: usize, j: usize| match pattern {
                Pattern::FirstTile => j < 64 || i % 5 == 4,
                _ => j > i,
            };
            let m = (0..b * lq * lk)
                .map(|x| {
                    let (bi, i, j) = (x / (lq * lk), x / lk % lq, x % lk);
                    if masked(i, j) {
                        value(bi)
                    } else {
                        0.0
                    }
                })
                .collect();
            (m, [(lq * lk) as i64, 0, lk as i64, 1])
        }
        Pattern::LeftPad | Pattern::RightPad => {
            let m = (0..b * lk)
                .map(|x| {
                    let (bi, j) = (x / lk, x % lk);
                    let pad = pattern.pads(bi, lk);
                    let masked = if pattern == Pattern::LeftPad { j < pad } else { j >= lk - pad };
                    if masked {
                        value(bi)
                    } else {
                        0.0
                    }
                })
                .collect();
            (m, [lk as i64, 0, 0, 1])
        }
    }
}

/// The kernels: (variant, head dim, GPU, what the kernel's name ends with).
const KERNELS: [(FusedVariant, usize, GpuLimits, &str); 7] = [
    (FusedVariant::Base, 64, H100, "_dv64"),
    (FusedVariant::Exp2, 64, H100, "_dv64_e2"),
    (FusedVariant::Warps8Exp2, 40, H100, "_dv64_w8_e2"),
    (FusedVariant::Rows32Exp2, 64, H100, "_dv64_r32_e2"),
    (FusedVariant::Exp2, 300, H100, "_wide_e2"),
    (FusedVariant::Base, 300, H100, "_wide"),
    (FusedVariant::Exp2, 300, A100, "_wide32_e2"),
];

/// Five batches (one a mask value), 70 queries (partial query tiles of 64 and 128), 150 keys
/// (three key tiles of 64, five of 32: split 3 ways, the later splits of the first rows see
/// only masked keys under the causal mask).
fn mask_case(dtype: DType, variant: FusedVariant, d: usize, gpu: GpuLimits, pattern: Pattern, split: bool) -> Case {
    Case {
        mask: Mask::Finite(pattern),
        splits: Some(if split { 3 } else { 1 }),
        variant,
        gpu,
        seed: split as u64,
        ..case(dtype, (5, 1, 70, 150, d))
    }
}

/// Runs the cases; panics with every one past its bound (and its error), so that a failing run
/// says which kernels, patterns and splits fail, and by how much.
fn check_all(cases: &[(Case, &str)]) {
    let Some(bin) = runner() else { return };
    let mut failed = vec![];
    for (c, suffix) in cases {
        let (err, plan, _) = run(bin, c);
        assert!(plan.kernel.ends_with(suffix), "{c:?}: kernel {}", plan.kernel);
        let Mask::Finite(pattern) = c.mask else { unreachable!() };
        let line = format!(
            "{} {pattern:?} splits {}: error {err:.2e} × max|v| (bound {:.1e})",
            plan.kernel,
            plan.splits,
            bound(c.dtype)
        );
        eprintln!("{line}");
        if err > bound(c.dtype) {
            failed.push(line);
        }
    }
    assert!(failed.is_empty(), "{} of {} cases fail:\n{}", failed.len(), cases.len(), failed.join("\n"));
}

/// Every f16/bf16 kernel form, every pattern, unsplit and split 3 ways.
#[test]
fn large_finite_masks_match_f64_attention_in_every_kernel() {
    let mut cases = vec![];
    for (variant, d, gpu, suffix) in KERNELS {
        for dtype in [DType::F16, DType::BF16] {
            for pattern in Pattern::ALL {
                for split in [false, true] {
                    cases.push((mask_case(dtype, variant, d, gpu, pattern, split), suffix));
                }
            }
        }
    }
    check_all(&cases);
}

/// The f32 kernels (`expf` of the logit less the max) on the same masks.
#[test]
fn large_finite_masks_match_f64_attention_in_f32() {
    let mut cases = vec![];
    for pattern in Pattern::ALL {
        for split in [false, true] {
            let c = mask_case(DType::F32, FusedVariant::Exp2, 40, H100, pattern, split);
            cases.push((c, "_ni2"));
        }
    }
    check_all(&cases);
}

/// The masks are what the tests say: every value in its own batch; the first tile of every row
/// and every fifth row wholly masked; causal; one batch wholly padded on each side.
#[test]
fn mask_patterns_cover_the_cases() {
    let dims = Dims {
        b: 5,
        h: 1,
        lq: 70,
        lk: 150,
        d: 8,
    };
    let (m, st) = elements(Pattern::FirstTile, &dims);
    assert_eq!(st, [70 * 150, 0, 150, 1]);
    for (bi, &v) in VALUES.iter().enumerate() {
        let row = |i: usize| &m[(bi * 70 + i) * 150..][..150];
        assert!(row(0)[..64].iter().all(|&x| x == v) && row(0)[64..].iter().all(|&x| x == 0.0));
        assert!(row(4).iter().all(|&x| x == v));
    }
    let (m, _) = elements(Pattern::Causal, &dims);
    assert_eq!(m[..3], [0.0, f32::MIN, f32::MIN]);
    assert!(m[69 * 150..70 * 150][70..].iter().all(|&x| x == f32::MIN));
    for pattern in [Pattern::LeftPad, Pattern::RightPad] {
        let (m, st) = elements(pattern, &dims);
        assert_eq!(st, [150, 0, 0, 1]);
        let wholly = (0..5).filter(|bi| m[bi * 150..][..150].iter().all(|&x| x == VALUES[*bi])).count();
        assert_eq!(wholly, 1, "{pattern:?}");
        assert_eq!(m[150 * 5 - 1] == 0.0, pattern == Pattern::LeftPad, "{pattern:?}");
    }
}

//! The fused attention kernels under large finite additive masks, run on the CPU through the
//! emulator (issue 55): the conventions that mask with a finite value rather than −∞ —
//! `torch.finfo(float32).min` and `finfo(float16).min` (Hugging Face's), −1e10 and −1e9
//! (`masked_fill`) and −10000 — on a wholly masked first key tile, wholly masked rows, causal
//! rows, left and right key padding (each query row one such sequence: [`kind`]), with the keys
//! unsplit and split 3 ways (so that a split sees only masked keys of a row), in every f16/bf16
//! kernel form: `base` (`expf`), `exp2` (`_e2`, the default), 8 warps with `ex2`, `r32`
//! (`_r32_e2`), and head dims over 256 on the wide kernel (`_wide_e2`, `_wide`, and
//! `_wide32_e2` where 64-key tiles do not fit); and f32.
//!
//! What PyTorch gives, and the reference here (f64, from logits rounded to f32 as PyTorch adds an
//! f32 mask to f32 scores): a key whose logit is the mask value weighs e^(mask − max) ≈ 0 beside
//! an unmasked key, and a row whose keys all carry the same mask value gets equal logits
//! (score + −1e9 rounds to −1e9), whose softmax is uniform: the mean of v over those keys. Before
//! the fix the `_e2` kernels took such a row's exponents as `fmaf(x, k, −fl(m·k))` and returned
//! NaN (−1e9 in f16, −1e10, finfo(f32).min) or zeros for it.

use super::{bound, case, run_rows, Case, Mask, H100};
use crate::cuda_plan::emulator::runner;
use crate::cuda_plan::{Dims, FusedVariant, GpuLimits};
use candle_core::DType;

/// The mask values, query row i taking `VALUES[i % 5]`: finfo(f32).min, finfo(f16).min, −1e10,
/// −1e9, −10000.
pub(super) const VALUES: [f32; 5] = [f32::MIN, -65504.0, -1e10, -1e9, -1e4];

/// Query rows of a case: one query tile of the 4-warp kernels (64), part of one of the 8-warp
/// and 32-row kernels (128), every row a sequence of its own ([`kind`]).
const ROWS: usize = 60;
/// Keys: three key tiles of 64 (five of 32); split 3 ways, split s holds keys 64·s … 64·s + 63.
const KEYS: usize = 150;
/// Lengths of the key padding: a whole first (last) key tile and more, and all keys but one.
const PADS: [usize; 3] = [64, 100, KEYS - 1];

/// How a row is masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pattern {
    /// Its first 64 keys: the first key tile (two of 32), and with 3 splits the first split.
    FirstTile,
    /// Every key: the mean of v.
    Whole,
    /// Causal (PyTorch's `is_causal`, aligned top left): row 20 + r sees keys 0 … r; its second
    /// and third splits see only masked keys.
    Causal,
    /// Key padding on the left, `PADS` long (the first split, or the first two, wholly masked).
    LeftPad,
    /// Key padding on the right, `PADS` long (the last split, or the last two, wholly masked).
    RightPad,
}

/// Row i's pattern and mask value (`VALUES[i % 5]`): rows 0 – 9 `FirstTile`, 10 – 19 `Whole`,
/// 20 – 29 `Causal` (each value twice), 30 – 44 `LeftPad` and 45 – 59 `RightPad` (each value at
/// each length).
fn kind(i: usize) -> (Pattern, usize) {
    let pattern = match i {
        0..=9 => Pattern::FirstTile,
        10..=19 => Pattern::Whole,
        20..=29 => Pattern::Causal,
        30..=44 => Pattern::LeftPad,
        _ => Pattern::RightPad,
    };
    (pattern, i % VALUES.len())
}

/// Whether row i's key j carries the mask value.
fn masked(i: usize, j: usize) -> bool {
    match kind(i).0 {
        Pattern::FirstTile => j < 64,
        Pattern::Whole => true,
        Pattern::Causal => j + 20 > i,
        Pattern::LeftPad => j < PADS[(i - 30) / 5],
        Pattern::RightPad => j + PADS[(i - 45) / 5] >= KEYS,
    }
}

/// The mask's elements, (B, 1, ROWS, KEYS), and (b, h, q, k) strides (broadcast over heads).
pub(super) fn elements(dims: &Dims) -> (Vec<f32>, [i64; 4]) {
    let Dims { b, lq, lk, .. } = *dims;
    assert_eq!((lq, lk), (ROWS, KEYS), "the finite masks' rows and keys");
    let m = (0..b * lq * lk)
        .map(|x| {
            let (i, j) = (x / lk % lq, x % lk);
            if masked(i, j) {
                VALUES[kind(i).1]
            } else {
                0.0
            }
        })
        .collect();
    (m, [(lq * lk) as i64, 0, lk as i64, 1])
}

/// An A100-like GPU with less shared memory a block than the wide kernel's 64-key tiles take
/// at head dim 300 (150.5 KiB): its 32-key tiles (`_wide32`), as an A100's at head dim 512.
const SMALL_SMEM: GpuLimits = GpuLimits {
    sms: 108,
    smem_optin: 128 * 1024,
};

/// The kernels: (variant, head dim, GPU, what the kernel's name ends with).
const KERNELS: [(FusedVariant, usize, GpuLimits, &str); 7] = [
    (FusedVariant::Base, 64, H100, "_dv64"),
    (FusedVariant::Exp2, 64, H100, "_dv64_e2"),
    (FusedVariant::Warps8Exp2, 40, H100, "_dv64_w8_e2"),
    (FusedVariant::Rows32Exp2, 64, H100, "_dv64_r32_e2"),
    (FusedVariant::Exp2, 300, H100, "_wide_e2"),
    (FusedVariant::Base, 300, H100, "_wide"),
    (FusedVariant::Exp2, 300, SMALL_SMEM, "_wide32_e2"),
];

/// One batch and head, `ROWS` queries, `KEYS` keys, unsplit or split 3 ways.
fn mask_case(dtype: DType, variant: FusedVariant, d: usize, gpu: GpuLimits, split: bool) -> Case {
    Case {
        mask: Mask::Finite,
        splits: Some(if split { 3 } else { 1 }),
        variant,
        gpu,
        seed: split as u64,
        ..case(dtype, (1, 1, ROWS, KEYS, d))
    }
}

/// Runs the cases; panics with every one past its bound, saying which rows (pattern, value)
/// fail and by how much, so that a failing run says what breaks where.
fn check_all(cases: &[(Case, &str)]) {
    let Some(bin) = runner() else { return };
    let mut failed = vec![];
    for (c, suffix) in cases {
        let (rows, plan) = run_rows(bin, c);
        assert!(plan.kernel.ends_with(suffix), "{c:?}: kernel {}", plan.kernel);
        let worst = rows.iter().copied().fold(0f64, f64::max);
        let line = format!(
            "{} splits {}: error {worst:.2e} × max|v| (bound {:.1e})",
            plan.kernel,
            plan.splits,
            bound(c.dtype)
        );
        eprintln!("{line}");
        if worst > bound(c.dtype) {
            // The worst error of each (pattern, value) past the bound.
            let mut by_kind = std::collections::BTreeMap::<(Pattern, usize), f64>::new();
            for (i, &e) in rows.iter().enumerate().filter(|&(_, &e)| e > bound(c.dtype)) {
                let w = by_kind.entry(kind(i % ROWS)).or_default();
                *w = w.max(e);
            }
            let rows: Vec<String> = by_kind
                .iter()
                .map(|((p, v), e)| format!("{p:?} {:e}: {e:.1e}", VALUES[*v]))
                .collect();
            failed.push(format!("{line}: {}", rows.join(", ")));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases fail:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// Every f16/bf16 kernel form, unsplit and split 3 ways.
#[test]
fn large_finite_masks_match_f64_attention_in_every_kernel() {
    let mut cases = vec![];
    for (variant, d, gpu, suffix) in KERNELS {
        for dtype in [DType::F16, DType::BF16] {
            for split in [false, true] {
                cases.push((mask_case(dtype, variant, d, gpu, split), suffix));
            }
        }
    }
    check_all(&cases);
}

/// The f32 kernel (`expf` of the logit less the max) on the same masks.
#[test]
fn large_finite_masks_match_f64_attention_in_f32() {
    let cases = [false, true].map(|split| (mask_case(DType::F32, FusedVariant::Exp2, 40, H100, split), "_ni2"));
    check_all(&cases);
}

/// The rows are what the tests say: each pattern with every value, each padding length with
/// every value on each side, and with 3 splits of one key tile each, rows whose first, last or
/// middle split sees only masked keys.
#[test]
fn mask_rows_cover_the_cases() {
    let dims = Dims {
        b: 1,
        h: 1,
        lq: ROWS,
        lk: KEYS,
        d: 8,
    };
    let (m, st) = elements(&dims);
    assert_eq!(st, [(ROWS * KEYS) as i64, 0, KEYS as i64, 1]);
    let row = |i: usize| &m[i * KEYS..][..KEYS];
    let mut seen = std::collections::BTreeMap::<(Pattern, usize), usize>::new();
    for i in 0..ROWS {
        let (p, v) = kind(i);
        *seen.entry((p, v)).or_default() += 1;
        assert!(row(i).iter().all(|&x| x == 0.0 || x == VALUES[v]), "row {i}");
        let n = row(i).iter().filter(|&&x| x != 0.0).count();
        let prefix = row(i)[..n].iter().all(|&x| x != 0.0);
        let suffix = row(i)[KEYS - n..].iter().all(|&x| x != 0.0);
        match p {
            Pattern::FirstTile => assert!(n == 64 && prefix, "row {i}"),
            Pattern::Whole => assert_eq!(n, KEYS, "row {i}"),
            Pattern::Causal => assert!(n == KEYS - (i - 19) && suffix, "row {i}"),
            Pattern::LeftPad => assert!(PADS.contains(&n) && prefix, "row {i}"),
            Pattern::RightPad => assert!(PADS.contains(&n) && suffix, "row {i}"),
        }
    }
    assert_eq!(seen.len(), 5 * VALUES.len(), "every pattern with every value");
    for side in [30, 45] {
        let lengths: std::collections::BTreeSet<(usize, usize)> = (side..side + 15)
            .map(|i| (kind(i).1, row(i).iter().filter(|&&x| x != 0.0).count()))
            .collect();
        assert_eq!(lengths.len(), 15, "every value at every length, rows {side}..");
    }
    // Split s of 3 holds keys 64·s .. 64·s + 63.
    let split_masked = |i: usize, s: usize| row(i)[64 * s..(64 * s + 64).min(KEYS)].iter().all(|&x| x != 0.0);
    for s in 0..3 {
        assert!(
            (0..ROWS).any(|i| kind(i).0 != Pattern::Whole && split_masked(i, s)),
            "split {s}"
        );
    }
}

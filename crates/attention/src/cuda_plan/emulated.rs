//! The fused CUDA attention kernel, run on the CPU: `kernels/fused_attention.cu` compiled with
//! the system's C++ compiler under the CUDA emulation of `kernels/emu/cuda_emu.h`, launched with
//! the plans of [`Plan::new`] and the argument blocks of [`Args`], and checked element by element
//! against attention computed here in f64 from the same rounded inputs.
//!
//! What this shows: the kernels' indexing, mma fragment layouts (as NVIDIA documents them),
//! online softmax, masks, key bounds, head-dim padding and column chunks, split-KV and its merge,
//! strided inputs and both copy paths, and that the Rust and CUDA argument blocks agree. What it
//! cannot show: anything of the GPU itself (speed, the tensor cores' own rounding, the
//! compiler's code); that needs the GPU kit (`scripts/gpu_kit.sh`).
//!
//! The emulator and its limits: [`super::emulator`], `kernels/emu/cuda_emu.h`.

use super::emulator::{decode, elem_size, encode, normals, runner, Arg, Request, Traffic};
use super::{vector_copies, Args, Dims, FusedVariant, GpuLimits, Plan, THREADS};
use crate::test_support::naive_attention;
use candle_core::DType;
use std::path::Path;

const H100: GpuLimits = GpuLimits {
    sms: 132,
    smem_optin: 227 * 1024,
};

/// An A100's limits: 163 KiB a block (the wide kernel's key tiles of 32, `_wide32`).
const A100: GpuLimits = GpuLimits {
    sms: 108,
    smem_optin: 163 * 1024,
};

/// How q, k and v lie in memory, as (B, H, L, D) strides.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// (B, H, L, D) contiguous.
    Contiguous,
    /// (B, L, H, D) contiguous, seen as (B, H, L, D): heads split from tokens without a copy.
    TokensMajor,
    /// Rows `pad` elements longer than the head dim.
    PaddedRows(usize),
}

impl Layout {
    /// `(strides, elements)` of one input with `l` rows.
    fn strides(self, b: usize, h: usize, l: usize, d: usize) -> ([usize; 3], usize) {
        match self {
            Layout::Contiguous => ([h * l * d, l * d, d], b * h * l * d),
            Layout::TokensMajor => ([l * h * d, d, h * d], b * h * l * d),
            Layout::PaddedRows(pad) => {
                let r = d + pad;
                ([h * l * r, l * r, r], b * h * l * r)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mask {
    None,
    /// Additive (B, 1, Lq, Lk), broadcast over heads: random values, some keys −∞, and every
    /// fifth query row wholly −∞ (that row's output is 0).
    Additive,
    /// Key padding as an additive (B, 1, 1, Lk): the last third of batch 1's keys −∞.
    KeyPadding,
    /// Large finite masks (finfo(f32).min, finfo(f16).min, −1e10, −1e9, −10000), every query row
    /// a masked sequence of its own ([`masks`]).
    Finite,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    dtype: DType,
    dims: Dims,
    layout: Layout,
    mask: Mask,
    splits: Option<usize>,
    late_copies: bool,
    /// The emulator's schedule: 0 in order, else the seed of a random one with fast and slow
    /// warps ([`Request::new`]).
    seed: u64,
    /// Multiplies q: larger logits, a peakier softmax.
    q_gain: f64,
    /// Which f16/bf16 kernel.
    variant: FusedVariant,
    /// Gives the kernel a scale 30 % off the reference's (to show that the check can fail).
    wrong_scale: bool,
    /// The plan's GPU: an H100, or ([`A100`]) one with less shared memory a block.
    gpu: GpuLimits,
}

fn case(dtype: DType, (b, h, lq, lk, d): (usize, usize, usize, usize, usize)) -> Case {
    Case {
        dtype,
        dims: Dims { b, h, lq, lk, d },
        layout: Layout::Contiguous,
        mask: Mask::None,
        splits: None,
        late_copies: false,
        seed: 0,
        q_gain: 1.0,
        variant: FusedVariant::default(),
        wrong_scale: false,
        gpu: H100,
    }
}

/// One input: its elements at the layout's places (rounded to the dtype; padding NaN, which the
/// kernel must never read) and the rounded logical values (B, H, L, D) as f64.
struct Input {
    storage: Vec<f32>,
    strides: [usize; 3],
    values: Vec<f64>,
}

fn input(c: &Case, seed: u64, l: usize, gain: f64) -> Input {
    let Dims { b, h, d, .. } = c.dims;
    let (strides, n) = c.layout.strides(b, h, l, d);
    let values = normals(seed, b * h * l * d, gain, c.dtype);
    let mut storage = vec![f32::NAN; n];
    for (i, &x) in values.iter().enumerate() {
        let (bh, r, e) = (i / (l * d), i / d % l, i % d);
        storage[bh / h * strides[0] + bh % h * strides[1] + r * strides[2] + e] = x;
    }
    Input {
        storage,
        strides,
        values: values.into_iter().map(f64::from).collect(),
    }
}

/// The mask's elements and (b, h, q, k) strides, or `None`.
fn mask(c: &Case, seed: u64) -> Option<(Vec<f32>, [i64; 4])> {
    let Dims { b, lq, lk, .. } = c.dims;
    match c.mask {
        Mask::None => None,
        Mask::Additive => {
            // Normal values; above 1.28 (about one in ten) −∞, and every fifth query row −∞.
            let x = normals(seed, b * lq * lk, 1.0, DType::F32);
            let m = x
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if (i / lk) % lq % 5 == 4 || x > 1.28 {
                        f32::NEG_INFINITY
                    } else {
                        x * 1.5
                    }
                })
                .collect();
            Some((m, [(lq * lk) as i64, 0, lk as i64, 1]))
        }
        Mask::KeyPadding => {
            let m = (0..b)
                .flat_map(|bi| {
                    (0..lk).map(move |k| {
                        if bi == 1 && 3 * k >= 2 * lk {
                            f32::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            Some((m, [lk as i64, 0, 0, 1]))
        }
        Mask::Finite => Some(masks::elements(&c.dims)),
    }
}

/// softmax(q·kᵀ·scale + mask)·v in f64 ([`naive_attention`]), (B, H, Lq, D); a row with every
/// key at −∞ gives 0 (the kernel's, and PyTorch's fused kernels', convention). With a mask the
/// logits are rounded to f32, as PyTorch adds an f32 mask to f32 scores (and the kernels do): a
/// score plus −1e9 is −1e9, so a row whose keys all carry it averages them uniformly.
fn reference(c: &Case, q: &Input, k: &Input, v: &Input, m: Option<&(Vec<f32>, [i64; 4])>, scale: f64) -> Vec<f64> {
    let Dims { b, h, lq, lk, d } = c.dims;
    let score = |bh: usize, i: usize, j: usize, dot: f64| match m {
        None => dot * scale,
        Some((m, st)) => {
            let at = (bh / h) as i64 * st[0] + (bh % h) as i64 * st[1] + i as i64 * st[2] + j as i64 * st[3];
            ((dot * scale) as f32 + m[at as usize]) as f64
        }
    };
    naive_attention((&q.values, &k.values, &v.values), (b * h, lq, lk, d, d), score, 0.0)
}

/// Runs one case through the emulator; the max error relative to max |v| against the f64
/// reference (infinite where an element is not finite), with the plan (for messages) and the
/// memory traffic the emulator counted. Panics on a failed run.
fn run(bin: &Path, c: &Case) -> (f64, Plan, Traffic) {
    let (rows, plan, traffic) = run_counted(bin, c);
    (rows.into_iter().fold(0.0, f64::max), plan, traffic)
}

/// [`run`]'s error of each output row, (B·H·Lq), and the plan.
fn run_rows(bin: &Path, c: &Case) -> (Vec<f64>, Plan) {
    let (rows, plan, _) = run_counted(bin, c);
    (rows, plan)
}

/// [`run`] with the error of each output row.
fn run_counted(bin: &Path, c: &Case) -> (Vec<f64>, Plan, Traffic) {
    let Dims { b, h, lq, lk, d } = c.dims;
    let plan = Plan::new(&c.dims, c.dtype, &c.gpu, c.variant)
        .and_then(|p| {
            // Automatic splits as on that GPU with two blocks a SM.
            let splits = c.splits.unwrap_or_else(|| p.auto_splits(2 * c.gpu.sms));
            p.split_keys(splits)
        })
        .unwrap_or_else(|| panic!("no plan for {c:?}"));
    assert_eq!((plan.dtype, plan.dims), (c.dtype, c.dims));
    let seed = (lq * 131 + lk * 7 + d) as u64 * 4;
    let q = input(c, seed, lq, c.q_gain);
    let k = input(c, seed + 1, lk, 1.0);
    let v = input(c, seed + 2, lk, 1.0);
    let m = mask(c, seed + 3);
    let scale = 1.0 / (d as f64).sqrt();
    let want = reference(c, &q, &k, &v, m.as_ref(), scale);

    let kernel_scale = if c.wrong_scale { scale * 1.3 } else { scale };
    let mut args = Args::sizes(&plan, kernel_scale as f32);
    let st = |s: [usize; 3]| s.map(|x| x as i64);
    (args.q_s, args.k_s, args.v_s) = (st(q.strides), st(k.strides), st(v.strides));
    // The emulator's buffers start 256-byte aligned, as CUDA's allocations do.
    args.vec = (c.dtype != DType::F32 && vector_copies(d, [(args.q_s, 0), (args.k_s, 0), (args.v_s, 0)])) as i32;
    if let Some((_, ms)) = &m {
        args.m_s = *ms;
    }
    let mut req = Request::new(c.late_copies, c.seed);
    let [qb, kb, vb] = [&q, &k, &v].map(|x| req.data(encode(c.dtype, &x.storage)));
    let mask_buf = m.as_ref().map(|(m, _)| req.data(encode(DType::F32, m)));
    let out = req.garbage(b * h * lq * d * elem_size(c.dtype));
    // The split workspace, as the CUDA launch allocates it: only with split keys (else null
    // pointers), filled with NaN as the launch leaves it uninitialised: every element must be
    // written before the merge reads it.
    let ws = plan
        .workspace()
        .map(|(o, ml)| (req.garbage(o * 4), req.garbage(ml * 4)));
    assert_eq!(ws.is_some(), plan.splits > 1);
    // The runner replaces buffer index + 1 in the pointer fields with the buffers' addresses.
    let reference = |i: usize| i as u64 + 1;
    (args.q, args.k, args.v, args.out) = (reference(qb), reference(kb), reference(vb), reference(out));
    args.mask = mask_buf.map_or(0, reference);
    if let Some((ws_o, ws_ml)) = ws {
        (args.ws_o, args.ws_ml) = (reference(ws_o), reference(ws_ml));
    }
    let arg = Arg::Struct {
        bytes: args.to_bytes(),
        pointers: 7,
    };
    req.launch(&plan.kernel, plan.grid, plan.threads, plan.smem, &[arg]);
    if let Some((ws_o, ws_ml)) = ws {
        let rows = plan.merge_rows();
        let merge_args = [
            Arg::Buf(Some(ws_o)),
            Arg::Buf(Some(ws_ml)),
            Arg::Buf(Some(out)),
            Arg::I32(rows as i32),
            Arg::I32(d as i32),
            Arg::I32(plan.splits as i32),
        ];
        req.launch(plan.merge, (rows as u32, 1, 1), THREADS, 0, &merge_args);
    }
    let (mut outputs, traffic) = req.run_counted(bin, &[out], &(c, &plan));
    let bytes = outputs.remove(0);
    let got: Vec<f64> = decode(c.dtype, &bytes).into_iter().map(f64::from).collect();
    assert_eq!(got.len(), want.len(), "{c:?}: output length");
    let v_max = v.values.iter().fold(0f64, |a, x| a.max(x.abs()));
    let mut rows = vec![0f64; b * h * lq];
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let e = if g.is_finite() {
            (g - w).abs() / v_max
        } else {
            f64::INFINITY
        };
        rows[i / d] = rows[i / d].max(e);
    }
    (rows, plan, traffic)
}

#[path = "emulated_masks.rs"]
mod masks;

/// The error bound relative to max |v|: the output's own rounding plus the probabilities'
/// (rounded to the dtype before p·v, as PyTorch's kernels do), with room for f32 sums.
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.5e-3,
        DType::BF16 => 1.2e-2,
        _ => 1e-5,
    }
}

fn check(cases: &[Case]) {
    let Some(bin) = runner() else { return };
    for c in cases {
        let (err, plan, _) = run(bin, c);
        if c.variant == FusedVariant::Rows32Exp2 && c.dtype != DType::F32 && c.dims.d <= 128 {
            assert!(plan.kernel.ends_with("_r32_e2"), "{c:?}: {}", plan.kernel);
        }
        eprintln!(
            "{} {:?} {:?} {:?} splits {}: error {err:.2e} × max|v|",
            plan.kernel, c.dims, c.layout, c.mask, plan.splits
        );
        assert!(
            err <= bound(c.dtype),
            "{c:?}: error {err:.3e} × max|v| > {:.1e} ({plan:?})",
            bound(c.dtype)
        );
    }
}

/// The shapes of the mma kernels, in f16 and bf16: every column chunk (16 … 256) and the wide
/// kernel of head dims over 256 (300, 512), odd head dims (zero padding, element-wise copies), partial query and key tiles, one
/// key, 77 keys, masks with wholly masked rows, strided inputs, forced and automatic split-KV.
fn half_cases(dtype: DType) -> Vec<Case> {
    let c = |dims| case(dtype, dims);
    vec![
        Case {
            mask: Mask::Additive,
            ..c((2, 3, 70, 77, 64))
        },
        Case {
            mask: Mask::KeyPadding,
            layout: Layout::TokensMajor,
            seed: 1,
            ..c((2, 2, 33, 300, 40))
        },
        Case {
            layout: Layout::PaddedRows(8),
            q_gain: 4.0,
            ..c((1, 1, 40, 100, 512))
        },
        Case {
            mask: Mask::Additive,
            layout: Layout::TokensMajor,
            splits: Some(1),
            ..c((1, 2, 20, 65, 160))
        },
        Case {
            layout: Layout::PaddedRows(3),
            ..c((1, 2, 17, 5, 13))
        },
        Case {
            splits: Some(3),
            ..c((1, 1, 64, 77, 200))
        },
        c((1, 1, 130, 129, 8)),
        Case {
            late_copies: true,
            seed: 2,
            ..c((1, 1, 65, 1, 96))
        },
        Case {
            late_copies: true,
            mask: Mask::Additive,
            splits: Some(2),
            seed: 3,
            ..c((1, 1, 30, 150, 128))
        },
        Case {
            late_copies: true,
            layout: Layout::PaddedRows(5),
            ..c((1, 1, 9, 40, 192))
        },
        Case {
            seed: 4,
            ..c((1, 2, 70, 200, 64))
        },
        // Head dims over 256 on the wide kernel (`base`): element-wise copies, a key-padding
        // mask, split keys landing late, partial query and key tiles; strided 512 with a mask.
        Case {
            mask: Mask::KeyPadding,
            splits: Some(3),
            late_copies: true,
            seed: 7,
            ..c((1, 2, 70, 77, 300))
        },
        Case {
            mask: Mask::Additive,
            layout: Layout::TokensMajor,
            seed: 8,
            ..c((2, 1, 65, 40, 512))
        },
        // The wide kernel with key tiles of 32 (an A100's shared memory): partial tiles, split
        // keys landing late.
        Case {
            gpu: A100,
            splits: Some(2),
            late_copies: true,
            seed: 9,
            ..c((1, 1, 70, 100, 512))
        },
    ]
}

#[test]
fn f16_kernels_match_f64_attention() {
    check(&half_cases(DType::F16));
}

#[test]
fn bf16_kernels_match_f64_attention() {
    check(&half_cases(DType::BF16));
}

/// The other variants (8 warps, `expf`, column chunks over 256, 32 rows a warp) on the shapes
/// that stress what they change: a query tile that the 8-warp or 32-row block covers partly,
/// head dims over 256 (wide or in two column chunks), odd head dims, split keys, masks, a random
/// schedule.
#[test]
fn kernel_variants_match_f64_attention() {
    let mut cases = vec![];
    for (dtype, variant) in [
        (DType::F16, FusedVariant::Base),
        (DType::F16, FusedVariant::Warps8),
        (DType::BF16, FusedVariant::Warps8Exp2),
        (DType::BF16, FusedVariant::Chunked),
    ] {
        // From the default kernel's cases: head dim 512 (the wide kernel under `base`, two
        // column chunks under the others), an odd head dim with element-wise copies, split keys
        // with late copies, head dim 300 split and masked; and a query tile the 8-warp block
        // covers partly.
        let base = half_cases(dtype);
        cases.extend([&base[2], &base[4], &base[8], &base[11]].map(|c| Case { variant, ..*c }));
        cases.push(Case {
            mask: Mask::Additive,
            seed: 6,
            variant,
            ..case(dtype, (2, 1, 150, 77, 64))
        });
    }
    // 32 rows a warp (`r32`, head dims up to 128; over 128 it runs the default's kernels, checked
    // above): query counts that fill a 128-row tile partly (70, 33, 17, 65, 30, and 150 and 130
    // over two tiles, the second one's rows mostly past the end), masks with wholly masked rows
    // and key padding, split keys landing late, odd head dims (13, 40: zero padding,
    // element-wise copies), one key, head dims 8 to 128, a random schedule.
    for dtype in [DType::F16, DType::BF16] {
        let variant = FusedVariant::Rows32Exp2;
        let base = half_cases(dtype);
        cases.extend([&base[0], &base[1], &base[4], &base[6], &base[7], &base[8]].map(|c| Case { variant, ..*c }));
        cases.push(Case {
            mask: Mask::Additive,
            seed: 6,
            variant,
            ..case(dtype, (2, 1, 150, 77, 64))
        });
        cases.push(Case {
            mask: Mask::Additive,
            layout: Layout::PaddedRows(3),
            splits: Some(3),
            late_copies: true,
            seed: 10,
            variant,
            ..case(dtype, (1, 1, 150, 200, 40))
        });
    }
    check(&cases);
}

#[test]
fn f32_kernels_match_f64_attention() {
    let c = |dims| case(DType::F32, dims);
    check(&[
        Case {
            mask: Mask::Additive,
            ..c((2, 2, 21, 77, 8))
        },
        Case {
            mask: Mask::KeyPadding,
            layout: Layout::TokensMajor,
            ..c((2, 1, 33, 70, 40))
        },
        Case {
            layout: Layout::PaddedRows(3),
            splits: Some(2),
            ..c((1, 1, 17, 90, 100))
        },
        Case {
            q_gain: 4.0,
            seed: 5,
            ..c((1, 1, 9, 40, 200))
        },
        c((1, 1, 10, 33, 512)),
        c((1, 3, 5, 1, 1)),
    ]);
}

/// The check can fail: the kernel given a scale 30 % off (the reference keeps the right one)
/// lands far outside the bound, in every dtype, and in both softmax forms of the f16/bf16
/// kernels (`exp2`: the scale folded into the exponent's FFMA without a mask, and into the
/// scores' with one; `base`: `expf`), and with 32 rows a warp (`r32`: 40 queries, both row
/// blocks of the first warp holding some).
#[test]
fn a_wrong_scale_fails_the_check() {
    let Some(bin) = runner() else { return };
    let mut cases = vec![case(DType::F32, (1, 1, 16, 40, 64))];
    for dtype in [DType::F16, DType::BF16] {
        for variant in [FusedVariant::Exp2, FusedVariant::Base, FusedVariant::Rows32Exp2] {
            let lq = if variant == FusedVariant::Rows32Exp2 { 40 } else { 16 };
            for mask in [Mask::None, Mask::Additive] {
                cases.push(Case {
                    variant,
                    mask,
                    ..case(dtype, (1, 1, lq, 40, 64))
                });
            }
        }
    }
    for right in cases {
        let dtype = right.dtype;
        let wrong = Case {
            wrong_scale: true,
            ..right
        };
        let (ok, ..) = run(bin, &right);
        let (bad, ..) = run(bin, &wrong);
        assert!(
            ok <= bound(dtype) && bad > 3.0 * bound(dtype),
            "{dtype:?} {:?} {:?}: right {ok:.2e}, wrong {bad:.2e}",
            right.variant,
            right.mask
        );
    }
}

/// What the mma kernels ask of shared and global memory on the head dims of the benchmarked
/// blocks, counted by the emulator ([`Traffic`]; a static view of the access patterns, the
/// part of speed that needs no GPU to see): every `ldmatrix` free of bank conflicts (shared rows
/// of a multiple of 64 elements swizzled, others 8 elements longer, an odd number of 16-byte
/// groups: either way 8 consecutive rows fall in 8 different groups at one column; the kernel's
/// `SmemTile`); the tile copies' shared stores at most 2-way conflicted, and free of
/// conflicts where a copied row is a multiple of 64 elements (8 lanes, one row); with
/// contiguous rows of a multiple of 16 elements, every 32-byte sector the copies read wholly
/// used. The variants with other tiles (4 and 8 warps, and 32 rows a warp up to head dim 128);
/// `ex2` changes no access. And the `ldmatrix` reads a tensor-core instruction costs: with 32
/// rows a warp each k and v fragment feeds two mmas, so at head dim 64 the 32-row kernel reads
/// markedly fewer fragments an mma than the 16-row one (0.31 against 0.56 on one key tile).
#[test]
fn mma_kernels_access_memory_without_bank_conflicts() {
    let Some(bin) = runner() else { return };
    let mut per_mma_d64 = vec![];
    for d in [32, 40, 64, 80, 128, 160, 512] {
        let mut variants = vec![FusedVariant::Base, FusedVariant::Warps8];
        if d <= 128 {
            variants.push(FusedVariant::Rows32Exp2);
        }
        for variant in variants {
            let c = Case {
                variant,
                ..case(DType::F16, (1, 1, 128, 64, d))
            };
            let (err, plan, t) = run(bin, &c);
            eprintln!(
                "{} d {d}: ldmatrix {:.3} wavefronts a phase ({} phases), copies {:.3} ({} phases), \
                 global sectors {:.3} used; {:.3} ldmatrix an mma ({} mma)",
                plan.kernel,
                t.ldmatrix_ways(),
                t.ldmatrix_phases,
                t.copy_ways(),
                t.copy_phases,
                t.copy_sector_use(),
                t.ldmatrix_per_mma(),
                t.mma
            );
            if d == 64 {
                per_mma_d64.push((plan.kernel.clone(), t.ldmatrix_per_mma()));
            }
            assert!(err <= bound(c.dtype), "{c:?}: error {err:.3e}");
            assert!(
                t.ldmatrix_phases > 0 && t.copy_phases > 0,
                "{}: nothing counted: {t:?}",
                plan.kernel
            );
            assert_eq!(
                t.ldmatrix_wavefronts, t.ldmatrix_phases,
                "{} d {d}: ldmatrix bank conflicts",
                plan.kernel
            );
            assert!(t.copy_wavefronts <= 2 * t.copy_phases, "{} d {d}: {t:?}", plan.kernel);
            if d % 64 == 0 {
                assert_eq!(
                    t.copy_wavefronts, t.copy_phases,
                    "{} d {d}: copy bank conflicts",
                    plan.kernel
                );
            }
            if d % 16 == 0 {
                assert_eq!(
                    32 * t.copy_sectors,
                    t.copy_bytes,
                    "{} d {d}: partly used sectors",
                    plan.kernel
                );
            }
        }
    }
    // Head dim 64, one tile of 64 keys: 16 rows a warp, a k step reads 1 q and 4 k fragments for
    // 8 mmas, a 16-key step of p·v 4 v fragments for 8 (36 for 64: 0.5625); 32 rows, 2 q and 4 k
    // for 16, 4 v for 16 (40 for 128: 0.3125).
    let [(k16, rows16), _, (k32, rows32)] = &per_mma_d64[..] else {
        panic!("{per_mma_d64:?}")
    };
    eprintln!("d 64: {k16} {rows16:.4} ldmatrix an mma, {k32} {rows32:.4}");
    assert!(k32.ends_with("_r32_e2"), "{per_mma_d64:?}");
    assert!(*rows32 < 0.6 * rows16, "{per_mma_d64:?}");
}

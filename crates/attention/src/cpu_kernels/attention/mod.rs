//! Tiled online-softmax ("flash") attention on the CPU, the attention core's kernel (kernels
//! layer: called by [`crate::sdpa`], built on the microkernels, scratch and caches of
//! [`crate::cpu`]): the score matrix is never formed whole.
//!
//! Work is split into tasks of one (batch·head, query block); rayon runs them in parallel. A task
//! walks the keys in blocks: the scores of its query rows against the block, then per row
//! scale, mask, running max, `exp` and row sum ([`simd`]), then `O = α·O + P·V_blk` into the
//! task's rows of the output, `α` rescaling rows whose max grew. Two engines run the two tile
//! products ([`Engine`]): register-tile microkernels of our own on K/V packed once per
//! batch·head ([`tiles`]: AVX-512, or AVX2 + FMA at head dims from 128), or one `gemm` call per
//! product ([`gemm_engine`]: other CPUs and small AVX2 head dims). Memory beyond
//! inputs and output: the packed (or transposed) K and V, one score tile and one output tile per
//! running task, plus f32 copies of non-f32 or non-contiguous inputs, O(tokens × head_dim).
//!
//! Rounding follows PyTorch's `cpu_flash_attention` (2.15): scores, mask, max and row sums in
//! f32; for f16/bf16 inputs the unnormalised weights `exp(s − max)` are rounded to the input dtype
//! before `·v` (the row sum uses the unrounded ones), with key blocks of 512 (its
//! `kv_split_size`) so the running max changes where torch's does, and libm's `exp` as the
//! reference path (not the faster polynomial of the f32 path); the result is
//! `acc · (1/sum)`, rounded once. A row whose keys are all masked gives 0 (torch's kernel), or
//! NaN with [`Empty::Nan`] (the eager `softmax` then `·v` semantics).

use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor};
use rayon::prelude::*;

use crate::cpu::aligned::Aligned;
use crate::cpu::isa::Isa;
use crate::cpu::scratch::{packing_buffer, with_scratch};
use crate::cpu::{caches, contiguous};

mod gemm_engine;
pub(crate) mod simd;
mod softmax;
mod tiles;

use softmax::{Mask, Softmax};

/// Key block length for f16/bf16 inputs: PyTorch's `kv_split_size`, which fixes where the
/// rounded weights are formed relative to the running max.
pub(crate) const HALF_KV_BLOCK: usize = 512;
/// Longest key block for f32 (no rounding point depends on it).
const F32_KV_BLOCK: usize = 512;

/// How the raw dot products become scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScoreScale {
    /// `s · c` (an f32 multiply; `c` = 1 is skipped).
    Mul(f32),
    /// `s / c` (an f32 true division).
    Div(f32),
}

/// What a row whose every score is `-inf` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// 0, as torch's SDPA kernels give.
    Zero,
    /// NaN, as `softmax` of an all `-inf` row followed by `·v` gives.
    Nan,
}

/// Whether [`attention`] takes these inputs: CPU tensors of rank 3 or 4, one dtype among
/// f32/f16/bf16 for q, k and v, equal leading dims, matching head dims, and a float mask (if any)
/// that broadcasts to the score shape.
pub(crate) fn supports(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> bool {
    let dtype = q.dtype();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || k.dtype() != dtype || v.dtype() != dtype {
        return false;
    }
    if !(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu()) {
        return false;
    }
    let r = q.rank();
    if !(r == 3 || r == 4) || k.rank() != r || v.rank() != r {
        return false;
    }
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd[..r - 2] != kd[..r - 2] || qd[..r - 2] != vd[..r - 2] || qd[r - 1] != kd[r - 1] || kd[r - 2] != vd[r - 2] {
        return false;
    }
    match mask {
        None => true,
        Some(m) => {
            let mut full = qd.to_vec();
            full[r - 1] = kd[r - 2];
            m.device().is_cpu()
                && matches!(m.dtype(), DType::F32 | DType::F16 | DType::BF16 | DType::F64)
                && m.broadcast_as(full).is_ok()
        }
    }
}

/// The f32 slice of a contiguous f32 CPU tensor's storage.
fn f32_slice<'a>(storage: &'a Storage, layout: &Layout) -> Result<&'a [f32]> {
    let Storage::Cpu(CpuStorage::F32(data)) = storage else {
        candle_core::bail!("sdpa cpu kernel: expected f32 CPU storage")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("sdpa cpu kernel: expected a contiguous tensor")
    };
    Ok(&data[start..end])
}

/// How the two tile products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The microkernels of [`tiles`] (this register tile) on K and V packed once per batch·head.
    Tiles(Isa),
    /// One `gemm` call per tile product (any CPU).
    Gemm,
}

impl Engine {
    /// The faster engine for head dim `d` on this CPU: [`Engine::Tiles`] with AVX-512; with
    /// AVX2 only where `d` ≥ 128, else [`Engine::Gemm`]. Measured on Zen 3 (2 threads): the
    /// AVX2 tiles run 3 – 7 % ahead of the `gemm` calls at d = 160 and 512, level at 96 – 128,
    /// and 7 – 25 % behind at 32 – 64, where each score tile sums too few products to cover its
    /// write-out.
    pub(crate) fn best(d: usize) -> Engine {
        match Isa::with_tiles() {
            Some(Isa::Avx2) if d < 128 => Engine::Gemm,
            Some(tile) => Engine::Tiles(tile),
            None => Engine::Gemm,
        }
    }

    /// This engine where this CPU runs it, with its register tile; a tile this CPU lacks falls
    /// back to `gemm` (AVX2 is a subset of AVX-512 here).
    fn on_this_cpu(self) -> (Engine, Isa) {
        let runs = |t: Isa| Isa::with_tiles().is_some_and(|best| t == best || t == Isa::Avx2);
        match self {
            Engine::Tiles(t) if runs(t) => (self, t),
            _ => (Engine::Gemm, Isa::Avx2),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    kv_block: usize,
    q_block: usize,
    /// The register tile of [`Engine::Tiles`].
    tile: Isa,
}

impl Dims {
    /// Whether [`Engine::Tiles`] packs each head's K and V once for all its query blocks (more
    /// than one task per head), instead of each task packing its own into its scratch.
    fn shares_packing(&self) -> bool {
        self.lq > self.q_block
    }
    /// Floats of one head's operands as [`tiles::pack_head`] lays them out.
    fn packed_len(&self) -> usize {
        let v = if self.values_in_place() {
            0
        } else {
            self.lk * self.dv_panels()
        };
        self.lk_panels() * self.d + v
    }
    /// Keys rounded up to whole K panels.
    fn lk_panels(&self) -> usize {
        self.lk.div_ceil(self.tile.nr()) * self.tile.nr()
    }
    /// Value channels rounded up to whole V panels.
    fn dv_panels(&self) -> usize {
        self.dv.div_ceil(self.tile.nr()) * self.tile.nr()
    }
    /// Whether [`Engine::Tiles`] reads V as it is, `(Lk, Dv)` row-major, instead of packing it:
    /// where its rows are whole panels already (`Dv` = 32), or split into whole panels with at
    /// most 128 keys under 2 KiB apart (a panel slice then fits L1 however its rows fall).
    fn values_in_place(&self) -> bool {
        let nr = self.tile.nr();
        self.dv.is_multiple_of(nr) && (self.dv == nr || (self.lk <= 128 && self.dv < 512))
    }
}

#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],
    /// Per batch·head: Kᵀ `(D, Lk)` for [`Engine::Gemm`]; for [`Engine::Tiles`] its packed
    /// operands ([`tiles::pack_head`]) where [`Dims::shares_packing`], else K `(Lk, D)`.
    k: &'a [f32],
    /// Per batch·head: V `(Lk, Dv)`.
    v: &'a [f32],
    mask: Option<Mask<'a>>,
    scale: ScoreScale,
    empty: Empty,
    round: Option<simd::Round>,
}

/// Query rows per task: 256 (64 for head dims up to 32), halved (down to 16) until there are at
/// least four tasks per thread.
///
/// At `D` ≤ 32 a score costs the fewest flops, and a 256-row task's score tile (256 × ~370
/// floats at 1028 keys) with its K and V fills most of a 1 MiB L2: measured on Zen 5 at
/// (1, 4, 1024, 1028, 32), 256-row tasks ran at 1.53 ms in some processes and 1.97 ms in others
/// (the same binary; 128 rows likewise), 64-row tasks at 1.53 ms in all 20 runs, and nothing
/// changed at the block level.
///
/// On the AVX2 tile the start is the rows whose query values for one reduction chunk fill about
/// a fifth of L2 (96 at 512 KiB and 256-channel chunks: 205 ms at 4096² d512 on Zen 3 against 211
/// for 256 rows), in whole micro-panels.
fn query_block(bh: usize, lq: usize, d: usize, engine: Engine) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let mut qb = match engine {
        Engine::Tiles(tile @ Isa::Avx2) => {
            let rows = caches::sizes().1 / 5 / (4 * tiles::tile_depth(tile).min(d));
            (rows / tile.mr() * tile.mr()).clamp(4 * tile.mr(), 256)
        }
        _ if d <= 32 => 64,
        _ => 256,
    };
    while qb > 16 && bh * lq.div_ceil(qb) < 4 * threads {
        qb /= 2;
    }
    qb
}

/// Key block length for f32 on [`Engine::Tiles`]: the `Lk` keys split into as few blocks of at
/// most [`F32_KV_BLOCK`] as they need, of about equal length in whole K panels (1028 keys: three
/// blocks of 352, 352, 324 instead of 512, 512 and a 4-key block that costs a whole pass).
fn f32_tiles_kv_block(lk: usize, nr: usize) -> usize {
    let blocks = lk.div_ceil(F32_KV_BLOCK);
    lk.div_ceil(blocks).div_ceil(nr) * nr
}

/// `softmax(q·kᵀ <scale> + mask)·v` with the rounding described in the module docs. `q`
/// `(B, H, Lq, D)` (or `(B, Lq, D)`), `k` `(.., Lk, D)`, `v` `(.., Lk, Dv)`, `mask` additive and
/// broadcasting to `(.., Lq, Lk)`. Returns `v`'s dtype. Callers check [`supports`] first.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: ScoreScale,
    empty: Empty,
) -> Result<Tensor> {
    let d = q.dims().last().copied().unwrap_or(0);
    attention_on(Engine::best(d), q, k, v, mask, scale, empty)
}

/// [`attention`] with the tile products of `engine` ([`Engine::Tiles`] needs AVX-512).
pub(crate) fn attention_on(
    engine: Engine,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: ScoreScale,
    empty: Empty,
) -> Result<Tensor> {
    let dtype = v.dtype();
    let rank = q.rank();
    let four = |t: &Tensor| if rank == 3 { t.unsqueeze(1) } else { Ok(t.clone()) };
    let (q4, k4, v4) = (four(q)?, four(k)?, four(v)?);
    let (b, heads, lq, d) = q4.dims4()?;
    let lk = k4.dim(2)?;
    let dv = v4.dim(3)?;
    let mut out_dims = q.dims().to_vec();
    out_dims[rank - 1] = dv;
    if lk == 0 || b * heads * lq * dv == 0 {
        return Tensor::zeros(out_dims, dtype, &Device::Cpu);
    }
    let (engine, tile) = engine.on_this_cpu();
    let mask4 = match mask {
        Some(m) => Some(broadcast_mask(m, rank, (b, heads, lq, lk))?),
        None => None,
    };
    let f32c = |t: &Tensor| to_dtype_fast(&contiguous(t)?, DType::F32);
    let (q4, k4, v4) = (f32c(&q4)?, f32c(&k4)?, f32c(&v4)?);
    let round = match dtype {
        DType::F16 => Some(simd::Round::F16),
        DType::BF16 => Some(simd::Round::BF16),
        _ => None,
    };
    let kv_block = match (round, engine) {
        (Some(_), _) => HALF_KV_BLOCK,
        (None, Engine::Tiles(_)) => f32_tiles_kv_block(lk, tile.nr()),
        (None, Engine::Gemm) => F32_KV_BLOCK,
    };
    let dims = Dims {
        batch: b,
        heads,
        lq,
        lk,
        d,
        dv,
        kv_block,
        q_block: query_block(b * heads, lq, d, engine),
        tile,
    };
    let out = run_f32(engine, &dims, (&q4, &k4, &v4), mask4.as_ref(), (scale, empty, round))?;
    to_dtype_fast(&Tensor::from_vec(out, out_dims, &Device::Cpu)?, dtype)
}

/// `x.to_dtype(dtype)`, in parallel where [`crate::cpu::cast`] takes it (the same bits).
fn to_dtype_fast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    match crate::cpu::cast(x, dtype)? {
        Some(y) => Ok(y),
        None => x.to_dtype(dtype),
    }
}

/// An additive mask broadcast to the score shape `(B, H, Lq, Lk)`: a rank-3 run's mask
/// broadcasts against `(B, Lq, Lk)`, so it gets the head axis after B.
fn broadcast_mask(m: &Tensor, rank: usize, scores: (usize, usize, usize, usize)) -> Result<Tensor> {
    let m = if rank == 3 && m.rank() == 3 {
        m.unsqueeze(1)?
    } else {
        m.clone()
    };
    m.broadcast_as(scores)
}

/// The output of the kernel, `(B, H, Lq, Dv)` row-major, from contiguous f32 `(B, H, L, ·)`
/// inputs and a mask broadcast to the score shape; the scores' scale, what an all-masked row
/// gives, and the half-precision rounding of the weights as given.
fn run_f32(
    engine: Engine,
    dims: &Dims,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    (scale, empty, round): (ScoreScale, Empty, Option<simd::Round>),
) -> Result<Vec<f32>> {
    let (qg, ql) = q.storage_and_layout();
    let (kg, kl) = k.storage_and_layout();
    let (vg, vl) = v.storage_and_layout();
    let mg = mask.map(|m| m.storage_and_layout());
    let mask = match &mg {
        Some((g, l)) => Some(Mask::view(g, l)?),
        None => None,
    };
    let (k_in, v_in) = (f32_slice(&kg, kl)?, f32_slice(&vg, vl)?);
    let store = shared_keys(engine, dims, k_in, v_in);
    let inputs = Inputs {
        q: f32_slice(&qg, ql)?,
        k: if store.is_empty() { k_in } else { &store },
        v: v_in,
        mask,
        scale,
        empty,
        round,
    };
    let out = run_tasks(engine, &inputs, dims);
    packing_buffer::give_back(store);
    Ok(out)
}

/// K as the engine reads it, made once per batch·head and shared by every query block: Kᵀ
/// `(D, Lk)` for `gemm` (it then packs Kᵀ as a plain copy, not a gather), each head's packed
/// operands for the microkernels. Empty where a head is one task (that task packs its own).
/// From [`packing_buffer`]: given back after the tasks.
fn shared_keys(engine: Engine, dims: &Dims, k: &[f32], v: &[f32]) -> Aligned {
    match engine {
        Engine::Gemm => {
            let mut kt = packing_buffer::take(k.len());
            gemm_engine::transpose_heads(k, dims.lk, dims.d, &mut kt);
            kt
        }
        Engine::Tiles(_) if dims.shares_packing() => {
            let mut packed = packing_buffer::take(dims.batch * dims.heads * dims.packed_len());
            tiles::pack_heads(k, v, dims, &mut packed);
            packed
        }
        Engine::Tiles(_) => Aligned::default(),
    }
}

/// The output values, every task in parallel: one per (batch·head, query block).
fn run_tasks(engine: Engine, inputs: &Inputs, dims: &Dims) -> Vec<f32> {
    let (lq, dv) = (dims.lq, dims.dv);
    let len = dims.batch * dims.heads * lq * dv;
    // Every element is written by exactly one task (no zeroing pass).
    let mut out: Vec<f32> = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(lq * dv)
        .enumerate()
        .for_each(|(bh, head_out)| {
            head_out
                .par_chunks_mut(dims.q_block * dv)
                .enumerate()
                .for_each(|(blk, o)| match engine {
                    Engine::Tiles(_) => tiles::task(inputs, dims, bh, blk * dims.q_block, o),
                    Engine::Gemm => gemm_engine::task(inputs, dims, bh, blk * dims.q_block, o),
                });
        });
    // SAFETY: the tasks above initialised all `len` elements (their chunks cover the range).
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod tests {
    use super::{attention_on, Empty, Engine, ScoreScale};
    use crate::cpu::isa::Isa;
    use crate::test_support::{naive_attention, values_f64};
    use candle_core::{DType, Device, Tensor};

    /// `softmax(q·kᵀ <scale> + mask)·v` in f64 ([`naive_attention`]; an all-masked row: `empty`).
    fn naive(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: ScoreScale, empty: Empty) -> Vec<f64> {
        let f = values_f64;
        let mask = mask.map(f);
        let (heads, lq, d) = q.dims3().unwrap();
        let (lk, dv) = (k.dim(1).unwrap(), v.dim(2).unwrap());
        let score = |_, i, j, dot: f64| {
            let dot = match scale {
                ScoreScale::Mul(c) => dot * c as f64,
                ScoreScale::Div(c) => dot / c as f64,
            };
            dot + mask.as_ref().map_or(0.0, |m| m[i * lk + j])
        };
        let empty = if empty == Empty::Nan { f64::NAN } else { 0.0 };
        naive_attention((&f(q), &f(k), &f(v)), (heads, lq, lk, d, dv), score, empty)
    }

    /// Both engines (the microkernels where this CPU has AVX-512) against the f64 reference, on
    /// shapes that reach every edge: short last micro-panels, key and channel counts that are
    /// not whole panels, several key blocks, head dims above the channel split, query blocks
    /// sharing packed K/V, masks with fully masked rows, both scale kinds.
    #[test]
    fn both_engines_match_an_f64_reference_at_every_edge() {
        let dev = Device::Cpu;
        // (heads, Lq, Lk, D, Dv)
        let shapes = [
            (2, 1, 1, 8, 3),
            (3, 37, 77, 40, 24),
            (2, 13, 600, 300, 70),
            (1, 300, 1100, 16, 33),
            (2, 520, 64, 64, 64),
            (1, 29, 45, 512, 32),
            // V read in place: Dv = 32 (one task per head, and shared by query blocks), and
            // whole panels with few keys.
            (2, 40, 100, 24, 32),
            (1, 700, 300, 20, 32),
            (2, 9, 90, 48, 96),
            // Shared packing split into several groups of K panels (the last one short) and of
            // V panels (the last one with channels past Dv).
            (1, 600, 700, 96, 80),
        ];
        let mut engines = vec![Engine::Gemm];
        engines.extend(Isa::with_tiles().map(Engine::Tiles));
        if Isa::with_tiles() == Some(Isa::Avx512) {
            engines.push(Engine::Tiles(Isa::Avx2));
        }
        for (h, lq, lk, d, dv) in shapes {
            let q = Tensor::randn(0f32, 1., (h, lq, d), &dev).unwrap();
            let k = Tensor::randn(0f32, 1., (h, lk, d), &dev).unwrap();
            let v = Tensor::randn(0f32, 1., (h, lk, dv), &dev).unwrap();
            // Row 0 fully masked, every 5th key masked, the rest random.
            let m: Vec<f32> = (0..lq * lk)
                .map(|x| match (x / lk, x % lk) {
                    (0, _) => f32::NEG_INFINITY,
                    (_, j) if j % 5 == 4 => f32::NEG_INFINITY,
                    _ => ((x * 7919) % 13) as f32 * 0.3 - 2.0,
                })
                .collect();
            let mask = Tensor::from_vec(m, (lq, lk), &dev).unwrap();
            let c = 1.0 / (d as f32).sqrt();
            for (mask, scale, empty) in [
                (None, ScoreScale::Mul(c), Empty::Zero),
                (Some(&mask), ScoreScale::Div(1.0 / c), Empty::Nan),
                (Some(&mask), ScoreScale::Mul(c), Empty::Zero),
            ] {
                let want = naive(&q, &k, &v, mask, scale, empty);
                for &engine in &engines {
                    let got = attention_on(engine, &q, &k, &v, mask, scale, empty).unwrap();
                    assert_eq!(got.dims(), &[h, lq, dv]);
                    let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let ok = if w.is_nan() {
                            g.is_nan()
                        } else {
                            (*g as f64 - w).abs() <= 1e-5 + 1e-5 * w.abs()
                        };
                        assert!(ok, "{engine:?} {:?} element {i}: {g} vs {w}", (h, lq, lk, d, dv));
                    }
                }
            }
        }
    }

    /// f16 and bf16 round the same weights on both engines (only the f32 summation order of
    /// the value products differs).
    #[test]
    fn both_engines_agree_in_half_precision() {
        let Some(tile) = Isa::with_tiles() else {
            return;
        };
        let dev = Device::Cpu;
        for dtype in [DType::F16, DType::BF16] {
            let r = |n: usize, c: usize| {
                Tensor::randn(0f32, 1., (2, 3, n, c), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let (q, k, v) = (r(300, 64), r(1030, 64), r(1030, 40));
            let run = |e| {
                attention_on(e, &q, &k, &v, None, ScoreScale::Mul(0.125), Empty::Zero)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            let (a, b) = (run(Engine::Gemm), run(Engine::Tiles(tile)));
            let step = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / (x.abs() + 1e-2))
                .fold(0f32, f32::max);
            // At most one rounding step of the output apart.
            assert!(worst <= step, "{dtype:?}: {worst}");
        }
    }
}

//! Tiled online-softmax ("flash") attention on the CPU: the score matrix is never formed whole.
//!
//! Work is split into tasks of one (batch·head, query block); rayon runs them in parallel. A task
//! walks the keys in blocks: `S = Q_blk·K_blkᵀ` into a `(query block × key block)` tile (one
//! `gemm` call), then per row scale, mask, running max, `exp` and row sum (SIMD, [`simd`]), then
//! `O += P·V_blk` straight into the task's rows of the output (a second `gemm` call), after
//! rescaling those rows where their max grew. Memory beyond inputs and output: one score tile per
//! running task plus f32 copies of non-f32 or non-contiguous inputs, O(tokens × head_dim).
//!
//! Rounding follows PyTorch's `cpu_flash_attention` (2.15): scores, mask, max and row sums in
//! f32; for f16/bf16 inputs the unnormalised weights `exp(s − max)` are rounded to the input dtype
//! before `·v` (the row sum uses the unrounded ones), with key blocks of 512 (its
//! `kv_split_size`) so the running max changes where torch's does, and libm's `exp` as the
//! reference path (not the faster polynomial of the f32 path); the result is
//! `acc · (1/sum)`, rounded once. A row whose keys are all masked gives 0 (torch's kernel), or
//! NaN with [`Empty::Nan`] (the eager `softmax` then `·v` semantics).

use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor, WithDType};
use rayon::prelude::*;
use std::mem::MaybeUninit;

mod tiles;

/// Key block length for f16/bf16 inputs: PyTorch's `kv_split_size`, which fixes where the
/// rounded weights are formed relative to the running max.
pub(crate) const HALF_KV_BLOCK: usize = 512;
/// Key block length for f32 (no rounding point depends on it; sized for the L2 cache).
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

/// An additive float mask as stored, read through the strides of its broadcast
/// `(batch, head, query, key)` view (0 where broadcast), so it is never materialised.
#[derive(Clone, Copy)]
struct Mask<'a> {
    data: &'a CpuStorage,
    offset: usize,
    stride: [usize; 4],
}

fn load<T: WithDType>(src: &[T], start: usize, stride: usize, dst: &mut [f32]) {
    if stride == 1 {
        let n = dst.len();
        for (d, s) in dst.iter_mut().zip(&src[start..start + n]) {
            *d = s.to_f64() as f32;
        }
    } else {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = src[start + j * stride].to_f64() as f32;
        }
    }
}

impl Mask<'_> {
    /// The mask of row `(b, h, i)` for keys `k0..k0 + dst.len()`, in f32, into `dst`.
    fn row(&self, b: usize, h: usize, i: usize, k0: usize, dst: &mut [f32]) {
        let s = self.stride;
        let start = self.offset + b * s[0] + h * s[1] + i * s[2] + k0 * s[3];
        match self.data {
            CpuStorage::F32(x) if s[3] == 1 => dst.copy_from_slice(&x[start..start + dst.len()]),
            CpuStorage::F32(x) => load(x, start, s[3], dst),
            CpuStorage::F16(x) => load(x, start, s[3], dst),
            CpuStorage::BF16(x) => load(x, start, s[3], dst),
            CpuStorage::F64(x) => load(x, start, s[3], dst),
            // `supports` admits float masks only.
            _ => dst.fill(f32::NAN),
        }
    }
}

/// How the two tile products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The AVX-512 microkernels of [`tiles`] on K and V packed once per batch·head.
    Tiles,
    /// One `gemm` call per tile product (any CPU).
    Gemm,
}

impl Engine {
    /// [`Engine::Tiles`] where the CPU has AVX-512, else [`Engine::Gemm`].
    pub(crate) fn best() -> Engine {
        if tiles::available() {
            Engine::Tiles
        } else {
            Engine::Gemm
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    heads: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    kv_block: usize,
    q_block: usize,
}

impl Dims {
    /// Keys rounded up to whole K panels.
    fn lk_panels(&self) -> usize {
        self.lk.div_ceil(tiles::NR) * tiles::NR
    }
    /// Value channels rounded up to whole V panels.
    fn dv_panels(&self) -> usize {
        self.dv.div_ceil(tiles::NR) * tiles::NR
    }
}

#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],
    /// Per batch·head: Kᵀ `(D, Lk)` for [`Engine::Gemm`]; for [`Engine::Tiles`] K panels if
    /// `packed`, else K `(Lk, D)`.
    k: &'a [f32],
    /// Per batch·head: for [`Engine::Tiles`] V panels if `packed`, else V `(Lk, Dv)`.
    v: &'a [f32],
    /// Whether K and V are packed for the microkernels already (else each task packs its own).
    packed: bool,
    mask: Option<Mask<'a>>,
    scale: ScoreScale,
    empty: Empty,
    round: Option<simd::Round>,
}

/// Query rows per task: 256, halved (down to 16) until there are at least four tasks per thread.
fn query_block(bh: usize, lq: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let mut qb = 256;
    while qb > 16 && bh * lq.div_ceil(qb) < 4 * threads {
        qb /= 2;
    }
    qb
}

/// Key block length for f32 on [`Engine::Tiles`]: the `Lk` keys split into as few blocks of at
/// most [`F32_KV_BLOCK`] as they need, of about equal length in whole K panels (1028 keys: three
/// blocks of 352, 352, 324 instead of 512, 512 and a 4-key block that costs a whole pass).
fn f32_tiles_kv_block(lk: usize) -> usize {
    let blocks = lk.div_ceil(F32_KV_BLOCK);
    lk.div_ceil(blocks).div_ceil(tiles::NR) * tiles::NR
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
    attention_on(Engine::best(), q, k, v, mask, scale, empty)
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
    let engine = if tiles::available() { engine } else { Engine::Gemm };
    let mask4 = match mask {
        Some(m) => {
            // A rank-3 run broadcasts its mask against (B, Lq, Lk); add the head axis after B.
            let m = if rank == 3 && m.rank() == 3 {
                m.unsqueeze(1)?
            } else {
                m.clone()
            };
            Some(m.broadcast_as((b, heads, lq, lk))?)
        }
        None => None,
    };
    let f32c = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
    let (q4, k4, v4) = (f32c(&q4)?, f32c(&k4)?, f32c(&v4)?);
    let round = match dtype {
        DType::F16 => Some(simd::Round::F16),
        DType::BF16 => Some(simd::Round::BF16),
        _ => None,
    };
    let kv_block = match (round, engine) {
        (Some(_), _) => HALF_KV_BLOCK,
        (None, Engine::Tiles) => f32_tiles_kv_block(lk),
        (None, Engine::Gemm) => F32_KV_BLOCK,
    };
    let dims = Dims {
        heads,
        lq,
        lk,
        d,
        dv,
        kv_block,
        q_block: query_block(b * heads, lq),
    };

    let (qg, ql) = q4.storage_and_layout();
    let (kg, kl) = k4.storage_and_layout();
    let (vg, vl) = v4.storage_and_layout();
    let mg = mask4.as_ref().map(|m| m.storage_and_layout());
    let mask = match &mg {
        None => None,
        Some((g, l)) => {
            let Storage::Cpu(data) = &**g else {
                candle_core::bail!("sdpa cpu kernel: the mask is not on the CPU")
            };
            let st = l.stride();
            Some(Mask {
                data,
                offset: l.start_offset(),
                stride: [st[0], st[1], st[2], st[3]],
            })
        }
    };
    let (k_in, v_in) = (f32_slice(&kg, kl)?, f32_slice(&vg, vl)?);
    // The K (and V) operands as the engine reads them, made once per batch·head and shared by
    // every query block: K transposed to (D, Lk) for `gemm` (it then packs Kᵀ as a plain copy,
    // not a gather), K panels then V panels for the microkernels. Where a head is one task,
    // that task packs its own K and V into its scratch instead.
    let packed = engine == Engine::Tiles && lq > dims.q_block;
    let (lk_p, dv_p) = (dims.lk_panels(), dims.dv_panels());
    let mut store = match (engine, packed) {
        (Engine::Gemm, _) => packing_buffer::take(k_in.len()),
        (Engine::Tiles, true) => packing_buffer::take(b * heads * (lk_p * d + lk * dv_p)),
        (Engine::Tiles, false) => Vec::new(),
    };
    match (engine, packed) {
        (Engine::Gemm, _) => transpose_heads(k_in, lk, d, &mut store),
        (Engine::Tiles, true) => {
            let (kp, vp) = store.split_at_mut(b * heads * lk_p * d);
            rayon::join(
                || {
                    kp.par_chunks_mut(lk_p * d)
                        .zip(k_in.par_chunks(lk * d))
                        .for_each(|(dst, src)| tiles::pack_keys(src, lk, d, dst))
                },
                || {
                    vp.par_chunks_mut(lk * dv_p)
                        .zip(v_in.par_chunks(lk * dv))
                        .for_each(|(dst, src)| tiles::pack_values(src, lk, dv, dst))
                },
            );
        }
        (Engine::Tiles, false) => {}
    }
    let (k_op, v_op) = match (engine, packed) {
        (Engine::Gemm, _) => (&store[..], v_in),
        (Engine::Tiles, true) => store.split_at(b * heads * lk_p * d),
        (Engine::Tiles, false) => (k_in, v_in),
    };
    let inputs = Inputs {
        q: f32_slice(&qg, ql)?,
        k: k_op,
        v: v_op,
        packed,
        mask,
        scale,
        empty,
        round,
    };
    // Every element is written by exactly one task (no zeroing pass).
    let len = b * heads * lq * dv;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(lq * dv)
        .enumerate()
        .for_each(|(bh, head_out)| {
            head_out
                .par_chunks_mut(dims.q_block * dv)
                .enumerate()
                .for_each(|(blk, o)| match engine {
                    Engine::Tiles => task_tiles(&inputs, &dims, bh, blk * dims.q_block, o),
                    Engine::Gemm => task_gemm(&inputs, &dims, bh, blk * dims.q_block, o),
                });
        });
    // SAFETY: the tasks above initialised all `len` elements (their chunks cover the range).
    unsafe { out.set_len(len) };
    packing_buffer::give_back(store);
    Tensor::from_vec(out, out_dims, &Device::Cpu)?.to_dtype(dtype)
}

/// Each `(rows, cols)` matrix of `x` transposed into `out`, in parallel over matrices, in 16×16
/// tiles.
fn transpose_heads(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const T: usize = 16;
    out.par_chunks_mut(rows * cols)
        .zip(x.par_chunks(rows * cols))
        .for_each(|(dst, src)| {
            for r0 in (0..rows).step_by(T) {
                for c0 in (0..cols).step_by(T) {
                    for r in r0..(r0 + T).min(rows) {
                        for c in c0..(c0 + T).min(cols) {
                            dst[c * rows + r] = src[r * cols + c];
                        }
                    }
                }
            }
        });
}

/// One buffer for the packed (or transposed) K and V of a call, kept for the next call: a
/// denoising loop calls the same shapes over and over, and a fresh buffer of that size costs a
/// page fault per 4 KiB each time. At most [`KEEP`](packing_buffer::KEEP) floats are kept.
mod packing_buffer {
    use std::sync::Mutex;

    /// 64 MiB of f32.
    pub(super) const KEEP: usize = 16 << 20;
    static KEPT: Mutex<Vec<f32>> = Mutex::new(Vec::new());

    /// A buffer of exactly `len` floats (the kept one if it is large enough; contents arbitrary).
    pub(super) fn take(len: usize) -> Vec<f32> {
        let mut v = std::mem::take(&mut *KEPT.lock().unwrap_or_else(|e| e.into_inner()));
        v.resize(len, 0.0);
        v
    }

    /// Keep `v` for the next call, unless it is larger than [`KEEP`] or a larger one is kept.
    pub(super) fn give_back(v: Vec<f32>) {
        if v.capacity() <= KEEP {
            let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
            if kept.capacity() < v.capacity() {
                *kept = v;
            }
        }
    }
}

/// `C (+)= A·B` for f32 row-major-or-strided operands (`rs`/`cs`: row/column strides), one thread.
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    c_rs: usize,
    accumulate: bool,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
) {
    // Bounds of every element each operand's strides reach.
    assert!(m > 0 && n > 0 && k > 0);
    assert!(c.len() > (m - 1) * c_rs + (n - 1));
    assert!(a.len() > (m - 1) * a_rs + (k - 1) * a_cs);
    assert!(b.len() > (k - 1) * b_rs + (n - 1) * b_cs);
    // SAFETY: the asserts above keep every access within the slices; `c` is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The online softmax of one task's query rows: their running max and sum, and how score rows
/// become weights.
struct Softmax<'a> {
    inp: &'a Inputs<'a>,
    ops: simd::Ops,
    /// The factor the exp pass applies ([`simd::deferred_scale`]).
    pre: f32,
    /// Batch and head of the task.
    b: usize,
    h: usize,
    max: Vec<f32>,
    sum: Vec<f32>,
}

impl<'a> Softmax<'a> {
    fn new(inp: &'a Inputs<'a>, dims: &Dims, bh: usize, rows: usize) -> Self {
        Softmax {
            inp,
            ops: simd::ops(),
            pre: simd::deferred_scale(inp.scale, inp.mask.is_some()),
            b: bh / dims.heads,
            h: bh % dims.heads,
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0f32; rows],
        }
    }

    /// Scores `s` of task row `r` (query `i`) against keys `k0..k0 + s.len()` become their
    /// weights; returns the factor the row's earlier output is to be multiplied by (`α`, 1 on
    /// the first key block). `mask_row` is scratch of at least `s.len()`.
    fn update(&mut self, r: usize, i: usize, k0: usize, s: &mut [f32], mask_row: &mut [f32]) -> f32 {
        let inp = self.inp;
        let m = match &inp.mask {
            Some(mask) => {
                let mr = &mut mask_row[..s.len()];
                mask.row(self.b, self.h, i, k0, mr);
                (self.ops.scale_mask_max)(s, Some(mr), inp.scale)
            }
            None => (self.ops.scale_mask_max)(s, None, inp.scale),
        };
        let m_old = self.max[r];
        let m_new = if m > m_old { m } else { m_old };
        // A finite stand-in for a max of -inf: exp(-inf - MIN) = 0, exp(MIN - MIN) = 1.
        let m_safe = m_new.clamp(f32::MIN, f32::MAX);
        let p_sum = (self.ops.exp_sum)(s, self.pre, m_safe, inp.round);
        self.max[r] = m_new;
        if k0 == 0 {
            self.sum[r] = p_sum;
            1.0
        } else {
            let alpha = (m_old.clamp(f32::MIN, f32::MAX) - m_safe).exp();
            self.sum[r] = p_sum + self.sum[r] * alpha;
            alpha
        }
    }

    /// What the accumulated `Σ p·v` of task row `r` is multiplied by: `1 / sum`; for a row
    /// whose keys are all masked (sum 0, accumulator 0) 1 as torch's kernel (the row is 0), or
    /// NaN as softmax gives.
    fn factor(&self, r: usize) -> f32 {
        match (self.sum[r] == 0.0, self.inp.empty) {
            (false, _) => 1.0 / self.sum[r],
            (true, Empty::Zero) => 1.0,
            (true, Empty::Nan) => f32::NAN,
        }
    }
}

/// One task on [`Engine::Gemm`]: query rows `q0 .. q0 + o.len() / dv` of batch·head `bh`,
/// written into `o`.
fn task_gemm(inp: &Inputs, dims: &Dims, bh: usize, q0: usize, o: &mut [MaybeUninit<f32>]) {
    let Dims {
        lq,
        lk,
        d,
        dv,
        kv_block,
        ..
    } = *dims;
    o.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just initialised, and f32 and MaybeUninit<f32> share a layout.
    let o = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
    let rows = o.len() / dv;
    let q = &inp.q[(bh * lq + q0) * d..][..rows * d];
    let kt = &inp.k[bh * lk * d..][..lk * d]; // (D, Lk)
    let v = &inp.v[bh * lk * dv..][..lk * dv];
    let kb = kv_block.min(lk);
    // The worker's score tile and mask row, taken out for this task and put back after it.
    let mut scratch = SCRATCH.take();
    let need = rows * kb + kb;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (s, mask_row) = scratch[..need].split_at_mut(rows * kb);
    let mut softmax = Softmax::new(inp, dims, bh, rows);
    for k0 in (0..lk).step_by(kb) {
        let n = kb.min(lk - k0);
        let first = k0 == 0;
        let s = &mut s[..rows * n];
        // S = Q_blk · K_blkᵀ, with Kᵀ stored (D, Lk).
        gemm_f32(rows, n, d, s, n, false, q, d, 1, &kt[k0..], lk, 1);
        for (r, srow) in s.chunks_exact_mut(n).enumerate() {
            let alpha = softmax.update(r, q0 + r, k0, srow, mask_row);
            if !first && alpha != 1.0 {
                (softmax.ops.scale)(&mut o[r * dv..(r + 1) * dv], alpha);
            }
        }
        // O (+)= P · V_blk
        gemm_f32(rows, dv, n, o, dv, !first, s, n, 1, &v[k0 * dv..], dv, 1);
    }
    for (r, row) in o.chunks_exact_mut(dv).enumerate() {
        (softmax.ops.scale)(row, softmax.factor(r));
    }
    SCRATCH.set(scratch);
}

/// One task on [`Engine::Tiles`]: query rows `q0 .. q0 + o.len() / dv` of batch·head `bh`,
/// written into `o`. Per key block: the score tiles (each K panel slice stays in L1 while the
/// task's query micro-panels pass it), the softmax update of every row, then the output tiles
/// (each V panel slice in L1 while the weight micro-panels pass it), into the task's padded
/// output rows.
fn task_tiles(inp: &Inputs, dims: &Dims, bh: usize, q0: usize, o: &mut [MaybeUninit<f32>]) {
    use tiles::{MR, NR};
    let Dims {
        lq,
        lk,
        d,
        dv,
        kv_block,
        ..
    } = *dims;
    let (lk_p, dv_p) = (dims.lk_panels(), dims.dv_panels());
    let rows = o.len() / dv;
    let panels = rows.div_ceil(MR);
    let q = &inp.q[(bh * lq + q0) * d..][..rows * d];
    let kb = kv_block.min(lk);
    // Score rows padded past a multiple of 16 lanes so the rows of a micro-panel do not share
    // cache sets.
    let ld = kb.div_ceil(NR) * NR + 16;
    let mut scratch = SCRATCH.take();
    let own = if inp.packed { 0 } else { lk_p * d + lk * dv_p };
    // Query rows copied with a padded stride (rows 2 KiB apart would share L1 sets), the rows of
    // the last micro-panel past `rows` zero.
    let ldq = d.div_ceil(16) * 16 + 16;
    let sizes = [
        own,
        panels * MR * ldq,
        panels * MR * ld,
        panels * MR * dv_p,
        panels * MR,
        kb,
    ];
    let need: usize = sizes.iter().sum();
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (own, rest) = scratch[..need].split_at_mut(sizes[0]);
    let (kp, vp): (&[f32], &[f32]) = if inp.packed {
        (
            &inp.k[bh * lk_p * d..][..lk_p * d],
            &inp.v[bh * lk * dv_p..][..lk * dv_p],
        )
    } else {
        let (kp, vp) = own.split_at_mut(lk_p * d);
        tiles::pack_keys(&inp.k[bh * lk * d..][..lk * d], lk, d, kp);
        tiles::pack_values(&inp.v[bh * lk * dv..][..lk * dv], lk, dv, vp);
        (kp, vp)
    };
    let (qp, rest) = rest.split_at_mut(sizes[1]);
    let (s, rest) = rest.split_at_mut(sizes[2]);
    let (acc, rest) = rest.split_at_mut(sizes[3]);
    let (alpha, mask_row) = rest.split_at_mut(sizes[4]);
    for (r, dst) in qp.chunks_exact_mut(ldq).enumerate() {
        match q.get(r * d..(r + 1) * d) {
            Some(src) => dst[..d].copy_from_slice(src),
            None => dst[..d].fill(0.0),
        }
    }
    alpha.fill(1.0);
    let ones = [1f32; MR];
    let mut softmax = Softmax::new(inp, dims, bh, rows);
    for k0 in (0..lk).step_by(kb) {
        let n = kb.min(lk - k0);
        // S = Q · K_blkᵀ, KC channels at a time.
        for (p0, kc) in tiles::chunks(d) {
            for jp in 0..n.div_ceil(NR) {
                let k_pan = &kp[((k0 / NR + jp) * d + p0) * NR..][..kc * NR];
                // The next panel slice, fetched a part per micro-panel while this one runs.
                let next = kp.get(((k0 / NR + jp + 1) * d + p0) * NR..).unwrap_or(&[]);
                for mp in 0..panels {
                    tiles::prefetch(next, mp, panels, kc * NR);
                    let s_tile = &mut s[mp * MR * ld + jp * NR..];
                    let mr = MR.min(rows - mp * MR);
                    tiles::score_tile(mr, &qp[mp * MR * ldq + p0..], ldq, k_pan, kc, s_tile, ld, p0 > 0);
                }
            }
        }
        for (r, srow) in s.chunks_exact_mut(ld).take(rows).enumerate() {
            alpha[r] = softmax.update(r, q0 + r, k0, &mut srow[..n], mask_row);
        }
        // O = α·O + P · V_blk, KC keys at a time.
        for (j0, nc) in tiles::chunks(n) {
            for cp in 0..dv_p / NR {
                let v_pan = &vp[(cp * lk + k0 + j0) * NR..][..nc * NR];
                let next = vp.get(((cp + 1) * lk + k0 + j0) * NR..).unwrap_or(&[]);
                for mp in 0..panels {
                    tiles::prefetch(next, mp, panels, nc * NR);
                    let init = match (k0, j0) {
                        (0, 0) => None,
                        (_, 0) => Some(&alpha[mp * MR..]),
                        _ => Some(&ones[..]),
                    };
                    let p_tile = &s[mp * MR * ld + j0..];
                    let o_tile = &mut acc[mp * MR * dv_p + cp * NR..];
                    tiles::value_tile(MR.min(rows - mp * MR), p_tile, ld, nc, v_pan, o_tile, dv_p, init);
                }
            }
        }
    }
    for (r, row) in o.chunks_exact_mut(dv).enumerate() {
        tiles::store_scaled(&acc[r * dv_p..r * dv_p + dv], softmax.factor(r), row);
    }
    SCRATCH.set(scratch);
}

thread_local! {
    /// A worker's score tile and mask row, kept between tasks (no allocation and zeroing per
    /// task; every element a task reads it has written first).
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Row kernels, written once as plain loops that auto-vectorise and compiled three times: for
/// AVX-512 and for AVX2+FMA (`#[target_feature]`, chosen at run time with
/// `is_x86_feature_detected!`), and for the baseline target (any architecture).
pub(crate) mod simd {
    use super::ScoreScale;

    /// Rounding of the unnormalised weights to a half type (as f32 values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Round {
        F16,
        BF16,
    }

    const LANES: usize = 16;

    /// `a · b + c`, one rounding (a fused multiply-add) when `FUSED`, two otherwise.
    #[inline(always)]
    fn mad<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
        if FUSED {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }

    /// Whether the portable row kernels use fused multiply-adds: where the target has them in
    /// hardware (elsewhere `mul_add` is a slow library call).
    const PORTABLE_FUSED: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

    /// `exp(x)` for f32: Cephes' `expf` range reduction and polynomial (about 1 ulp), as
    /// branch-free selects so that it vectorises, with fused multiply-adds when `FUSED`; 0 below
    /// -87.3 (where `expf` is subnormal), +inf above 88, NaN for NaN.
    #[inline(always)]
    pub(crate) fn exp<const FUSED: bool>(x: f32) -> f32 {
        const HI: f32 = 88.0;
        const LO: f32 = -87.33654;
        let xc = if x > HI { HI } else { x };
        let xc = if xc < LO { LO } else { xc };
        // n = round(x · log2 e) by the 1.5 · 2^23 trick (ties to even; |n| < 2^22): the sum's
        // low mantissa bits hold n, so 2^n needs no float-to-int conversion (which does not
        // vectorise).
        let big = mad::<FUSED>(xc, std::f32::consts::LOG2_E, 12582912.0);
        let n = big - 12582912.0;
        let n_int = (big.to_bits() as i32).wrapping_sub(0x4B40_0000);
        let r = mad::<FUSED>(n, 2.121_944_4e-4, mad::<FUSED>(n, -0.693_359_4, xc));
        let r2 = r * r;
        let p = mad::<FUSED>(1.987_569_1e-4, r, 1.398_199_9e-3);
        let p = mad::<FUSED>(p, r, 8.333_452e-3);
        let p = mad::<FUSED>(p, r, 4.166_579_6e-2);
        let p = mad::<FUSED>(p, r, 1.666_666_5e-1);
        let p = mad::<FUSED>(p, r, 0.5); // Cephes: 5.0000001e-1, which is 0.5 in f32
        let y = mad::<FUSED>(p, r2, r) + 1.0;
        let pow2 = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
        let res = y * pow2;
        if x < LO {
            0.0
        } else if x > HI {
            f32::INFINITY
        } else {
            res
        }
    }

    /// `x` rounded to the nearest bf16 (ties to even), as f32.
    #[inline(always)]
    pub(crate) fn round_bf16(x: f32) -> f32 {
        let b = x.to_bits();
        let r = f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000);
        if x.is_nan() {
            x
        } else {
            r
        }
    }

    /// `x` rounded to the nearest f16 (ties to even; subnormals and overflow to ±inf), as f32.
    #[inline(always)]
    pub(crate) fn round_f16(x: f32) -> f32 {
        let a = x.abs();
        let b = a.to_bits();
        // Normal f16 range: keep 10 mantissa bits.
        let normal = f32::from_bits(b.wrapping_add(0x0FFF + ((b >> 13) & 1)) & 0xFFFF_E000);
        // Subnormal f16 range (below 2^-14): a multiple of 2^-24, the ulp of 0.75 in f32.
        let sub = (a + 0.75) - 0.75;
        let r = if a < 6.103_515_6e-5 { sub } else { normal };
        let r = if a >= 65520.0 { f32::INFINITY } else { r };
        let r = if x.is_sign_negative() { -r } else { r };
        if x.is_nan() {
            x
        } else {
            r
        }
    }

    /// `x[0] ∘ x[1] ∘ ..` as a tree of pairs (vector shuffles, not a chain of 16 scalar steps).
    #[inline(always)]
    fn tree(mut x: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
        let mut w = LANES / 2;
        while w > 0 {
            for i in 0..w {
                x[i] = op(x[i], x[i + w]);
            }
            w /= 2;
        }
        x[0]
    }

    #[inline(always)]
    fn max_lanes(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
            }
        }
        for (l, &r) in rest.iter().enumerate() {
            acc[l] = if r > acc[l] { r } else { acc[l] };
        }
        tree(acc, |a, b| if b > a { b } else { a })
    }

    /// The factor the exp pass applies to the raw scores: `c` for `Mul(c)` with `c > 0` and no
    /// mask, whose scaling pass is skipped, 1 otherwise. The weights are the same bits either way:
    /// the exp pass computes `s · c − m` with the same two roundings, and for `c > 0` the max of
    /// the scaled row is `max(s) · c`.
    #[inline(always)]
    pub(crate) fn deferred_scale(scale: ScoreScale, masked: bool) -> f32 {
        match scale {
            ScoreScale::Mul(c) if !masked && c > 0.0 && c.is_finite() => c,
            _ => 1.0,
        }
    }

    /// Scores in place: `s · c` or `s / c`, plus the mask row; returns the row max of the scaled
    /// scores. A scale [`deferred_scale`] defers is not applied here (the row is only read).
    #[inline(always)]
    fn scale_mask_max_body(s: &mut [f32], mask: Option<&[f32]>, scale: ScoreScale) -> f32 {
        let pre = deferred_scale(scale, mask.is_some());
        if pre != 1.0 {
            return max_lanes(s) * pre;
        }
        match (scale, mask) {
            (ScoreScale::Mul(1.0), None) => {}
            (ScoreScale::Mul(c), None) => s.iter_mut().for_each(|x| *x *= c),
            (ScoreScale::Div(c), None) => s.iter_mut().for_each(|x| *x /= c),
            (ScoreScale::Mul(1.0), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x += m),
            (ScoreScale::Mul(c), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x * c + m),
            (ScoreScale::Div(c), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x / c + m),
        }
        max_lanes(s)
    }

    /// `s ← exp(s · pre − m)` (then rounded to `round`'s type, if any; `pre` is the
    /// [`deferred_scale`], 1 when the scores are scaled already: `s · 1` is `s`); returns the sum
    /// of the unrounded values.
    #[inline(always)]
    fn exp_sum_body<const FUSED: bool>(s: &mut [f32], pre: f32, m: f32, round: Option<Round>) -> f32 {
        #[inline(always)]
        fn go(s: &mut [f32], pre: f32, m: f32, exp: impl Fn(f32) -> f32, rnd: impl Fn(f32) -> f32) -> f32 {
            let mut acc = [0f32; LANES];
            let mut chunks = s.chunks_exact_mut(LANES);
            for c in &mut chunks {
                for l in 0..LANES {
                    let p = exp(c[l] * pre - m);
                    acc[l] += p;
                    c[l] = rnd(p);
                }
            }
            let rest = chunks.into_remainder();
            if !rest.is_empty() {
                // The tail as one chunk padded with -inf (weights 0), vectorised like the others.
                let mut p = [f32::NEG_INFINITY; LANES];
                p[..rest.len()].copy_from_slice(rest);
                for l in 0..LANES {
                    p[l] = exp(p[l] * pre - m);
                    acc[l] += p[l];
                }
                for (x, &p) in rest.iter_mut().zip(&p) {
                    *x = rnd(p);
                }
            }
            tree(acc, |a, b| a + b)
        }
        // Half precision rounds each weight: there the weights use the exact (libm) `exp` of
        // the reference path, so the rounded weights are the reference's (a last-bit
        // difference of the polynomial would move some by a whole half-precision step).
        match round {
            None => go(s, pre, m, exp::<FUSED>, |p| p),
            Some(Round::F16) => go(s, pre, m, f32::exp, round_f16),
            Some(Round::BF16) => go(s, pre, m, f32::exp, round_bf16),
        }
    }

    #[inline(always)]
    fn scale_body(x: &mut [f32], a: f32) {
        x.iter_mut().for_each(|v| *v *= a);
    }

    /// The row kernels of one instruction set.
    #[derive(Clone, Copy)]
    pub(crate) struct Ops {
        pub(crate) scale_mask_max: fn(&mut [f32], Option<&[f32]>, ScoreScale) -> f32,
        pub(crate) exp_sum: fn(&mut [f32], f32, f32, Option<Round>) -> f32,
        pub(crate) scale: fn(&mut [f32], f32),
        pub(crate) name: &'static str,
        /// Whether its `exp` uses fused multiply-adds (kernels that agree here give the same bits).
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) fused: bool,
    }

    macro_rules! isa {
        ($name:ident, $feat:literal) => {
            #[cfg(target_arch = "x86_64")]
            mod $name {
                use super::*;
                #[target_feature(enable = $feat)]
                unsafe fn scale_mask_max_tf(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                    scale_mask_max_body(s, m, c)
                }
                #[target_feature(enable = $feat)]
                unsafe fn exp_sum_tf(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                    exp_sum_body::<true>(s, pre, m, r)
                }
                #[target_feature(enable = $feat)]
                unsafe fn scale_tf(x: &mut [f32], a: f32) {
                    scale_body(x, a)
                }
                // SAFETY (all three): `ops()` hands these out only after detecting the features.
                fn scale_mask_max(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                    unsafe { scale_mask_max_tf(s, m, c) }
                }
                fn exp_sum(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                    unsafe { exp_sum_tf(s, pre, m, r) }
                }
                fn scale(x: &mut [f32], a: f32) {
                    unsafe { scale_tf(x, a) }
                }
                pub(super) const OPS: Ops = Ops {
                    scale_mask_max,
                    exp_sum,
                    scale,
                    name: stringify!($name),
                    fused: true,
                };
            }
        };
    }
    isa!(avx512, "avx512f,avx2,fma");
    isa!(avx2, "avx2,fma");

    mod portable {
        use super::*;
        fn scale_mask_max(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
            scale_mask_max_body(s, m, c)
        }
        fn exp_sum(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
            exp_sum_body::<PORTABLE_FUSED>(s, pre, m, r)
        }
        fn scale(x: &mut [f32], a: f32) {
            scale_body(x, a)
        }
        pub(super) const OPS: Ops = Ops {
            scale_mask_max,
            exp_sum,
            scale,
            name: "portable",
            fused: PORTABLE_FUSED,
        };
    }

    /// The best row kernels this CPU runs (detected once).
    pub(crate) fn ops() -> Ops {
        static OPS: std::sync::OnceLock<Ops> = std::sync::OnceLock::new();
        *OPS.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    return avx512::OPS;
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    return avx2::OPS;
                }
            }
            portable::OPS
        })
    }

    /// Every row-kernel set this CPU can run, best first (for tests).
    #[cfg(test)]
    pub(crate) fn all_ops() -> Vec<Ops> {
        let mut v = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(avx512::OPS);
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                v.push(avx2::OPS);
            }
        }
        v.push(portable::OPS);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::simd::{all_ops, exp, round_bf16, round_f16, Round};
    use super::{attention_on, tiles, Empty, Engine, ScoreScale};
    use candle_core::{DType, Device, Tensor};

    /// `softmax(q·kᵀ <scale> + mask)·v` in f64, row by row (an all-masked row: `empty`).
    fn naive(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: ScoreScale, empty: Empty) -> Vec<f64> {
        let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        let (q, k, v) = (f(q), f(k), f(v));
        let mask = mask.map(|m| m.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap());
        let mut out = vec![];
        for h in 0..q.len() {
            for (i, qi) in q[h].iter().enumerate() {
                let s: Vec<f64> = k[h]
                    .iter()
                    .enumerate()
                    .map(|(j, kj)| {
                        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                        let dot = match scale {
                            ScoreScale::Mul(c) => dot * c as f64,
                            ScoreScale::Div(c) => dot / c as f64,
                        };
                        dot + mask.as_ref().map_or(0.0, |m| m[i][j])
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = w.iter().sum();
                for c in 0..v[h][0].len() {
                    out.push(if max == f64::NEG_INFINITY {
                        if empty == Empty::Nan {
                            f64::NAN
                        } else {
                            0.0
                        }
                    } else {
                        w.iter().zip(&v[h]).map(|(w, vj)| w * vj[c]).sum::<f64>() / sum
                    });
                }
            }
        }
        out
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
        ];
        let mut engines = vec![Engine::Gemm];
        if tiles::available() {
            engines.push(Engine::Tiles);
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
        if !tiles::available() {
            return;
        }
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
            let (a, b) = (run(Engine::Gemm), run(Engine::Tiles));
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

    /// Values spread over every binade of f32 that matters here, plus edge cases.
    fn samples() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.99,
            65520.0,
            1e-8,
            6.0e-5,
            6.1035156e-5,
            3.0e-8,
        ];
        let mut x = 1.0e-9f32;
        while x < 1.0e6 {
            for m in [
                1.0f32,
                1.000_061,
                1.000_488_3,
                1.3,
                1.5,
                1.999_9,
                1.000_976_6,
                1.001_953_1,
            ] {
                v.push(x * m);
                v.push(-x * m);
            }
            x *= 1.37;
        }
        v
    }

    #[test]
    fn half_rounding_matches_candle_conversions() {
        let xs = samples();
        let t = Tensor::new(xs.as_slice(), &Device::Cpu).unwrap();
        for (dtype, f) in [(DType::F16, round_f16 as fn(f32) -> f32), (DType::BF16, round_bf16)] {
            let want = t
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for (x, w) in xs.iter().zip(&want) {
                assert_eq!(f(*x).to_bits(), w.to_bits(), "{dtype:?} {x:e}: {} vs {w}", f(*x));
            }
        }
        assert!(round_f16(f32::NAN).is_nan() && round_bf16(f32::NAN).is_nan());
        assert_eq!(round_f16(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        for exp in [exp::<true>, exp::<false>] {
            let mut x = -87.3f32;
            while x < 0.0 {
                let got = exp(x) as f64;
                let want = (x as f64).exp();
                let ulp = (want as f32).abs() * f32::EPSILON;
                assert!((got - want).abs() <= 2.0 * ulp as f64, "exp({x}) = {got} vs {want}");
                x += 0.0137;
            }
            assert_eq!(exp(0.0), 1.0);
            assert_eq!(exp(f32::NEG_INFINITY), 0.0);
            assert_eq!(exp(-100.0), 0.0);
            assert_eq!(exp(f32::INFINITY), f32::INFINITY);
            assert!(exp(f32::NAN).is_nan());
        }
    }

    /// Without a mask, `Mul(c)` is applied in the exp pass instead of a pass of its own: the
    /// weights, their sum and the row max are the same bits as scaling first.
    #[test]
    fn a_deferred_scale_gives_the_same_bits() {
        let s: Vec<f32> = Tensor::randn(0f32, 3., 999, &Device::Cpu).unwrap().to_vec1().unwrap();
        for ops in all_ops() {
            for c in [0.125f32, 0.3, 1.7] {
                for round in [None, Some(Round::F16), Some(Round::BF16)] {
                    let mut eager: Vec<f32> = s.iter().map(|x| x * c).collect();
                    let m_eager = (ops.scale_mask_max)(&mut eager, None, ScoreScale::Mul(1.0));
                    let sum_eager = (ops.exp_sum)(&mut eager, 1.0, m_eager, round);
                    let mut deferred = s.clone();
                    let m = (ops.scale_mask_max)(&mut deferred, None, ScoreScale::Mul(c));
                    assert_eq!(deferred, s, "{}: the scores were rewritten", ops.name);
                    let pre = super::simd::deferred_scale(ScoreScale::Mul(c), false);
                    assert_eq!(pre, c);
                    let sum = (ops.exp_sum)(&mut deferred, pre, m, round);
                    assert_eq!(m.to_bits(), m_eager.to_bits(), "{}", ops.name);
                    assert_eq!(sum.to_bits(), sum_eager.to_bits(), "{}", ops.name);
                    assert!(
                        deferred.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{}",
                        ops.name
                    );
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let n = 1000;
        let s: Vec<f32> = Tensor::randn(0f32, 3., n, &Device::Cpu).unwrap().to_vec1().unwrap();
        let mask: Vec<f32> = (0..n)
            .map(|i| if i % 7 == 0 { f32::NEG_INFINITY } else { 0.5 })
            .collect();
        let mut results = vec![];
        for ops in all_ops() {
            let mut r = vec![];
            for len in [n, 37, 16, 3] {
                for round in [None, Some(Round::F16), Some(Round::BF16)] {
                    for scale in [ScoreScale::Mul(0.3), ScoreScale::Div(1.7)] {
                        let mut x = s[..len].to_vec();
                        let m = (ops.scale_mask_max)(&mut x, Some(&mask[..len]), scale);
                        let sum = (ops.exp_sum)(&mut x, 1.0, m, round);
                        (ops.scale)(&mut x, 1.0 / sum);
                        r.push((
                            m.to_bits(),
                            sum.to_bits(),
                            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        ));
                    }
                }
            }
            results.push((ops.name, ops.fused, r));
        }
        // Kernels whose `exp` is fused alike give the same bits (the portable one is unfused on
        // x86 without FMA: its exp is within 2 ulp either way, tested above).
        for (name, fused, r) in &results[1..] {
            let same = results.iter().find(|(_, f, _)| f == fused).unwrap();
            assert!(r == &same.2, "{name} differs from {}", same.0);
        }
    }
}

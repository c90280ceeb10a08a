//! [`Engine::Tiles`](super::Engine::Tiles): the tile products of a task as register-tile
//! microkernels of our own ([`Isa`]: `12 × 32` with AVX-512, `6 × 16` with AVX2 + FMA, from
//! [`avx2`]), on K and V packed once per batch·head.
//!
//! A general GEMM packs its operands per call, so calling one per (query block, key block)
//! repacks every K and V block for every query block; here K is packed once per batch·head into
//! panels of `nr` keys (`(D, nr)` each, zero past `Lk`) and V into panels of `nr` channels
//! (`(Lk, nr)` each, zero past `Dv`), shared by all the query blocks of that head (a head that is
//! a single task packs its own into the worker's scratch). Per key block, a task:
//!
//! * forms the scores `S = Q·Kᵀ` one register tile at a time (`mr` query values of a channel
//!   broadcast, the `nr` keys two vector loads; 24 of AVX-512's 32 vector registers accumulate,
//!   12 of AVX2's 16), each `KC × nr` K panel slice staying in L1 while the task's micro-panels
//!   of `mr` query rows pass it (on AVX2 the query rows are copied interleaved, one sequential
//!   stream per micro-panel);
//! * turns each score row into weights (scale, mask, running max, `exp`, row sum: the row
//!   kernels of [`super::simd`], shared with the other engine);
//! * accumulates `O = α·O + P·V` one tile at a time the same way, `α` being the online-softmax
//!   rescaling of the row, applied to the output tile as it is loaded (AVX-512) or as the
//!   tile's sum is added to it (AVX2).
//!
//! A short last micro-panel uses a 4- or 8-row tile on AVX-512 (any height on AVX2). The next
//! panel slice is prefetched towards L2 a part per micro-panel. The output rows are accumulated
//! in the worker's scratch with a padded width and written to the output once, divided by their
//! sums.

use super::{simd, Dims, Inputs, Softmax};
use crate::cpu::isa::Isa;
use crate::cpu::microkernel::avx512::{self, MR};
use crate::cpu::microkernel::{avx2, prefetch, ALayout};
use crate::cpu::scratch::with_scratch;
use crate::cpu::{aligned, caches};
use std::mem::MaybeUninit;

/// Longest inner dimension of one tile product on `tile`: [`KC`] on AVX-512; on AVX2 a
/// `KC × 16` panel slice takes half of L1d (the CPU's reported size), in whole 32-channel steps.
pub(super) fn tile_depth(tile: Isa) -> usize {
    match tile {
        Isa::Avx2 => {
            static KC2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
            *KC2.get_or_init(|| (caches::sizes().0 / 2 / (avx2::NR * 4) / 32 * 32).clamp(64, 512))
        }
        _ => KC,
    }
}

/// Longest inner dimension of one tile product (channels of a score tile, keys of an output
/// tile): a `KC × NR` panel slice is 16 KiB, which stays in L1 (48 KiB) with the query or weight
/// rows of the micro-panels passing it. 256 (32 KiB) left too little room: measured on Zen 5 at
/// D = 512, each tile phase ran at 87 % of the microkernel's in-L1 speed, at 128 at 93 %.
pub(super) const KC: usize = 128;

/// `0..n` as `(start, len)` chunks of `kc`, the last one taking a remainder of up to `kc / 4`
/// (no tile pass over a handful of channels or keys).
pub(super) fn chunks(n: usize, kc: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let left = n - start;
        let len = if left <= kc + kc / 4 { left } else { kc };
        (len > 0).then(|| {
            start += len;
            (start - len, len)
        })
    })
}

/// One task: query rows `q0 .. q0 + o.len() / dv` of batch·head `bh`,
/// written into `o`. Per key block: the score tiles (each K panel slice stays in L1 while the
/// task's query micro-panels pass it), the softmax update of every row, then the output tiles
/// (each V panel slice in L1 while the weight micro-panels pass it), into the task's padded
/// output rows.
pub(super) fn task(inp: &Inputs, dims: &Dims, bh: usize, q0: usize, o: &mut [MaybeUninit<f32>]) {
    let lay = TaskLayout::new(dims, o.len() / dims.dv);
    let q = &inp.q[(bh * dims.lq + q0) * dims.d..][..lay.rows * dims.d];
    let sizes = lay.scratch_sizes(dims);
    // Each part on a cache line of its own (the tiles load and store 64 bytes at a time).
    with_scratch(aligned::lines_len(&sizes), |scratch| {
        let [own, row_max, qp, s, acc, alpha, mask_row] = aligned::split_lines(scratch, sizes);
        let head = HeadOperands::new(inp, dims, bh, own);
        let queries = QueryRows::copy(&lay, q, qp);
        alpha.fill(1.0);
        let mut softmax = Softmax::new(inp, dims, bh, lay.rows);
        // Where a row max is all the softmax needs first, the score tiles find it (16 lanes a row).
        let fuse_max = softmax.max_is_enough();
        for k0 in (0..dims.lk).step_by(lay.kb) {
            let block = (k0, lay.kb.min(dims.lk - k0));
            row_max.fill(f32::NEG_INFINITY);
            score_block(&lay, &queries, head.keys, block, s, fuse_max.then_some(&mut *row_max));
            for (r, srow) in s.chunks_exact_mut(lay.ld).take(lay.rows).enumerate() {
                let raw_max = fuse_max.then(|| simd::max_of(&row_max[r * 16..(r + 1) * 16]));
                alpha[r] = softmax.update_with_max(r, q0 + r, k0, &mut srow[..block.1], mask_row, raw_max);
            }
            value_block(&lay, &head, block, s, alpha, acc);
        }
        for (r, row) in o.chunks_exact_mut(dims.dv).enumerate() {
            avx512::store_scaled(&acc[r * lay.ldo..r * lay.ldo + dims.dv], softmax.factor(r), row);
        }
    })
}

/// The shape of one task's work: its register tile and blockings, and the strides of the query,
/// score and output rows in its scratch.
struct TaskLayout {
    tile: Isa,
    mr: usize,
    nr: usize,
    /// Longest inner dimension of one tile product ([`tile_depth`]).
    kc_max: usize,
    d: usize,
    /// Value channels rounded up to whole V panels.
    dv_p: usize,
    /// The task's query rows, and their micro-panels of `mr`.
    rows: usize,
    panels: usize,
    /// Keys per block.
    kb: usize,
    /// Stride of the score rows.
    ld: usize,
    /// Stride of the output rows.
    ldo: usize,
    /// Whether every micro-panel's query rows are copied interleaved (the AVX2 tile).
    interleave: bool,
    /// Stride of the copied query rows (not interleaved).
    ldq: usize,
    /// Query rows copied, from row `first_copied` on.
    copied: usize,
    first_copied: usize,
}

impl TaskLayout {
    fn new(dims: &Dims, rows: usize) -> Self {
        let (tile, d) = (dims.tile, dims.d);
        let (mr, nr) = (tile.mr(), tile.nr());
        let panels = rows.div_ceil(mr);
        let kb = dims.kv_block.min(dims.lk);
        // Query rows are read in place where they are under 2 KiB apart; further apart (D ≥ 512)
        // the rows of a micro-panel would crowd a few L1 sets, so they are copied with a padded
        // stride. A short last micro-panel is copied either way, zero-padded to whole tile rows.
        // The AVX2 tile reads every micro-panel interleaved instead (one sequential stream).
        let interleave = tile == Isa::Avx2;
        let copy_all = d >= 512 || interleave;
        TaskLayout {
            tile,
            mr,
            nr,
            kc_max: tile_depth(tile),
            d,
            dv_p: dims.dv_panels(),
            rows,
            panels,
            kb,
            // Score rows padded past a multiple of 16 lanes so the rows of a micro-panel do not
            // share cache sets.
            ld: kb.div_ceil(nr) * nr + 16,
            // Output rows padded likewise: at Dv = 512 unpadded rows 2 KiB apart would put a
            // whole column of output tiles into four L1 sets.
            ldo: dims.dv_panels() + 16,
            interleave,
            ldq: if copy_all && !interleave {
                d.div_ceil(16) * 16 + 16
            } else {
                d
            },
            copied: if copy_all { panels * mr } else { mr },
            first_copied: if copy_all { 0 } else { (panels - 1) * mr },
        }
    }

    /// Floats of the task's scratch, part by part: the head's own packed operands (none where
    /// [`Dims::shares_packing`]), the row-max lanes, the copied query rows, the score rows, the
    /// output rows, the rows' `α`, a mask row.
    fn scratch_sizes(&self, dims: &Dims) -> [usize; 7] {
        let rows = self.panels * self.mr;
        [
            if dims.shares_packing() { 0 } else { dims.packed_len() },
            rows * 16,
            self.copied * self.ldq,
            rows * self.ld,
            rows * self.ldo,
            rows,
            self.kb,
        ]
    }
}

/// One head's K and V as the tile products read them: K panels, and V panels or V in place.
struct HeadOperands<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    /// Key `j` of V panel `cp` starts at `cp · panel + j · ldv`.
    ldv: usize,
    panel: usize,
    values_in_place: bool,
}

impl<'a> HeadOperands<'a> {
    /// Batch·head `bh`'s operands: shared ones from `inp`, or packed here into `own` (the task's
    /// scratch) where the head is a single task.
    fn new(inp: &Inputs<'a>, dims: &Dims, bh: usize, own: &'a mut [f32]) -> Self {
        let Dims { lk, d, dv, .. } = *dims;
        let v_raw = &inp.v[bh * lk * dv..][..lk * dv];
        let packed: &[f32] = if dims.shares_packing() {
            &inp.k[bh * dims.packed_len()..][..dims.packed_len()]
        } else {
            pack_head(&inp.k[bh * lk * d..][..lk * d], v_raw, dims, own);
            own
        };
        let (keys, packed_values) = packed.split_at(dims.lk_panels() * d);
        let values_in_place = dims.values_in_place();
        let nr = dims.tile.nr();
        let (values, ldv, panel) = if values_in_place {
            (v_raw, dv, nr)
        } else {
            (packed_values, nr, lk * nr)
        };
        HeadOperands {
            keys,
            values,
            ldv,
            panel,
            values_in_place,
        }
    }
}

/// The task's query rows as the score tiles read them: in place, or copied into its scratch
/// (padded rows, or interleaved micro-panels).
struct QueryRows<'a> {
    lay: &'a TaskLayout,
    q: &'a [f32],
    copy: &'a [f32],
}

impl<'a> QueryRows<'a> {
    /// The rows `q` (`rows × D`), copied into `copy` as `lay` says.
    fn copy(lay: &'a TaskLayout, q: &'a [f32], copy: &'a mut [f32]) -> Self {
        let d = lay.d;
        if lay.interleave {
            interleave_rows((q, lay.rows, d), d, lay.mr, copy);
        } else {
            for (r, dst) in copy.chunks_exact_mut(lay.ldq).enumerate() {
                let i = lay.first_copied + r;
                match q.get(i * d..(i + 1) * d) {
                    Some(src) => dst[..d].copy_from_slice(src),
                    None => dst[..d].fill(0.0),
                }
            }
        }
        QueryRows { lay, q, copy }
    }

    /// The query rows of micro-panel `mp` from channel `p0` on.
    #[inline]
    fn at(&self, mp: usize, p0: usize) -> (&'a [f32], ALayout) {
        let TaskLayout { mr, d, ldq, .. } = *self.lay;
        if self.lay.interleave {
            (&self.copy[(mp * d + p0) * mr..], ALayout::Interleaved)
        } else if mp * mr >= self.lay.first_copied {
            (
                &self.copy[(mp * mr - self.lay.first_copied) * ldq + p0..],
                ALayout::Rows(ldq),
            )
        } else {
            (&self.q[mp * mr * d + p0..], ALayout::Rows(d))
        }
    }
}

/// `S = Q · K_blkᵀ` for the key block `(k0, n)`, KC channels at a time, into the score rows `s`;
/// with `row_max`, the last channel chunk also folds each score row into its 16 max lanes.
#[inline]
fn score_block(
    lay: &TaskLayout,
    queries: &QueryRows,
    kp: &[f32],
    (k0, n): (usize, usize),
    s: &mut [f32],
    mut row_max: Option<&mut [f32]>,
) {
    let TaskLayout {
        mr, nr, d, panels, ld, ..
    } = *lay;
    for (p0, kc) in chunks(d, lay.kc_max) {
        let last = p0 + kc == d;
        for jp in 0..n.div_ceil(nr) {
            let k_pan = &kp[((k0 / nr + jp) * d + p0) * nr..][..kc * nr];
            // The next panel slice, fetched a part per micro-panel while this one runs.
            let next = kp.get(((k0 / nr + jp + 1) * d + p0) * nr..).unwrap_or(&[]);
            for mp in 0..panels {
                prefetch(next, mp, panels, kc * nr);
                let s_tile = &mut s[mp * mr * ld + jp * nr..];
                let rows = mr.min(lay.rows - mp * mr);
                let max = row_max.as_deref_mut().filter(|_| last).map(|lanes| RowMax {
                    lanes: &mut lanes[mp * mr * 16..],
                    keys: nr.min(n - jp * nr),
                });
                let q = queries.at(mp, p0);
                score_tile(lay.tile, rows, q, k_pan, kc, (s_tile, ld), p0 > 0, max);
            }
        }
    }
}

/// `O = α·O + P · V_blk` for the key block `(k0, n)`, KC keys at a time: the weights in the score
/// rows `s`, the output rows in `acc`, `α` per row (applied by the first chunk of a block after
/// the first; the first block starts the rows).
#[inline]
fn value_block(
    lay: &TaskLayout,
    head: &HeadOperands,
    (k0, n): (usize, usize),
    s: &[f32],
    alpha: &[f32],
    acc: &mut [f32],
) {
    let TaskLayout {
        mr,
        nr,
        panels,
        ld,
        ldo,
        ..
    } = *lay;
    let (vp, ldv, panel) = (head.values, head.ldv, head.panel);
    let ones = [1f32; MR];
    for (j0, nc) in chunks(n, lay.kc_max) {
        for cp in 0..lay.dv_p / nr {
            let v_pan = &vp[cp * panel + (k0 + j0) * ldv..][..(nc - 1) * ldv + nr];
            let next = vp.get((cp + 1) * panel + (k0 + j0) * ldv..).unwrap_or(&[]);
            for mp in 0..panels {
                if !head.values_in_place {
                    prefetch(next, mp, panels, nc * nr);
                }
                let init = match (k0, j0) {
                    (0, 0) => None,
                    (_, 0) => Some(&alpha[mp * mr..]),
                    _ => Some(&ones[..]),
                };
                let p_tile = (&s[mp * mr * ld + j0..], ALayout::Rows(ld));
                let o_tile = &mut acc[mp * mr * ldo + cp * nr..];
                let p = (mr.min(lay.rows - mp * mr), p_tile, nc);
                value_tile(lay.tile, p, (v_pan, ldv), (o_tile, ldo), init);
            }
        }
    }
}

/// One head's operands for the microkernels into `dst` ([`Dims::packed_len`] floats): K panels
/// (`⌈Lk/NR⌉·D·NR`), then V panels (`⌈Dv/NR⌉·Lk·NR`) unless [`Dims::values_in_place`].
pub(super) fn pack_head(k: &[f32], v: &[f32], dims: &Dims, dst: &mut [f32]) {
    let (kp, vp) = dst.split_at_mut(dims.lk_panels() * dims.d);
    pack_keys(dims.tile, k, dims.lk, dims.d, kp);
    if !dims.values_in_place() {
        pack_values(dims.tile, v, dims.lk, dims.dv, 0, vp);
    }
}

/// [`pack_head`] for every batch·head (`k`, `v` and `dst` hold them one after the other), in
/// parallel over heads and over groups of panels within a head, so that a call with fewer
/// heads than threads (the single-head VAE attention) does not pack on one thread.
pub(super) fn pack_heads(k: &[f32], v: &[f32], dims: &Dims, dst: &mut [f32]) {
    use rayon::prelude::*;
    let Dims { lk, d, dv, tile, .. } = *dims;
    let nr = tile.nr();
    // About 64 KiB of packed output per job.
    let group = |panel: usize| (16384 / panel.max(1)).max(1);
    let kg = group(d * nr);
    let vg = group(lk * nr);
    dst.par_chunks_mut(dims.packed_len())
        .zip(k.par_chunks(lk * d).zip(v.par_chunks(lk * dv)))
        .for_each(|(dst, (k, v))| {
            let (kp, vp) = dst.split_at_mut(dims.lk_panels() * d);
            let keys = || {
                kp.par_chunks_mut(kg * d * nr).enumerate().for_each(|(g, out)| {
                    let j0 = g * kg * nr;
                    pack_keys(tile, &k[j0 * d..], (kg * nr).min(lk - j0), d, out);
                })
            };
            let values = || {
                if !dims.values_in_place() {
                    let groups = vp.par_chunks_mut(vg * lk * nr).enumerate();
                    groups.for_each(|(g, out)| pack_values(tile, v, lk, dv, g * vg, out));
                }
            };
            rayon::join(keys, values);
        });
}

/// `K` of one batch·head, `(Lk, D)` row-major, into the tile's key panels `(D, nr)`: `dst`
/// holds `⌈Lk/nr⌉·D·nr` values, keys past `Lk` zero.
fn pack_keys(tile: Isa, k: &[f32], lk: usize, d: usize, dst: &mut [f32]) {
    if tile == Isa::Avx2 {
        return avx2::pack_keys(k, lk, d, dst);
    }
    avx512::pack_keys(k, lk, d, dst)
}

/// `V` of one batch·head, `(Lk, Dv)` row-major, into the tile's channel panels `(Lk, nr)` from
/// panel `first` on: `dst` holds whole panels (`Lk·nr` values each), at most up to the last,
/// channels past `Dv` zero.
fn pack_values(tile: Isa, v: &[f32], lk: usize, dv: usize, first: usize, dst: &mut [f32]) {
    if tile == Isa::Avx2 {
        return avx2::pack_values(v, lk, dv, first, dst);
    }
    avx512::pack_values(v, lk, dv, first, dst)
}

/// The first `n` columns of the `rows` rows of `x` (row-major, rows `ld` apart) as micro-panels
/// of `mr` rows interleaved into `dst` (`[mp][j][r]`: `⌈rows/mr⌉·mr·n` values), rows past the
/// last zero.
fn interleave_rows((x, rows, ld): (&[f32], usize, usize), n: usize, mr: usize, dst: &mut [f32]) {
    for (mp, panel) in dst.chunks_exact_mut(mr * n).take(rows.div_ceil(mr)).enumerate() {
        for r in 0..mr {
            let i = mp * mr + r;
            if i < rows {
                let src = &x[i * ld..i * ld + n];
                src.iter().enumerate().for_each(|(j, &v)| panel[j * mr + r] = v);
            } else {
                (0..n).for_each(|j| panel[j * mr + r] = 0.0);
            }
        }
    }
}

/// Running row maxima of score tiles: 16 lanes per tile row (`lanes[r·16 ..]`, folded by
/// [`simd::max_of`]), over the first `keys` columns of the tile (the rest are padding).
pub(super) struct RowMax<'a> {
    pub(super) lanes: &'a mut [f32],
    pub(super) keys: usize,
}

/// One score tile: `s[r·ld + c] (+)= Σ_p q[r·ldq + p] · kp[p·nr + c]` for the query rows of a
/// micro-panel (`rows`; on AVX-512 [`avx512::tile_rows`]`(rows)` are read and written) and the
/// `nr` keys of a K panel slice, over `kc` channels (added to the tile when `accumulate`, by
/// continuing the chain from the stored values); with `max`, the tile's rows are also folded
/// into those running maxima as they are stored.
#[allow(clippy::too_many_arguments)]
fn score_tile(
    tile: Isa,
    rows: usize,
    (q, layout): (&[f32], ALayout),
    kp: &[f32],
    kc: usize,
    (s, ld): (&mut [f32], usize),
    accumulate: bool,
    max: Option<RowMax>,
) {
    let max = max.map(|m| (m.lanes, m.keys));
    if tile == Isa::Avx2 {
        let write = if accumulate {
            avx2::Write::Continue
        } else {
            avx2::Write::Store
        };
        return avx2::attention_tile(rows, (q, layout), kc, (kp, avx2::NR), (s, ld), write, max);
    }
    let ALayout::Rows(ldq) = layout else {
        unreachable!("AVX-512 score tiles read query rows")
    };
    avx512::score_tile(rows, (q, ldq), kp, kc, (s, ld), accumulate, max)
}

/// One output tile: `o[r·ldo + c] = init[r]·o[r·ldo + c] + Σ_j p[r·ld + j] · vp[j·ldv + c]` (the
/// sum formed from zero and added with one rounding: blocked over the calls) for the rows of a
/// weight micro-panel `(rows, p, ld, n)` (on AVX-512 [`avx512::tile_rows`]`(rows)` are read and
/// written) and the `nr` channels of a V panel slice, over `n` keys (`init` `None`: the `o` term
/// left out).
fn value_tile(
    tile: Isa,
    (rows, (p, layout), n): (usize, (&[f32], ALayout), usize),
    (vp, ldv): (&[f32], usize),
    (o, ldo): (&mut [f32], usize),
    init: Option<&[f32]>,
) {
    if tile == Isa::Avx2 {
        let write = init.map_or(avx2::Write::Store, avx2::Write::Rescale);
        return avx2::attention_tile(rows, (p, layout), n, (vp, ldv), (o, ldo), write, None);
    }
    let ALayout::Rows(ld) = layout else {
        unreachable!("AVX-512 output tiles read weight rows")
    };
    avx512::value_tile((rows, p, ld, n), (vp, ldv), (o, ldo), init)
}

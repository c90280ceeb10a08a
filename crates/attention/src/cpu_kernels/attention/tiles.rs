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
use crate::cpu::caches;
use crate::cpu::isa::Isa;
use crate::cpu::microkernel::avx512::{self, MR};
use crate::cpu::microkernel::{avx2, prefetch, ALayout};
use crate::cpu::scratch::with_scratch;
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
    let Dims {
        lq,
        lk,
        d,
        dv,
        kv_block,
        ..
    } = *dims;
    let tile = dims.tile;
    let (mr, nr, kc_max) = (tile.mr(), tile.nr(), tile_depth(tile));
    let (lk_p, dv_p) = (dims.lk_panels(), dims.dv_panels());
    // Output rows padded past a multiple of 16 lanes: at Dv = 512 unpadded rows 2 KiB apart
    // would put a whole column of output tiles into four L1 sets.
    let ldo = dv_p + 16;
    let rows = o.len() / dv;
    let panels = rows.div_ceil(mr);
    let q = &inp.q[(bh * lq + q0) * d..][..rows * d];
    let kb = kv_block.min(lk);
    // Score rows padded past a multiple of 16 lanes so the rows of a micro-panel do not share
    // cache sets.
    let ld = kb.div_ceil(nr) * nr + 16;
    let in_place = dims.values_in_place();
    let own = if dims.shares_packing() { 0 } else { dims.packed_len() };
    // Query rows are read in place where they are under 2 KiB apart; further apart (D ≥ 512) the
    // rows of a micro-panel would crowd a few L1 sets, so they are copied with a padded stride.
    // A short last micro-panel is copied either way, zero-padded to whole tile rows.
    // The AVX2 tile reads every micro-panel interleaved instead (one sequential stream).
    let interleave = tile == Isa::Avx2;
    let copy_all = d >= 512 || interleave;
    let ldq = if interleave {
        d
    } else if copy_all {
        d.div_ceil(16) * 16 + 16
    } else {
        d
    };
    let copied = if copy_all { panels * mr } else { mr };
    let sizes = [
        own,
        panels * mr * 16,
        copied * ldq,
        panels * mr * ld,
        panels * mr * ldo,
        panels * mr,
        kb,
    ];
    with_scratch(sizes.iter().sum(), |scratch| {
        let (own, rest) = scratch.split_at_mut(sizes[0]);
        let v_raw = &inp.v[bh * lk * dv..][..lk * dv];
        let packed: &[f32] = if dims.shares_packing() {
            &inp.k[bh * dims.packed_len()..][..dims.packed_len()]
        } else {
            pack_head(&inp.k[bh * lk * d..][..lk * d], v_raw, dims, own);
            own
        };
        let (kp, vp) = packed.split_at(lk_p * d);
        let vp = if in_place { v_raw } else { vp };
        // Key `j` of V panel `cp` starts at `cp · panel + j · ldv`.
        let (ldv, panel) = if in_place { (dv, nr) } else { (nr, lk * nr) };
        let (row_max, rest) = rest.split_at_mut(sizes[1]);
        let (qp, rest) = rest.split_at_mut(sizes[2]);
        let (s, rest) = rest.split_at_mut(sizes[3]);
        let (acc, rest) = rest.split_at_mut(sizes[4]);
        let (alpha, mask_row) = rest.split_at_mut(sizes[5]);
        let first_copied = if copy_all { 0 } else { (panels - 1) * mr };
        if interleave {
            interleave_rows((q, rows, d), d, mr, qp);
        } else {
            for (r, dst) in qp.chunks_exact_mut(ldq).enumerate() {
                match q.get((first_copied + r) * d..(first_copied + r + 1) * d) {
                    Some(src) => dst[..d].copy_from_slice(src),
                    None => dst[..d].fill(0.0),
                }
            }
        }
        // The query rows of micro-panel `mp` from channel `p0` on.
        let q_rows = |mp: usize, p0: usize| -> (&[f32], ALayout) {
            if interleave {
                (&qp[(mp * d + p0) * mr..], ALayout::Interleaved)
            } else if mp * mr >= first_copied {
                (&qp[(mp * mr - first_copied) * ldq + p0..], ALayout::Rows(ldq))
            } else {
                (&q[mp * mr * d + p0..], ALayout::Rows(d))
            }
        };
        alpha.fill(1.0);
        let ones = [1f32; MR];
        let mut softmax = Softmax::new(inp, dims, bh, rows);
        // Where a row max is all the softmax needs first, the score tiles find it (16 lanes a row).
        let fuse_max = softmax.max_is_enough();
        for k0 in (0..lk).step_by(kb) {
            let n = kb.min(lk - k0);
            row_max.fill(f32::NEG_INFINITY);
            // S = Q · K_blkᵀ, KC channels at a time.
            for (p0, kc) in chunks(d, kc_max) {
                let last = p0 + kc == d;
                for jp in 0..n.div_ceil(nr) {
                    let k_pan = &kp[((k0 / nr + jp) * d + p0) * nr..][..kc * nr];
                    // The next panel slice, fetched a part per micro-panel while this one runs.
                    let next = kp.get(((k0 / nr + jp + 1) * d + p0) * nr..).unwrap_or(&[]);
                    for mp in 0..panels {
                        prefetch(next, mp, panels, kc * nr);
                        let s_tile = &mut s[mp * mr * ld + jp * nr..];
                        let rows = mr.min(rows - mp * mr);
                        let max = (fuse_max && last).then(|| RowMax {
                            lanes: &mut row_max[mp * mr * 16..],
                            keys: nr.min(n - jp * nr),
                        });
                        let q = q_rows(mp, p0);
                        score_tile(tile, rows, q, k_pan, kc, (s_tile, ld), p0 > 0, max);
                    }
                }
            }
            for (r, srow) in s.chunks_exact_mut(ld).take(rows).enumerate() {
                let raw_max = fuse_max.then(|| simd::max_of(&row_max[r * 16..(r + 1) * 16]));
                alpha[r] = softmax.update_with_max(r, q0 + r, k0, &mut srow[..n], mask_row, raw_max);
            }
            // O = α·O + P · V_blk, KC keys at a time.
            for (j0, nc) in chunks(n, kc_max) {
                for cp in 0..dv_p / nr {
                    let v_pan = &vp[cp * panel + (k0 + j0) * ldv..][..(nc - 1) * ldv + nr];
                    let next = vp.get((cp + 1) * panel + (k0 + j0) * ldv..).unwrap_or(&[]);
                    for mp in 0..panels {
                        if !in_place {
                            prefetch(next, mp, panels, nc * nr);
                        }
                        let init = match (k0, j0) {
                            (0, 0) => None,
                            (_, 0) => Some(&alpha[mp * mr..]),
                            _ => Some(&ones[..]),
                        };
                        let p_tile = (&s[mp * mr * ld + j0..], ALayout::Rows(ld));
                        let o_tile = &mut acc[mp * mr * ldo + cp * nr..];
                        let p = (mr.min(rows - mp * mr), p_tile, nc);
                        value_tile(tile, p, (v_pan, ldv), (o_tile, ldo), init);
                    }
                }
            }
        }
        for (r, row) in o.chunks_exact_mut(dv).enumerate() {
            avx512::store_scaled(&acc[r * ldo..r * ldo + dv], softmax.factor(r), row);
        }
    })
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

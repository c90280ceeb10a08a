//! [`Engine::Tiles`](super::Engine::Tiles): the tile products of a task as AVX-512
//! microkernels of our own, on K and V packed once per batch·head.
//!
//! A general GEMM packs its operands per call, so calling one per (query block, key block)
//! repacks every K and V block for every query block; here K is packed once per batch·head into
//! panels of [`NR`] keys (`(D, NR)` each, zero past `Lk`) and V into panels of [`NR`] channels
//! (`(Lk, NR)` each, zero past `Dv`), shared by all the query blocks of that head (a head that is
//! a single task packs its own into the worker's scratch). Per key block, a task:
//!
//! * forms the scores `S = Q·Kᵀ` one `12 × 32` register tile at a time (24 of the 32 vector
//!   registers accumulate; the 12 query values of a channel are broadcast, the 32 keys are two
//!   vector loads), each `KC × NR` K panel slice staying in L1 while the task's micro-panels of
//!   [`MR`] query rows pass it;
//! * turns each score row into weights (scale, mask, running max, `exp`, row sum: the row
//!   kernels of [`super::simd`], shared with the other engine);
//! * accumulates `O = α·O + P·V` one `12 × 32` tile at a time the same way, `α` being the
//!   online-softmax rescaling of the row, applied as the output tile is loaded.
//!
//! A short last micro-panel uses a 4- or 8-row tile. The next panel slice is prefetched towards
//! L2 a part per micro-panel. The output rows are accumulated in the worker's scratch with a
//! padded width and written to the output once, divided by their sums.

use super::{simd, with_scratch, Dims, Inputs, Softmax};
use std::mem::MaybeUninit;

/// Query rows per micro-panel (register tile rows).
pub(super) const MR: usize = 12;
/// Keys per K panel and channels per V panel (register tile columns: two 16-lane vectors).
pub(super) const NR: usize = 32;
/// Longest inner dimension of one tile product (channels of a score tile, keys of an output
/// tile): a `KC × NR` panel slice is 16 KiB, which stays in L1 (48 KiB) with the query or weight
/// rows of the micro-panels passing it. 256 (32 KiB) left too little room: measured on Zen 5 at
/// D = 512, each tile phase ran at 87 % of the microkernel's in-L1 speed, at 128 at 93 %.
pub(super) const KC: usize = 128;

/// `0..n` as `(start, len)` chunks of [`KC`], the last one taking a remainder of up to `KC / 4`
/// (no tile pass over a handful of channels or keys).
pub(super) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let left = n - start;
        let len = if left <= KC + KC / 4 { left } else { KC };
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
    let (lk_p, dv_p) = (dims.lk_panels(), dims.dv_panels());
    // Output rows padded past a multiple of 16 lanes: at Dv = 512 unpadded rows 2 KiB apart
    // would put a whole column of output tiles into four L1 sets.
    let ldo = dv_p + 16;
    let rows = o.len() / dv;
    let panels = rows.div_ceil(MR);
    let q = &inp.q[(bh * lq + q0) * d..][..rows * d];
    let kb = kv_block.min(lk);
    // Score rows padded past a multiple of 16 lanes so the rows of a micro-panel do not share
    // cache sets.
    let ld = kb.div_ceil(NR) * NR + 16;
    let in_place = dims.values_in_place();
    let own = if dims.shares_packing() { 0 } else { dims.packed_len() };
    // Query rows are read in place where they are under 2 KiB apart; further apart (D ≥ 512) the
    // rows of a micro-panel would crowd a few L1 sets, so they are copied with a padded stride.
    // A short last micro-panel is copied either way, zero-padded to whole tile rows.
    let copy_all = d >= 512;
    let ldq = if copy_all { d.div_ceil(16) * 16 + 16 } else { d };
    let copied = if copy_all { panels * MR } else { MR };
    let sizes = [
        own,
        panels * MR * 16,
        copied * ldq,
        panels * MR * ld,
        panels * MR * ldo,
        panels * MR,
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
        let (ldv, panel) = if in_place { (dv, NR) } else { (NR, lk * NR) };
        let (row_max, rest) = rest.split_at_mut(sizes[1]);
        let (qp, rest) = rest.split_at_mut(sizes[2]);
        let (s, rest) = rest.split_at_mut(sizes[3]);
        let (acc, rest) = rest.split_at_mut(sizes[4]);
        let (alpha, mask_row) = rest.split_at_mut(sizes[5]);
        let first_copied = if copy_all { 0 } else { (panels - 1) * MR };
        for (r, dst) in qp.chunks_exact_mut(ldq).enumerate() {
            match q.get((first_copied + r) * d..(first_copied + r + 1) * d) {
                Some(src) => dst[..d].copy_from_slice(src),
                None => dst[..d].fill(0.0),
            }
        }
        // The query rows of micro-panel `mp`, `ldq` apart.
        let q_rows = |mp: usize| -> &[f32] {
            if mp * MR >= first_copied {
                &qp[(mp * MR - first_copied) * ldq..]
            } else {
                &q[mp * MR * d..]
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
            for (p0, kc) in chunks(d) {
                let last = p0 + kc == d;
                for jp in 0..n.div_ceil(NR) {
                    let k_pan = &kp[((k0 / NR + jp) * d + p0) * NR..][..kc * NR];
                    // The next panel slice, fetched a part per micro-panel while this one runs.
                    let next = kp.get(((k0 / NR + jp + 1) * d + p0) * NR..).unwrap_or(&[]);
                    for mp in 0..panels {
                        prefetch(next, mp, panels, kc * NR);
                        let s_tile = &mut s[mp * MR * ld + jp * NR..];
                        let mr = MR.min(rows - mp * MR);
                        let max = (fuse_max && last).then(|| RowMax {
                            lanes: &mut row_max[mp * MR * 16..],
                            keys: NR.min(n - jp * NR),
                        });
                        score_tile(mr, &q_rows(mp)[p0..], ldq, k_pan, kc, s_tile, ld, p0 > 0, max);
                    }
                }
            }
            for (r, srow) in s.chunks_exact_mut(ld).take(rows).enumerate() {
                let raw_max = fuse_max.then(|| simd::max_of(&row_max[r * 16..(r + 1) * 16]));
                alpha[r] = softmax.update_with_max(r, q0 + r, k0, &mut srow[..n], mask_row, raw_max);
            }
            // O = α·O + P · V_blk, KC keys at a time.
            for (j0, nc) in chunks(n) {
                for cp in 0..dv_p / NR {
                    let v_pan = &vp[cp * panel + (k0 + j0) * ldv..][..(nc - 1) * ldv + NR];
                    let next = vp.get((cp + 1) * panel + (k0 + j0) * ldv..).unwrap_or(&[]);
                    for mp in 0..panels {
                        if !in_place {
                            prefetch(next, mp, panels, nc * NR);
                        }
                        let init = match (k0, j0) {
                            (0, 0) => None,
                            (_, 0) => Some(&alpha[mp * MR..]),
                            _ => Some(&ones[..]),
                        };
                        let p_tile = &s[mp * MR * ld + j0..];
                        let o_tile = &mut acc[mp * MR * ldo + cp * NR..];
                        let tile = (MR.min(rows - mp * MR), p_tile, ld, nc);
                        value_tile(tile, v_pan, ldv, o_tile, ldo, init);
                    }
                }
            }
        }
        for (r, row) in o.chunks_exact_mut(dv).enumerate() {
            store_scaled(&acc[r * ldo..r * ldo + dv], softmax.factor(r), row);
        }
    })
}

/// One head's operands for the microkernels into `dst` ([`Dims::packed_len`] floats): K panels
/// (`⌈Lk/NR⌉·D·NR`), then V panels (`⌈Dv/NR⌉·Lk·NR`) unless [`Dims::values_in_place`].
pub(super) fn pack_head(k: &[f32], v: &[f32], dims: &Dims, dst: &mut [f32]) {
    let (kp, vp) = dst.split_at_mut(dims.lk_panels() * dims.d);
    pack_keys(k, dims.lk, dims.d, kp);
    if !dims.values_in_place() {
        pack_values(v, dims.lk, dims.dv, 0, vp);
    }
}

/// [`pack_head`] for every batch·head (`k`, `v` and `dst` hold them one after the other), in
/// parallel over heads and over groups of panels within a head, so that a call with fewer
/// heads than threads (the single-head VAE attention) does not pack on one thread.
pub(super) fn pack_heads(k: &[f32], v: &[f32], dims: &Dims, dst: &mut [f32]) {
    use rayon::prelude::*;
    let Dims { lk, d, dv, .. } = *dims;
    // About 64 KiB of packed output per job.
    let group = |panel: usize| (16384 / panel.max(1)).max(1);
    let kg = group(d * NR);
    let vg = group(lk * NR);
    dst.par_chunks_mut(dims.packed_len())
        .zip(k.par_chunks(lk * d).zip(v.par_chunks(lk * dv)))
        .for_each(|(dst, (k, v))| {
            let (kp, vp) = dst.split_at_mut(dims.lk_panels() * d);
            let keys = || {
                kp.par_chunks_mut(kg * d * NR).enumerate().for_each(|(g, out)| {
                    let j0 = g * kg * NR;
                    pack_keys(&k[j0 * d..], (kg * NR).min(lk - j0), d, out);
                })
            };
            let values = || {
                if !dims.values_in_place() {
                    let groups = vp.par_chunks_mut(vg * lk * NR).enumerate();
                    groups.for_each(|(g, out)| pack_values(v, lk, dv, g * vg, out));
                }
            };
            rayon::join(keys, values);
        });
}

/// Whether this CPU runs the microkernels (AVX-512F, detected once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX512.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `K` of one batch·head, `(Lk, D)` row-major, into NR-key panels `(D, NR)`: `dst` holds
/// `⌈Lk/NR⌉·D·NR` values, keys past `Lk` zero.
pub(super) fn pack_keys(k: &[f32], lk: usize, d: usize, dst: &mut [f32]) {
    assert!(k.len() >= lk * d && dst.len() == lk.div_ceil(NR) * d * NR);
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected; the assert bounds every access.
        unsafe { avx512::pack_keys(k.as_ptr(), lk, d, dst.as_mut_ptr()) };
        return;
    }
    unreachable!("tiles::pack_keys without AVX-512 (callers check `available`)")
}

/// `V` of one batch·head, `(Lk, Dv)` row-major, into NR-channel panels `(Lk, NR)` from panel
/// `first` on: `dst` holds whole panels (`Lk·NR` values each), at most up to the last,
/// channels past `Dv` zero.
pub(super) fn pack_values(v: &[f32], lk: usize, dv: usize, first: usize, dst: &mut [f32]) {
    let panels = dst.len() / (lk * NR);
    assert!(v.len() >= lk * dv && dst.len() == panels * lk * NR && first + panels <= dv.div_ceil(NR));
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected (the body is safe code compiled for it).
        unsafe { avx512::pack_values(v, lk, dv, first, dst) };
        return;
    }
    unreachable!("tiles::pack_values without AVX-512 (callers check `available`)")
}

/// `dst = src · f` (an output row from its accumulator).
pub(super) fn store_scaled(src: &[f32], f: f32, dst: &mut [std::mem::MaybeUninit<f32>]) {
    assert!(src.len() == dst.len());
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected (the body is safe code compiled for it).
        unsafe { avx512::store_scaled(src, f, dst) };
        return;
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(x * f);
    }
}

/// Register-tile rows for a micro-panel of `rows` (1 ..= [`MR`]) query rows: 4, 8 or 12, so a
/// short last micro-panel costs a third or two thirds of a full one.
pub(super) fn tile_rows(rows: usize) -> usize {
    assert!((1..=MR).contains(&rows));
    rows.div_ceil(4) * 4
}

/// Running row maxima of score tiles: 16 lanes per tile row (`lanes[r·16 ..]`, folded by
/// [`simd::max_of`]), over the first `keys` columns of the tile (the rest are padding).
pub(super) struct RowMax<'a> {
    pub(super) lanes: &'a mut [f32],
    pub(super) keys: usize,
}

/// One score tile: `s[r·ld + c] (+)= Σ_p q[r·ldq + p] · kp[p·NR + c]` for the
/// [`tile_rows`]`(rows)` query rows of a micro-panel and the `NR` keys of a K panel slice, over
/// `kc` channels (added to the tile when `accumulate`); with `max`, the tile's rows are also
/// folded into those running maxima as they are stored.
#[allow(clippy::too_many_arguments)]
pub(super) fn score_tile(
    rows: usize,
    q: &[f32],
    ldq: usize,
    kp: &[f32],
    kc: usize,
    s: &mut [f32],
    ld: usize,
    accumulate: bool,
    max: Option<RowMax>,
) {
    let r = tile_rows(rows);
    assert!(kc > 0 && ldq >= kc && q.len() >= (r - 1) * ldq + kc && kp.len() >= kc * NR);
    assert!(ld >= NR && s.len() >= (r - 1) * ld + NR);
    assert!(max
        .as_ref()
        .is_none_or(|m| m.lanes.len() >= r * 16 && (1..=NR).contains(&m.keys)));
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (q, kp, s) = (q.as_ptr(), kp.as_ptr(), s.as_mut_ptr());
        let max = max.map(|m| (m.lanes.as_mut_ptr(), m.keys));
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            match r {
                4 => avx512::score_tile::<4, false>(q, ldq, kp, kc, s, ld, accumulate, max),
                8 => avx512::score_tile::<8, false>(q, ldq, kp, kc, s, ld, accumulate, max),
                _ => avx512::score_tile::<MR, false>(q, ldq, kp, kc, s, ld, accumulate, max),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = accumulate;
    unreachable!("tiles::score_tile without AVX-512 (callers check `available`)")
}

/// [`score_tile`] as the layer GEMM's tile (`crate::cpu_kernels`): no row maxima, and with
/// `accumulate` the `kc` products are summed from zero and that sum added to the tile once
/// (blocked accumulation), where the score tiles continue one chain from the stored values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile(
    rows: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let r = tile_rows(rows);
    assert!(kc > 0 && lda >= kc && a.len() >= (r - 1) * lda + kc && b.len() >= kc * NR);
    assert!(ldc >= NR && c.len() >= (r - 1) * ldc + NR);
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            match r {
                4 => avx512::score_tile::<4, true>(a, lda, b, kc, c, ldc, accumulate, None),
                8 => avx512::score_tile::<8, true>(a, lda, b, kc, c, ldc, accumulate, None),
                _ => avx512::score_tile::<MR, true>(a, lda, b, kc, c, ldc, accumulate, None),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = accumulate;
    unreachable!("tiles::gemm_tile without AVX-512 (callers check `available`)")
}

/// One output tile: `o[r·ldo + c] = init[r]·o[r·ldo + c] + Σ_j p[r·ld + j] · vp[j·ldv + c]` for
/// the [`tile_rows`]`(rows)` rows of a weight micro-panel `(rows, p, ld, n)` and the `NR`
/// channels of a V panel slice, over `n` keys (`init` `None`: the `o` term left out).
pub(super) fn value_tile(
    (rows, p, ld, n): (usize, &[f32], usize, usize),
    vp: &[f32],
    ldv: usize,
    o: &mut [f32],
    ldo: usize,
    init: Option<&[f32]>,
) {
    let r = tile_rows(rows);
    assert!(n > 0 && ld >= n && p.len() >= (r - 1) * ld + n);
    assert!(ldv >= NR && vp.len() >= (n - 1) * ldv + NR);
    assert!(ldo >= NR && o.len() >= (r - 1) * ldo + NR && init.is_none_or(|a| a.len() >= r));
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (p, vp, o, init) = (p.as_ptr(), vp.as_ptr(), o.as_mut_ptr(), init.map(|a| a.as_ptr()));
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            match r {
                4 => avx512::value_tile::<4>(p, ld, n, vp, ldv, o, ldo, init),
                8 => avx512::value_tile::<8>(p, ld, n, vp, ldv, o, ldo, init),
                _ => avx512::value_tile::<MR>(p, ld, n, vp, ldv, o, ldo, init),
            }
        }
        return;
    }
    unreachable!("tiles::value_tile without AVX-512 (callers check `available`)")
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::NR;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Lanes `0..n` (n ≤ 16) set.
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// `r[i][c]` → `r[c][i]` for a 16 × 16 block in registers (unpack pairs, then quads, then
    /// 128-bit lanes).
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        // t[2g], t[2g + 1]: rows 2g, 2g + 1 interleaved (columns 4k, 4k + 1 / 4k + 2, 4k + 3).
        let mut t = [_mm512_setzero_ps(); 16];
        for g in 0..8 {
            t[2 * g] = _mm512_unpacklo_ps(r[2 * g], r[2 * g + 1]);
            t[2 * g + 1] = _mm512_unpackhi_ps(r[2 * g], r[2 * g + 1]);
        }
        // u[4g + m]: column 4k + m of rows 4g .. 4g + 4, in 128-bit lane k.
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = ps(_mm512_unpacklo_pd(pd(a), pd(c)));
            u[4 * g + 1] = ps(_mm512_unpackhi_pd(pd(a), pd(c)));
            u[4 * g + 2] = ps(_mm512_unpacklo_pd(pd(b), pd(d)));
            u[4 * g + 3] = ps(_mm512_unpackhi_pd(pd(b), pd(d)));
        }
        // Column 4k + m gathers lane k of u[m], u[4 + m], u[8 + m], u[12 + m].
        let mut out = [_mm512_setzero_ps(); 16];
        for m in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x44>(u[m], u[4 + m]);
            let v1 = _mm512_shuffle_f32x4::<0xEE>(u[m], u[4 + m]);
            let w0 = _mm512_shuffle_f32x4::<0x44>(u[8 + m], u[12 + m]);
            let w1 = _mm512_shuffle_f32x4::<0xEE>(u[8 + m], u[12 + m]);
            out[m] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
            out[4 + m] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
            out[8 + m] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
            out[12 + m] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_keys(k: *const f32, lk: usize, d: usize, dst: *mut f32) {
        // 16 keys × 16 channels at a time, transposed in registers; keys past `lk` and channels
        // past `d` are not read (zero).
        for jp in 0..lk.div_ceil(NR) {
            let panel = dst.add(jp * d * NR);
            for half in 0..2 {
                let j0 = jp * NR + half * 16;
                let keys = lk.saturating_sub(j0).min(16);
                for p0 in (0..d).step_by(16) {
                    let m = lanes(d - p0);
                    let mut rows = [_mm512_setzero_ps(); 16];
                    for (i, row) in rows.iter_mut().enumerate().take(keys) {
                        *row = _mm512_maskz_loadu_ps(m, k.add((j0 + i) * d + p0));
                    }
                    let cols = transpose16(rows);
                    for (c, col) in cols.iter().enumerate().take(16.min(d - p0)) {
                        _mm512_storeu_ps(panel.add((p0 + c) * NR + half * 16), *col);
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn pack_values(v: &[f32], lk: usize, dv: usize, first: usize, dst: &mut [f32]) {
        for (cp, panel) in dst.chunks_exact_mut(lk * NR).enumerate() {
            let c0 = (first + cp) * NR;
            let w = NR.min(dv - c0);
            for (j, out) in panel.chunks_exact_mut(NR).enumerate() {
                let src = &v[j * dv + c0..j * dv + c0 + w];
                match (<&mut [f32; NR]>::try_from(out), <&[f32; NR]>::try_from(src)) {
                    (Ok(out), Ok(src)) => *out = *src,
                    (Err(_), _) => unreachable!("chunks of NR"),
                    (Ok(out), Err(_)) => {
                        out[..w].copy_from_slice(src);
                        out[w..].fill(0.0);
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn store_scaled(src: &[f32], f: f32, dst: &mut [MaybeUninit<f32>]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(x * f);
        }
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn score_tile<const R: usize, const ADD: bool>(
        q: *const f32,
        ldq: usize,
        kp: *const f32,
        kc: usize,
        s: *mut f32,
        ld: usize,
        accumulate: bool,
        max: Option<(*mut f32, usize)>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        // ADD: the block is summed from zero and added to the stored values at the end.
        if accumulate && !ADD {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm512_loadu_ps(s.add(r * ld));
                acc[1] = _mm512_loadu_ps(s.add(r * ld + 16));
            }
        }
        for p in 0..kc {
            let b0 = _mm512_loadu_ps(kp.add(p * NR));
            let b1 = _mm512_loadu_ps(kp.add(p * NR + 16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*q.add(r * ldq + p));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        if accumulate && ADD {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm512_add_ps(_mm512_loadu_ps(s.add(r * ld)), acc[0]);
                acc[1] = _mm512_add_ps(_mm512_loadu_ps(s.add(r * ld + 16)), acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(s.add(r * ld), acc[0]);
            _mm512_storeu_ps(s.add(r * ld + 16), acc[1]);
        }
        if let Some((lanes, keys)) = max {
            // max(new, running) keeps the running value where the new score is NaN, as the
            // row kernels' max does; padding columns are left out.
            let (k0, k1) = (self::lanes(keys), self::lanes(keys.saturating_sub(16)));
            for (r, acc) in acc.iter().enumerate() {
                let m = lanes.add(r * 16);
                let run = _mm512_loadu_ps(m);
                let run = _mm512_mask_max_ps(run, k0, acc[0], run);
                let run = _mm512_mask_max_ps(run, k1, acc[1], run);
                _mm512_storeu_ps(m, run);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn value_tile<const R: usize>(
        p: *const f32,
        ld: usize,
        n: usize,
        vp: *const f32,
        ldv: usize,
        o: *mut f32,
        ldo: usize,
        init: Option<*const f32>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if let Some(alpha) = init {
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*alpha.add(r));
                acc[0] = _mm512_mul_ps(_mm512_loadu_ps(o.add(r * ldo)), a);
                acc[1] = _mm512_mul_ps(_mm512_loadu_ps(o.add(r * ldo + 16)), a);
            }
        }
        for j in 0..n {
            let b0 = _mm512_loadu_ps(vp.add(j * ldv));
            let b1 = _mm512_loadu_ps(vp.add(j * ldv + 16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*p.add(r * ld + j));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.add(r * ldo), acc[0]);
            _mm512_storeu_ps(o.add(r * ldo + 16), acc[1]);
        }
    }
}

/// Part `i` of `parts` of the first `len` values of `x` fetched towards L2.
pub(super) fn prefetch(x: &[f32], i: usize, parts: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let lines = len.min(x.len()).div_ceil(16);
        for l in lines * i / parts..lines * (i + 1) / parts {
            // SAFETY: a prefetch never faults; the address is within `x` (l · 16 < len).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    x.as_ptr().add(l * 16) as *const i8
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, i, parts, len);
}

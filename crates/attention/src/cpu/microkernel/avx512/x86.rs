//! The AVX-512F bodies of the `12 × 32` tiles and the packing of [`super`] (x86-64 only).

use super::{MR, NR};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// The GEMM tiles' write-out (a macro, so that it is compiled inside each tile's AVX-512 body
/// with the accumulators in registers): each row's two sums stored to `c` (rows `ldc` apart), or
/// added to what `c` holds first (`accumulate`: one rounding per block, the blocked
/// accumulation). Inside an `unsafe` block with `c` valid for `(R − 1)·ldc + NR` floats.
macro_rules! write_sums {
    ($acc:expr, $c:expr, $ldc:expr, $accumulate:expr) => {
        for (r, acc) in $acc.iter().enumerate() {
            let (mut x0, mut x1) = (acc[0], acc[1]);
            if $accumulate {
                x0 = _mm512_add_ps(_mm512_loadu_ps($c.add(r * $ldc)), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps($c.add(r * $ldc + 16)), x1);
            }
            _mm512_storeu_ps($c.add(r * $ldc), x0);
            _mm512_storeu_ps($c.add(r * $ldc + 16), x1);
        }
    };
}

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

/// `K` `(lk, d)` row-major into key panels `(d, NR)` (see [`super::pack_keys`]).
///
/// # Safety
///
/// The CPU has AVX-512F; `k` is valid for reads of `lk·d` floats and `dst` for writes of `⌈lk/NR⌉·d·NR`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_keys(k: *const f32, lk: usize, d: usize, dst: *mut f32) {
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
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

/// The score tile of [`super::score_tile`] (`ADD`: the GEMM tile of [`super::gemm_tile`] on `A` rows).
///
/// # Safety
///
/// The CPU has AVX-512F; `q` is valid for reads of `(R − 1)·ldq + kc` floats, `kp` of `kc·NR`, `s` for reads and writes of `(R − 1)·ld + NR`, and with `max` its pointer for reads and writes of `R·16`.
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
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
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
}

/// The output tile of [`super::value_tile`].
///
/// # Safety
///
/// The CPU has AVX-512F; `p` is valid for reads of `(R − 1)·ld + n` floats (`n` ≥ 1), `vp` of `(n − 1)·ldv + NR`, `o` for reads and writes of `(R − 1)·ldo + NR`, and `init`, if any, for reads of `R`.
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
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
        // The block's sum from zero, then added to the rescaled running output with one rounding
        // (`o = alpha·o + sum`, as the AVX2 tile does): blocked accumulation over the keys, where a
        // chain continued through every block grows its error with all of them.
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
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
            let (mut s0, mut s1) = (acc[0], acc[1]);
            if let Some(alpha) = init {
                let a = _mm512_set1_ps(*alpha.add(r));
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(o.add(r * ldo)), a, s0);
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(o.add(r * ldo + 16)), a, s1);
            }
            _mm512_storeu_ps(o.add(r * ldo), s0);
            _mm512_storeu_ps(o.add(r * ldo + 16), s1);
        }
    }
}

/// The layer GEMM's tile on `A` rows read in place and a `B` panel held in half precision (f16
/// or, with `BF16`, bf16 bits): each `B` row widened as it is loaded (exact), then the products
/// and sums of [`score_tile`] (`ADD`: the block summed from zero and added to `c` once), so the
/// same bits as that tile on the widened panel.
///
/// # Safety
///
/// The CPU has AVX-512F; `a` is valid for reads of `(R − 1)·lda + kc` floats, `b` of `kc·NR`
/// u16 values, and `c` for reads and writes of `(R − 1)·ldc + NR`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn half_b_tile<const R: usize, const BF16: bool>(
    a: *const f32,
    lda: usize,
    b: *const u16,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
        let widen = |p: *const u16| {
            let h = _mm256_loadu_si256(p.cast());
            if BF16 {
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            } else {
                _mm512_cvtph_ps(h)
            }
        };
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..kc {
            let b0 = widen(b.add(p * NR));
            let b1 = widen(b.add(p * NR + 16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(r * lda + p));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        write_sums!(acc, c, ldc, accumulate);
    }
}

/// The layer GEMM's tile on an interleaved micro-panel: `c[r·ldc + j] (+)= Σ_p a[p·MR + r] ·
/// b[p·NR + j]` for `r < R`, the block summed from zero and added to `c` once (one sequential
/// stream of `A` instead of `R` rows).
///
/// # Safety
///
/// The CPU has AVX-512F; `a` is valid for reads of `MR·kc` floats, `b` of `kc·NR`, and `c` for reads and writes of `(R − 1)·ldc + NR`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm_tile_interleaved<const R: usize>(
    a: *const f32,
    b: *const f32,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..kc {
            let b0 = _mm512_loadu_ps(b.add(p * NR));
            let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
            let ap = a.add(p * MR);
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ap.add(r));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        write_sums!(acc, c, ldc, accumulate);
    }
}

/// [`score_tile`] as the layer GEMM's tile (`ADD`, no maxima) for a full [`MR`]-row tile, with
/// the rows' addresses formed from three base registers (rows 0, 4 and 8) and the multiples of
/// `lda` that x86 addressing modes carry, where the compiler otherwise spends about fifteen
/// integer operations a step re-deriving twelve row addresses. A candidate for cores whose two
/// 512-bit FMA ports share their issue ports with integer operations (Intel's), timed by
/// `bench_sdpa fma-peak` (`tile_rows3_gflops`) and run by the GEMM under
/// `UNET_ATTENTION_GEMM_TILE=rows3`. Same products in the same order as [`score_tile`]: the same
/// bits.
///
/// # Safety
///
/// The CPU has AVX-512F; `a` is valid for reads of `(MR − 1)·lda + kc` floats, `b` of `kc·NR`,
/// and `c` for reads and writes of `(MR − 1)·ldc + NR`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm_tile_row_bases(
    a: *const f32,
    lda: usize,
    b: *const f32,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the `# Safety` conditions above: AVX-512F, and every
    // pointer valid for the reads and writes named there, which are all this body makes.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let mut bases = [a, a.add(4 * lda), a.add(8 * lda)];
        let mut bp = b;
        for _ in 0..kc {
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for (g, &base) in bases.iter().enumerate() {
                // An opaque copy (an empty `asm!`): the compiler keeps the base in a register
                // and addresses the group's four rows from it (`+ 0`, `+ lda`, `+ 2·lda`,
                // `+ 3·lda`) instead of re-deriving twelve addresses each step.
                let mut base = base;
                std::arch::asm!("/* {0} */", inout(reg) base, options(pure, readonly, nostack, preserves_flags));
                for i in 0..4 {
                    let x = _mm512_set1_ps(*base.add(i * lda));
                    let acc = &mut acc[4 * g + i];
                    acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }
            for base in bases.iter_mut() {
                *base = base.add(1);
            }
            bp = bp.add(NR);
        }
        write_sums!(acc, c, ldc, accumulate);
    }
}

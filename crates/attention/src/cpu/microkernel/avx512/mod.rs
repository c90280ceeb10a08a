//! The `12 × 32` AVX-512F register tile (24 of the 32 `zmm` registers accumulate) and the packing
//! into its 32-wide panels, part of the bottom layer ([`crate::cpu`]): the safe entry points,
//! each checking the bounds of every access before it runs the intrinsics of [`x86`] (x86-64
//! only; callers check [`available`]). Used by the attention kernel's score and output tiles and
//! by the layer GEMM ([`gemm_tile`]).

use super::ALayout;
use crate::cpu::isa::Isa;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Rows of the register tile (query rows per micro-panel).
pub(crate) const MR: usize = 12;
/// Columns of the register tile (keys per K panel, channels per V panel: two 16-lane vectors).
pub(crate) const NR: usize = 32;

/// Whether this CPU runs the tile (AVX-512F detected and allowed, once).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn available() -> bool {
    Isa::detect() == Isa::Avx512
}

/// Which loop runs the layer GEMM's full tiles on activation rows read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsTile {
    /// [`x86::score_tile`] as the GEMM's tile: the compiler forms the twelve row addresses.
    Plain,
    /// `x86::gemm_tile_row_bases`: the rows addressed from three base registers.
    RowBases,
}

/// `UNET_ATTENTION_GEMM_TILE` (read once): `auto` (the default, [`RowsTile::Plain`]) or `rows3`
/// ([`RowsTile::RowBases`]); any other value is an error (checked by
/// `cpu_kernels::layer_path`, as the other settings). The same bits either way: a switch to time
/// the two loops in whole blocks on a CPU where integer operations compete with the FMAs for
/// issue ports (Intel's two 512-bit FMA ports), without a rebuild.
pub(crate) fn rows_tile_setting() -> Result<RowsTile, String> {
    static SETTING: std::sync::OnceLock<Result<RowsTile, String>> = std::sync::OnceLock::new();
    SETTING
        .get_or_init(|| {
            let choices = [("auto", RowsTile::Plain), ("rows3", RowsTile::RowBases)];
            crate::cpu::setting::choice("UNET_ATTENTION_GEMM_TILE", &choices)
        })
        .clone()
}

/// Register-tile rows for a micro-panel of `rows` (1 ..= [`MR`]) rows: 4, 8 or 12, so a short
/// last micro-panel costs a third or two thirds of a full one.
pub(crate) fn tile_rows(rows: usize) -> usize {
    assert!((1..=MR).contains(&rows));
    rows.div_ceil(4) * 4
}

/// `K` `(Lk, D)` row-major into key panels `(D, NR)`: `dst` holds `⌈Lk/NR⌉·D·NR` values, keys
/// past `Lk` zero.
pub(crate) fn pack_keys(k: &[f32], lk: usize, d: usize, dst: &mut [f32]) {
    assert!(k.len() >= lk * d && dst.len() == lk.div_ceil(NR) * d * NR);
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected; the assert bounds every access.
        unsafe { x86::pack_keys(k.as_ptr(), lk, d, dst.as_mut_ptr()) };
        return;
    }
    unreachable!("avx512::pack_keys without AVX-512 (callers check `available`)")
}

/// `V` `(Lk, Dv)` row-major into channel panels `(Lk, NR)` from panel `first` on: `dst` holds
/// whole panels (`Lk·NR` values each), at most up to the last, channels past `Dv` zero.
pub(crate) fn pack_values(v: &[f32], lk: usize, dv: usize, first: usize, dst: &mut [f32]) {
    let panels = dst.len() / (lk * NR);
    assert!(v.len() >= lk * dv && dst.len() == panels * lk * NR && first + panels <= dv.div_ceil(NR));
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected (the body is safe code compiled for it).
        unsafe { x86::pack_values(v, lk, dv, first, dst) };
        return;
    }
    unreachable!("avx512::pack_values without AVX-512 (callers check `available`)")
}

/// `dst = src · f` (an output row from its accumulator; plain code without AVX-512).
pub(crate) fn store_scaled(src: &[f32], f: f32, dst: &mut [std::mem::MaybeUninit<f32>]) {
    assert!(src.len() == dst.len());
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F detected (the body is safe code compiled for it).
        unsafe { x86::store_scaled(src, f, dst) };
        return;
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(x * f);
    }
}

/// One score tile: `s[r·ld + c] (+)= Σ_p q[r·ldq + p] · kp[p·NR + c]` for [`tile_rows`]`(rows)`
/// rows (read and written) and the `NR` columns of a panel slice, over `kc` channels (with
/// `accumulate`, continuing the chain from the stored values); with `max` (`(lanes, keys)`), the
/// rows are also folded into 16 running-max lanes per row over the first `keys` columns.
pub(crate) fn score_tile(
    rows: usize,
    (q, ldq): (&[f32], usize),
    kp: &[f32],
    kc: usize,
    (s, ld): (&mut [f32], usize),
    accumulate: bool,
    max: Option<(&mut [f32], usize)>,
) {
    let r = tile_rows(rows);
    assert!(kc > 0 && ldq >= kc && q.len() >= (r - 1) * ldq + kc && kp.len() >= kc * NR);
    assert!(ld >= NR && s.len() >= (r - 1) * ld + NR);
    assert!(max
        .as_ref()
        .is_none_or(|m| m.0.len() >= r * 16 && (1..=NR).contains(&m.1)));
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (q, kp, s) = (q.as_ptr(), kp.as_ptr(), s.as_mut_ptr());
        let max = max.map(|m| (m.0.as_mut_ptr(), m.1));
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            match r {
                4 => x86::score_tile::<4, false>(q, ldq, kp, kc, s, ld, accumulate, max),
                8 => x86::score_tile::<8, false>(q, ldq, kp, kc, s, ld, accumulate, max),
                _ => x86::score_tile::<MR, false>(q, ldq, kp, kc, s, ld, accumulate, max),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (accumulate, max);
    unreachable!("avx512::score_tile without AVX-512 (callers check `available`)")
}

/// [`score_tile`] as the layer GEMM's tile: no row maxima, and with `accumulate` the `kc`
/// products are summed from zero and that sum added to the tile once (blocked accumulation),
/// where the score tiles continue one chain from the stored values. `A` is rows `lda` apart, or
/// one micro-panel of [`MR`] rows interleaved (`a[p·MR + r]`, zero rows past `rows`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile(
    rows: usize,
    (a, layout): (&[f32], ALayout),
    b: &[f32],
    kc: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let rows_tile = rows_tile_setting().unwrap_or(RowsTile::Plain);
    gemm_tile_using(rows_tile, rows, (a, layout), b, kc, c, ldc, accumulate);
}

/// [`gemm_tile`] with its full rows tiles on the loop `rows_tile` whatever
/// `UNET_ATTENTION_GEMM_TILE` says (`bench_sdpa fma-peak` times both; the same bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile_using(
    rows_tile: RowsTile,
    rows: usize,
    (a, layout): (&[f32], ALayout),
    b: &[f32],
    kc: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let r = tile_rows(rows);
    let a_len = match layout {
        ALayout::Rows(lda) => {
            assert!(lda >= kc);
            (r - 1) * lda + kc
        }
        ALayout::Interleaved => MR * kc,
    };
    assert!(kc > 0 && a.len() >= a_len && b.len() >= kc * NR);
    assert!(ldc >= NR && c.len() >= (r - 1) * ldc + NR);
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            let row_bases = rows_tile == RowsTile::RowBases;
            match (layout, r) {
                (ALayout::Rows(lda), 4) => x86::score_tile::<4, true>(a, lda, b, kc, c, ldc, accumulate, None),
                (ALayout::Rows(lda), 8) => x86::score_tile::<8, true>(a, lda, b, kc, c, ldc, accumulate, None),
                (ALayout::Rows(lda), _) if row_bases => x86::gemm_tile_row_bases(a, lda, b, kc, c, ldc, accumulate),
                (ALayout::Rows(lda), _) => x86::score_tile::<MR, true>(a, lda, b, kc, c, ldc, accumulate, None),
                (ALayout::Interleaved, 4) => x86::gemm_tile_interleaved::<4>(a, b, kc, c, ldc, accumulate),
                (ALayout::Interleaved, 8) => x86::gemm_tile_interleaved::<8>(a, b, kc, c, ldc, accumulate),
                (ALayout::Interleaved, _) => x86::gemm_tile_interleaved::<MR>(a, b, kc, c, ldc, accumulate),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (accumulate, layout, rows_tile);
    unreachable!("avx512::gemm_tile without AVX-512 (callers check `available`)")
}

/// [`gemm_tile`] on `A` rows `lda` apart and a `B` panel held in half precision: `b` the panel's
/// f16 bits, or bf16 bits with `bf16`, widened as the tile loads them (the same bits as
/// [`gemm_tile`] on the widened panel, with no widened copy).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile_half_b(
    rows: usize,
    (a, lda): (&[f32], usize),
    (b, bf16): (&[u16], bool),
    kc: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let r = tile_rows(rows);
    assert!(lda >= kc && kc > 0 && a.len() >= (r - 1) * lda + kc && b.len() >= kc * NR);
    assert!(ldc >= NR && c.len() >= (r - 1) * ldc + NR);
    #[cfg(target_arch = "x86_64")]
    if available() {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: AVX-512F detected; the asserts bound every access.
        unsafe {
            match (r, bf16) {
                (4, false) => x86::half_b_tile::<4, false>(a, lda, b, kc, c, ldc, accumulate),
                (8, false) => x86::half_b_tile::<8, false>(a, lda, b, kc, c, ldc, accumulate),
                (_, false) => x86::half_b_tile::<MR, false>(a, lda, b, kc, c, ldc, accumulate),
                (4, true) => x86::half_b_tile::<4, true>(a, lda, b, kc, c, ldc, accumulate),
                (8, true) => x86::half_b_tile::<8, true>(a, lda, b, kc, c, ldc, accumulate),
                (_, true) => x86::half_b_tile::<MR, true>(a, lda, b, kc, c, ldc, accumulate),
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (a, lda, b, bf16, accumulate);
    unreachable!("avx512::gemm_tile_half_b without AVX-512 (callers check `available`)")
}

/// One output tile: `o[r·ldo + c] = init[r]·o[r·ldo + c] + Σ_j p[r·ld + j] · vp[j·ldv + c]` (the
/// sum formed from zero and added with one rounding) for [`tile_rows`]`(rows)` rows of weights
/// `p` (read and written) and the `NR` channels of a V panel slice, over `n` keys (`init`
/// `None`: the `o` term left out).
pub(crate) fn value_tile(
    (rows, p, ld, n): (usize, &[f32], usize, usize),
    (vp, ldv): (&[f32], usize),
    (o, ldo): (&mut [f32], usize),
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
                4 => x86::value_tile::<4>(p, ld, n, vp, ldv, o, ldo, init),
                8 => x86::value_tile::<8>(p, ld, n, vp, ldv, o, ldo, init),
                _ => x86::value_tile::<MR>(p, ld, n, vp, ldv, o, ldo, init),
            }
        }
        return;
    }
    unreachable!("avx512::value_tile without AVX-512 (callers check `available`)")
}

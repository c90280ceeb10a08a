//! The register tiles of the layer GEMM ([`super::gemm`]): `R × 16` with AVX2 and FMA, and the
//! attention kernel's `12 × 32` AVX-512 tile (`sdpa::cpu::tiles::gemm_tile`).

use super::gemm::Isa;

/// How a tile's `A` micro-panel is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ALayout {
    /// Row-major, rows `lda` apart: `a[r·lda + p]`.
    Rows(usize),
    /// The 6 rows of an AVX2 micro-panel interleaved: `a[p·6 + r]` (rows past the tile's
    /// zero), so that the tile reads one sequential stream.
    Interleaved,
}

/// Rows of an interleaved micro-panel (the AVX2 tile height).
pub(super) const IL_ROWS: usize = 6;

/// One register tile: `c[r·ldc + j] (+)= Σ_p A[r, p] · b[p·NR + j]` for `rows` rows and
/// `NR` columns (rows up to the tile height may be read from `a` and written to `c`). The
/// block's products are summed from zero and the sum added to `c` once (`accumulate`).
/// Interleaved `A` is AVX2 only.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile(
    isa: Isa,
    rows: usize,
    (a, layout): (&[f32], ALayout),
    kc: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    match (isa, layout) {
        (Isa::Avx512, ALayout::Rows(lda)) => crate::sdpa::cpu_gemm_tile(rows, a, lda, b, kc, c, ldc, accumulate),
        (Isa::Avx512, ALayout::Interleaved) => unreachable!("AVX-512 tiles read A row-major"),
        (Isa::Avx2, layout) => {
            let (lda, il) = match layout {
                ALayout::Rows(lda) => (lda, false),
                ALayout::Interleaved => (IL_ROWS, true),
            };
            let a_ok = if il {
                a.len() >= kc * IL_ROWS
            } else {
                lda >= kc && a.len() >= (rows - 1) * lda + kc
            };
            assert!((1..=6).contains(&rows) && a_ok);
            assert!(b.len() >= kc * 16 && c.len() >= (rows - 1) * ldc + 16);
            // `Isa::Avx2` is never detected off x86-64.
            #[cfg(not(target_arch = "x86_64"))]
            let _ = accumulate;
            #[cfg(target_arch = "x86_64")]
            {
                let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
                // SAFETY: `Isa::Avx2` is only detected where AVX2 and FMA are; the asserts bound
                // every access.
                unsafe {
                    if il {
                        avx2::by_rows::<true>(rows, a, lda, b, kc, c, ldc, accumulate)
                    } else {
                        avx2::by_rows::<false>(rows, a, lda, b, kc, c, ldc, accumulate)
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The tile of height `rows` (1 to 6).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn by_rows<const IL: bool>(
        rows: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match rows {
                1 => tile::<1, IL>(a, lda, b, kc, c, ldc, accumulate),
                2 => tile::<2, IL>(a, lda, b, kc, c, ldc, accumulate),
                3 => tile::<3, IL>(a, lda, b, kc, c, ldc, accumulate),
                4 => tile::<4, IL>(a, lda, b, kc, c, ldc, accumulate),
                5 => tile::<5, IL>(a, lda, b, kc, c, ldc, accumulate),
                _ => tile::<6, IL>(a, lda, b, kc, c, ldc, accumulate),
            }
        }
    }

    /// `R × 16` tile: two 8-lane accumulators per row, one broadcast `A` value per row and step;
    /// `A[r, p]` at `a[p·lda + r]` when interleaved (`lda` the panel height), else `a[r·lda + p]`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const IL: bool>(
        a: *const f32,
        lda: usize,
        b: *const f32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for p in 0..kc {
            let b0 = _mm256_loadu_ps(b.add(p * 16));
            let b1 = _mm256_loadu_ps(b.add(p * 16 + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let at = if IL { p * super::IL_ROWS + r } else { r * lda + p };
                let x = _mm256_broadcast_ss(&*a.add(at));
                acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            }
        }
        // The block's sum added to the running one (one rounding per block), not a chain
        // continued from it: blocked accumulation.
        for (r, acc) in acc.iter().enumerate() {
            let (mut s0, mut s1) = (acc[0], acc[1]);
            if accumulate {
                s0 = _mm256_add_ps(_mm256_loadu_ps(c.add(r * ldc)), s0);
                s1 = _mm256_add_ps(_mm256_loadu_ps(c.add(r * ldc + 8)), s1);
            }
            _mm256_storeu_ps(c.add(r * ldc), s0);
            _mm256_storeu_ps(c.add(r * ldc + 8), s1);
        }
    }
}

#[cfg(test)]
mod tile_speed {
    /// The 6-row tile alone with its operands in L1, in GFLOP/s (a probe, not a check: run with
    /// `cargo test --release -p unet-attention tile_in_l1 -- --ignored --nocapture` and compare
    /// with `bench_sdpa fma-peak`; 89 – 92 GFLOP/s against a 99 GFLOP/s peak on Zen 3).
    #[test]
    #[ignore]
    fn tile_in_l1() {
        let isa = super::Isa::detect().unwrap();
        let kc = 168;
        let a = vec![0.5f32; 6 * kc];
        let b = vec![0.25f32; kc * 16];
        let mut c = vec![0f32; 6 * 16];
        let n = 200_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for i in 0..n {
                let layout = super::ALayout::Rows(kc);
                super::tile(isa, 6, (&a, layout), kc, &b, &mut c, 16, i > 0);
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "tile 6x16 kc {kc}: {:.1} GFLOP/s",
                (n * 6 * 16 * kc * 2) as f64 / s / 1e9
            );
        }
    }
}

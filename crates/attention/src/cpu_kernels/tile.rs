//! The register tiles of the layer GEMM ([`super::gemm`]): `R × 16` with AVX2 and FMA, and the
//! attention kernel's `12 × 32` AVX-512 tile (`sdpa::cpu::tiles::gemm_tile`).

use super::gemm::Isa;

/// One register tile: `c[r·ldc + j] (+)= Σ_p a[r·lda + p] · b[p·NR + j]` for `rows` rows and
/// `NR` columns (rows up to the tile height may be read from `a` and written to `c`). The
/// block's products are summed from zero and the sum added to `c` once (`accumulate`).
#[allow(clippy::too_many_arguments)]
pub(super) fn tile(
    isa: Isa,
    rows: usize,
    (a, lda): (&[f32], usize),
    kc: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    match isa {
        Isa::Avx512 => crate::sdpa::cpu_gemm_tile(rows, a, lda, b, kc, c, ldc, accumulate),
        Isa::Avx2 => {
            assert!((1..=6).contains(&rows) && lda >= kc && a.len() >= (rows - 1) * lda + kc);
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
                    match rows {
                        1 => avx2::tile::<1>(a, lda, b, kc, c, ldc, accumulate),
                        2 => avx2::tile::<2>(a, lda, b, kc, c, ldc, accumulate),
                        3 => avx2::tile::<3>(a, lda, b, kc, c, ldc, accumulate),
                        4 => avx2::tile::<4>(a, lda, b, kc, c, ldc, accumulate),
                        5 => avx2::tile::<5>(a, lda, b, kc, c, ldc, accumulate),
                        _ => avx2::tile::<6>(a, lda, b, kc, c, ldc, accumulate),
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `R × 16` tile: two 8-lane accumulators per row, one broadcast `A` value per row and step.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize>(
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
                let x = _mm256_broadcast_ss(&*a.add(r * lda + p));
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
                super::tile(isa, 6, (&a, kc), kc, &b, &mut c, 16, i > 0);
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "tile 6x16 kc {kc}: {:.1} GFLOP/s",
                (n * 6 * 16 * kc * 2) as f64 / s / 1e9
            );
        }
    }
}

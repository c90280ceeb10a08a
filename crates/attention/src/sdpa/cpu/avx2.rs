//! The `R × 16` AVX2 + FMA register tile (`R` ≤ 6: 12 of the 16 `ymm` registers accumulate)
//! of the layer GEMM of [`crate::cpu_kernels`], beside the attention kernel's AVX-512 tiles.
//! (Run as the attention kernel's two products on AVX2 CPUs, it measured no faster than the
//! `gemm` crate calls of [`super::gemm_engine`] on Zen 3: 67 against 72 GFLOP/s on one core.)

/// Columns of a tile: the width of a `B` panel.
pub(crate) const NR: usize = 16;
/// Rows of a full tile, and of an interleaved `A` micro-panel.
pub(crate) const MR: usize = 6;

/// How a tile's `A` micro-panel is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ALayout {
    /// Row-major, rows `lda` apart: `a[r·lda + p]`.
    Rows(usize),
    /// The [`MR`] rows of a micro-panel interleaved: `a[p·MR + r]` (rows past the tile's are
    /// zero), so that the tile reads one sequential stream.
    Interleaved,
}

/// Whether the CPU has AVX2 and FMA (detected once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One tile: `c[r·ldc + j] (+)= Σ_p A[r, p] · b[p·NR + j]` for `rows` rows (1 to [`MR`]) and
/// [`NR`] columns. The block's products are summed from zero and the sum added to `c` once
/// (`accumulate`), so a reduction split into blocks is a blocked sum. Panics where the CPU lacks
/// AVX2 + FMA (callers check [`available`]) or an operand is too short.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    rows: usize,
    (a, layout): (&[f32], ALayout),
    kc: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let (lda, il) = match layout {
        ALayout::Rows(lda) => (lda, false),
        ALayout::Interleaved => (MR, true),
    };
    assert!((1..=MR).contains(&rows) && kc > 0);
    let a_ok = if il {
        a.len() >= kc * MR
    } else {
        lda >= kc && a.len() >= (rows - 1) * lda + kc
    };
    assert!(a_ok && b.len() >= kc * NR && ldc >= NR && c.len() >= (rows - 1) * ldc + NR);
    assert!(available(), "the AVX2 tile on a CPU without AVX2 and FMA");
    #[cfg(target_arch = "x86_64")]
    {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // SAFETY: AVX2 and FMA are present (asserted); the asserts bound every access.
        unsafe {
            if il {
                x86::by_rows::<true>(rows, a, lda, b, kc, c, ldc, accumulate)
            } else {
                x86::by_rows::<false>(rows, a, lda, b, kc, c, ldc, accumulate)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (lda, il, accumulate);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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
    /// `A[r, p]` at `a[p·MR + r]` when interleaved, else `a[r·lda + p]`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const IL: bool>(
        a: *const f32,
        lda: usize,
        b: *const f32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        // SAFETY (every access): within the bounds the safe wrapper asserted.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for p in 0..kc {
                let b0 = _mm256_loadu_ps(b.add(p * 16));
                let b1 = _mm256_loadu_ps(b.add(p * 16 + 8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let at = if IL { p * super::MR + r } else { r * lda + p };
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
}

#[cfg(test)]
mod tile_speed {
    /// The 6-row tile alone with its operands in L1, in GFLOP/s (a probe, not a check: run with
    /// `cargo test --release -p unet-attention tile_in_l1 -- --ignored --nocapture` and compare
    /// with `bench_sdpa fma-peak`; 89 – 92 GFLOP/s against a 99 GFLOP/s peak on Zen 3).
    #[test]
    #[ignore]
    fn tile_in_l1() {
        if !super::available() {
            return;
        }
        let kc = 168;
        let a = vec![0.5f32; 6 * kc];
        let b = vec![0.25f32; kc * 16];
        let mut c = vec![0f32; 6 * 16];
        let n = 200_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for i in 0..n {
                super::tile(6, (&a, super::ALayout::Rows(kc)), kc, &b, &mut c, 16, i > 0);
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "tile 6x16 kc {kc}: {:.1} GFLOP/s",
                (n * 6 * 16 * kc * 2) as f64 / s / 1e9
            );
        }
    }
}

//! The register-tile microkernels of the CPU kernels, part of the bottom layer
//! ([`crate::cpu`]): the `R × 16` AVX2 + FMA tile ([`avx2`]) and the `12 × 32` AVX-512F tile
//! ([`avx512`]), the AMX bf16 tile ([`amx`]), their tile sizes by instruction set, the GEMM tile of either ([`tile`]) for the
//! layer GEMM, and a prefetch. The attention kernel calls the two modules' own entry points (its
//! score and output tiles).

use crate::cpu::isa::Isa;

pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx512;

/// How a tile's `A` micro-panel is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ALayout {
    /// Row-major, rows `lda` apart: `a[r·lda + p]`.
    Rows(usize),
    /// The [`Isa::mr`] rows of a micro-panel interleaved: `a[p·MR + r]` (rows past the tile's are
    /// zero), so that the tile reads one sequential stream.
    Interleaved,
}

impl Isa {
    /// Rows of this instruction set's register tile (and of an interleaved `A` micro-panel).
    /// Panics for [`Isa::None`], which has no tile.
    pub(crate) fn mr(self) -> usize {
        match self {
            Isa::Avx2 => avx2::MR,
            Isa::Avx512 => avx512::MR,
            Isa::None => unreachable!("no register tile without AVX2"),
        }
    }

    /// Columns of this instruction set's register tile (the width of a `B` panel). Panics for
    /// [`Isa::None`].
    pub(crate) fn nr(self) -> usize {
        match self {
            Isa::Avx2 => avx2::NR,
            Isa::Avx512 => avx512::NR,
            Isa::None => unreachable!("no register tile without AVX2"),
        }
    }
}

/// One GEMM register tile of `isa`: `c[r·ldc + j] (+)= Σ_p A[r, p] · b[p·NR + j]` for `rows`
/// rows and `NR` columns (rows up to the tile height may be read from `a` and written to `c`).
/// The block's products are summed from zero and the sum added to `c` once (`accumulate`).
/// Interleaved `A`: micro-panels of the tile's height ([`Isa::mr`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    isa: Isa,
    rows: usize,
    (a, layout): (&[f32], ALayout),
    kc: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    match isa {
        Isa::Avx512 => avx512::gemm_tile(rows, (a, layout), b, kc, c, ldc, accumulate),
        Isa::Avx2 => avx2::tile(rows, (a, layout), kc, b, c, ldc, accumulate),
        Isa::None => unreachable!("no register tile without AVX2"),
    }
}

/// Part `i` of `parts` of the first `len` values of `x` fetched towards L2.
pub(crate) fn prefetch(x: &[f32], i: usize, parts: usize, len: usize) {
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

//! The register tiles of the layer GEMM ([`super::gemm`]): the attention kernel's `R × 16` AVX2
//! tile (`sdpa::cpu::avx2`) and its `12 × 32` AVX-512 tile (`sdpa::cpu::tiles::gemm_tile`).

use super::gemm::Isa;
pub(super) use crate::sdpa::CpuALayout as ALayout;

/// One register tile: `c[r·ldc + j] (+)= Σ_p A[r, p] · b[p·NR + j]` for `rows` rows and
/// `NR` columns (rows up to the tile height may be read from `a` and written to `c`). The
/// block's products are summed from zero and the sum added to `c` once (`accumulate`).
/// Interleaved `A`: micro-panels of the tile's height ([`Isa::mr`]).
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
    match isa {
        Isa::Avx512 => crate::sdpa::cpu_gemm_tile(rows, (a, layout), b, kc, c, ldc, accumulate),
        Isa::Avx2 => crate::sdpa::cpu_avx2_tile(rows, (a, layout), kc, b, c, ldc, accumulate),
    }
}

/// The AVX2 tile down a column of micro-panels: the `rows` rows of `A` (micro-panel `i` at
/// `a[i·step ..]`) against one `B` panel into `c`, one call per panel instead of per tile.
pub(super) fn avx2_column(
    rows: usize,
    a: (&[f32], ALayout, usize),
    kc: usize,
    b: &[f32],
    c: (&mut [f32], usize),
    accumulate: bool,
) {
    crate::sdpa::cpu_avx2_tile_column(rows, a, kc, b, c, accumulate)
}

//! Weights packed once, when a layer is built, into the layouts the GEMM's tiles read
//! ([`super::gemm`]): convolution weights as the `A` operand ([`PackedRows`]), linear weights as
//! the `B` operand ([`PackedCols`]).

use super::gemm::{k_blocks, Blocking, Isa};
use super::tile::IL_ROWS;

/// A weight `(rows, k)` as the `A` operand: per reduction block, its rows (padded with zero rows
/// to a multiple of 12) of that block's `kc` values each, row-major, or on CPUs whose tile
/// reads interleaved micro-panels ([`Isa::interleaves_a`]) in groups of 6 rows interleaved.
#[derive(Debug)]
pub(crate) struct PackedRows {
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(super) rows_p: usize,
    pub(super) interleaved: bool,
    pub(super) blocks: Vec<(usize, usize)>,
    pub(super) data: Vec<f32>,
}

impl PackedRows {
    /// Pack the row-major `(rows, k)` matrix `w` for `isa`'s tile.
    pub(crate) fn new(w: &[f32], rows: usize, k: usize, isa: Isa, blocking: Blocking) -> PackedRows {
        assert_eq!(w.len(), rows * k);
        let rows_p = rows.div_ceil(Isa::ROW_PAD) * Isa::ROW_PAD;
        let interleaved = isa.interleaves_a();
        let blocks = k_blocks(k, blocking.kc);
        let mut data = vec![0f32; rows_p * k];
        for &(p0, kcb) in &blocks {
            let block = &mut data[rows_p * p0..][..rows_p * kcb];
            for (r, src) in w.chunks_exact(k).enumerate() {
                let src = &src[p0..p0 + kcb];
                if interleaved {
                    let panel = &mut block[(r / IL_ROWS) * IL_ROWS * kcb..][..IL_ROWS * kcb];
                    let lane = panel.iter_mut().skip(r % IL_ROWS).step_by(IL_ROWS);
                    lane.zip(src).for_each(|(d, &v)| *d = v);
                } else {
                    block[r * kcb..][..kcb].copy_from_slice(src);
                }
            }
        }
        PackedRows {
            rows,
            k,
            rows_p,
            interleaved,
            blocks,
            data,
        }
    }

    /// The matrix back, row-major `(rows, k)`.
    pub(crate) fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.k];
        for &(p0, kcb) in &self.blocks {
            let block = &self.data[self.rows_p * p0..][..self.rows_p * kcb];
            for (r, dst) in w.chunks_exact_mut(self.k).enumerate() {
                let dst = &mut dst[p0..p0 + kcb];
                if self.interleaved {
                    let panel = &block[(r / IL_ROWS) * IL_ROWS * kcb..][..IL_ROWS * kcb];
                    let lane = panel.iter().skip(r % IL_ROWS).step_by(IL_ROWS);
                    dst.iter_mut().zip(lane).for_each(|(d, &v)| *d = v);
                } else {
                    dst.copy_from_slice(&block[r * kcb..][..kcb]);
                }
            }
        }
        w
    }
}

/// A weight `(cols, k)` as the transposed `B` operand `(k, cols)`: per reduction block, panels
/// of `NR` columns, each `(kc, NR)` row-major (columns past `cols` zero).
#[derive(Debug)]
pub(crate) struct PackedCols {
    pub(crate) cols: usize,
    pub(crate) k: usize,
    pub(super) nr: usize,
    pub(super) panels: usize,
    pub(super) blocks: Vec<(usize, usize)>,
    pub(super) data: Vec<f32>,
}

impl PackedCols {
    /// Pack the row-major `(cols, k)` matrix `w` (an `nn.Linear` weight `(out, in)`).
    pub(crate) fn new(w: &[f32], cols: usize, k: usize, isa: Isa, blocking: Blocking) -> PackedCols {
        assert_eq!(w.len(), cols * k);
        let nr = isa.nr();
        let panels = cols.div_ceil(nr);
        let blocks = k_blocks(k, blocking.kc);
        let mut data = vec![0f32; panels * nr * k];
        for &(p0, kcb) in &blocks {
            let block = &mut data[panels * nr * p0..][..panels * nr * kcb];
            for (jp, panel) in block.chunks_exact_mut(kcb * nr).enumerate() {
                for (c, row) in w.chunks_exact(k).skip(jp * nr).take(nr).enumerate() {
                    for (kk, &v) in row[p0..p0 + kcb].iter().enumerate() {
                        panel[kk * nr + c] = v;
                    }
                }
            }
        }
        PackedCols {
            cols,
            k,
            nr,
            panels,
            blocks,
            data,
        }
    }

    /// The matrix back, row-major `(cols, k)`.
    pub(crate) fn unpack(&self) -> Vec<f32> {
        let nr = self.nr;
        let mut w = vec![0f32; self.cols * self.k];
        for &(p0, kcb) in &self.blocks {
            let block = &self.data[self.panels * nr * p0..][..self.panels * nr * kcb];
            for (c, row) in w.chunks_exact_mut(self.k).enumerate() {
                let panel = &block[(c / nr) * kcb * nr..];
                for (kk, v) in row[p0..p0 + kcb].iter_mut().enumerate() {
                    *v = panel[kk * nr + c % nr];
                }
            }
        }
        w
    }
}

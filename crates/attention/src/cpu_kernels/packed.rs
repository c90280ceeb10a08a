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
///
/// A gated projection's weight `(2·n, k)` (`[hidden | gate]` rows, GEGLU's) may be packed
/// *paired* ([`PackedCols::new_paired`]): panel `2j` holds hidden columns `j·NR ..`, panel `2j + 1`
/// the gate columns of the same indices, each half zero-padded to whole panels, so that one task
/// of the GEMM holds both halves of its outputs and can write `hidden · gelu(gate)` directly.
#[derive(Debug)]
pub(crate) struct PackedCols {
    /// Packed columns (for a paired weight `2·⌈n/NR⌉·NR`).
    pub(crate) cols: usize,
    pub(crate) k: usize,
    /// A paired weight's `n` (its hidden width).
    pub(crate) pairs: Option<usize>,
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
            pairs: None,
            nr,
            panels,
            blocks,
            data,
        }
    }

    /// Pack a gated weight `(2·n, k)` paired (see [`PackedCols`]).
    pub(crate) fn new_paired(w: &[f32], n: usize, k: usize, isa: Isa, blocking: Blocking) -> PackedCols {
        assert_eq!(w.len(), 2 * n * k);
        let nr = isa.nr();
        let cols = 2 * n.div_ceil(nr) * nr;
        let mut permuted = vec![0f32; cols * k];
        for (c, row) in w.chunks_exact(k).enumerate() {
            permuted[paired_col(c, n, nr) * k..][..k].copy_from_slice(row);
        }
        let mut packed = PackedCols::new(&permuted, cols, k, isa, blocking);
        packed.pairs = Some(n);
        packed
    }

    /// The output columns: `cols`, or `2·n` for a paired weight.
    pub(crate) fn out_cols(&self) -> usize {
        self.pairs.map_or(self.cols, |n| 2 * n)
    }

    /// A per-column vector (a bias) laid out as the packed columns (zero in a paired weight's
    /// padding).
    pub(crate) fn column_order(&self, v: &[f32]) -> Vec<f32> {
        match self.pairs {
            None => v.to_vec(),
            Some(n) => {
                let mut out = vec![0f32; self.cols];
                for (c, &x) in v.iter().enumerate().take(2 * n) {
                    out[paired_col(c, n, self.nr)] = x;
                }
                out
            }
        }
    }

    /// The matrix back, row-major `(out_cols, k)` (a paired weight in its original order).
    pub(crate) fn unpack(&self) -> Vec<f32> {
        let packed = self.unpack_packed();
        match self.pairs {
            None => packed,
            Some(n) => (0..2 * n)
                .flat_map(|c| &packed[paired_col(c, n, self.nr) * self.k..][..self.k])
                .copied()
                .collect(),
        }
    }

    /// The packed columns back, row-major `(cols, k)`.
    fn unpack_packed(&self) -> Vec<f32> {
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

/// Where output column `c` (of `2·n`: hidden `0..n`, gate `n..2n`) sits among a paired weight's
/// packed columns: hidden column `j` in panel `2·(j / nr)`, gate column `j` in the next.
pub(crate) fn paired_col(c: usize, n: usize, nr: usize) -> usize {
    let (half, j) = if c < n { (0, c) } else { (1, c - n) };
    (2 * (j / nr) + half) * nr + j % nr
}

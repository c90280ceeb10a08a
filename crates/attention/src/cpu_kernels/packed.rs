//! Weights packed once, when a layer is built, into the layouts the GEMM's tiles read
//! ([`super::gemm`]): convolution weights as the `A` operand ([`PackedRows`]), linear weights as
//! the `B` operand ([`PackedCols`]).
//!
//! A weight loaded in f16 or bf16 is packed in the same layout but held in its own type
//! ([`Held`]: half the memory of f32, the model's size as loaded); the GEMM widens each task's
//! block to f32 as it takes it (exact: every f16 and bf16 value is an f32), so the products are
//! the f32 GEMM's on the same values.

use super::gemm::{k_blocks, Blocking};
use crate::cpu::aligned::Aligned;
use crate::cpu::isa::Isa;
use crate::cpu::Half;

/// The type packed values are held in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    F32,
    Bf16,
    F16,
}

/// Packed values held in a half-precision type (their bits).
#[derive(Debug, Clone)]
pub(crate) struct HalfBits {
    held: Held,
    bits: Vec<u16>,
}

impl HalfBits {
    /// `values` (each exactly a value of `held`: they were loaded in it) as `held`'s bits, rounded
    /// by the crate's one set of half conversions ([`crate::cpu::Half`]).
    fn narrow(values: &[f32], held: Held) -> HalfBits {
        use half::vec::HalfFloatVecExt;
        fn go<T: Half>(values: &[f32]) -> Vec<T> {
            let mut out = vec![T::ZERO; values.len()];
            T::narrow(values, &mut out);
            out
        }
        let bits = match held {
            Held::Bf16 => go::<half::bf16>(values).reinterpret_into(),
            Held::F16 => go::<half::f16>(values).reinterpret_into(),
            Held::F32 => unreachable!("f32 values are held as they are"),
        };
        HalfBits { held, bits }
    }

    /// Values `start .. start + dst.len()` widened into `dst`.
    fn widen(&self, start: usize, dst: &mut [f32]) {
        use half::slice::HalfBitsSliceExt;
        let src = &self.bits[start..start + dst.len()];
        match self.held {
            Held::Bf16 => half::bf16::widen(src.reinterpret_cast(), dst),
            Held::F16 => half::f16::widen(src.reinterpret_cast(), dst),
            Held::F32 => unreachable!("f32 values are held as they are"),
        }
    }

    fn to_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.bits.len()];
        self.widen(0, &mut out);
        out
    }
}

/// `len` packed values from `start`: in place where they are held as f32 (`data`), else widened
/// into `buf`.
fn values_from<'s>(
    data: &'s [f32],
    half: &Option<HalfBits>,
    start: usize,
    len: usize,
    buf: &'s mut [f32],
) -> &'s [f32] {
    match half {
        None => &data[start..start + len],
        Some(h) => {
            h.widen(start, &mut buf[..len]);
            &buf[..len]
        }
    }
}

/// `A` rows are padded to a multiple of this in packed weights (every tile height, 4, 6, 8 or
/// 12, reads whole rows).
const ROW_PAD: usize = 12;

/// A weight `(rows, k)` as the `A` operand: per reduction block, its rows (padded with zero rows
/// to a multiple of 12) in micro-panels of `il` rows interleaved, `block[(r / il)·il·kcb +
/// kk·il + r % il]`: the tile's height ([`Isa::mr`]), so that a tile reads its micro-panel as one
/// sequential stream, or `il = 1`, plain rows. Either way a block is one contiguous run of
/// `rows_p · kcb` values whose place for `(row, kk)` depends only on `rows_p`, `kcb` and `il`,
/// so two matrices with blocks of the same depth combine block by block, element by element
/// (the Winograd weight transform does).
#[derive(Debug, Clone)]
pub(crate) struct PackedRows {
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(super) rows_p: usize,
    /// Rows per interleaved micro-panel (1: row-major).
    pub(super) il: usize,
    pub(super) blocks: Vec<(usize, usize)>,
    /// On a 64-byte boundary (`crate::cpu::aligned`); empty where the values are held in half
    /// precision (`half`).
    pub(super) data: Aligned,
    pub(super) half: Option<HalfBits>,
}

/// How a packed matrix holds its values (`data` in f32, or `half`): the same four methods for
/// [`PackedRows`] and [`PackedCols`].
macro_rules! held_values {
    ($packed:ty) => {
        impl $packed {
            /// The values held as `held` (f32: as they are); each must be a value of `held`.
            pub(crate) fn held_as(mut self, held: Held) -> Self {
                if held != Held::F32 {
                    self.half = Some(HalfBits::narrow(&self.data, held));
                    self.data = Aligned::default();
                }
                self
            }

            /// The type the values are held in.
            pub(crate) fn held(&self) -> Held {
                self.half.as_ref().map_or(Held::F32, |h| h.held)
            }

            /// The values' bits where they are held in bf16 (the packed layout, as `values`).
            pub(super) fn bf16_bits(&self) -> Option<&[u16]> {
                self.half
                    .as_ref()
                    .filter(|h| h.held == Held::Bf16)
                    .map(|h| &h.bits[..])
            }

            /// `len` values from `start` of the packed layout, in place or widened into `buf`.
            pub(super) fn values<'s>(&'s self, start: usize, len: usize, buf: &'s mut [f32]) -> &'s [f32] {
                values_from(&self.data, &self.half, start, len, buf)
            }
        }
    };
}

held_values!(PackedRows);
held_values!(PackedCols);

impl PackedRows {
    /// The matrix with its values held in f32: itself, or a widened copy.
    pub(crate) fn widened(&self) -> std::borrow::Cow<'_, PackedRows> {
        match &self.half {
            None => std::borrow::Cow::Borrowed(self),
            Some(h) => {
                let values = h.to_vec();
                let mut data = Aligned::in_vec(Vec::new(), values.len());
                data.copy_from_slice(&values);
                std::borrow::Cow::Owned(PackedRows {
                    rows: self.rows,
                    k: self.k,
                    rows_p: self.rows_p,
                    il: self.il,
                    blocks: self.blocks.clone(),
                    data,
                    half: None,
                })
            }
        }
    }

    /// A `(rows, k)` matrix of zeros in the reduction blocks `blocks`, in micro-panels of `il`
    /// rows (a divisor of 12; 1: row-major).
    pub(crate) fn zeros_with(rows: usize, k: usize, il: usize, blocks: Vec<(usize, usize)>) -> PackedRows {
        PackedRows::in_buffer(Vec::new(), rows, k, il, blocks)
    }

    /// [`PackedRows::zeros_with`] in the buffer `data` (its allocation reused; the values are
    /// whatever it held, for a caller that writes every one of them).
    pub(crate) fn in_buffer(
        data: Vec<f32>,
        rows: usize,
        k: usize,
        il: usize,
        blocks: Vec<(usize, usize)>,
    ) -> PackedRows {
        assert!(
            il > 0 && ROW_PAD.is_multiple_of(il),
            "micro-panels of a divisor of the row padding"
        );
        let mut p = 0;
        for &(p0, kcb) in &blocks {
            assert!(p0 == p && kcb > 0, "reduction blocks must be consecutive and non-empty");
            p += kcb;
        }
        assert_eq!(p, k, "reduction blocks must cover the reduction");
        let rows_p = rows.div_ceil(ROW_PAD) * ROW_PAD;
        let data = Aligned::in_vec(data, rows_p * k);
        PackedRows {
            rows,
            k,
            rows_p,
            il,
            blocks,
            data,
            half: None,
        }
    }

    /// The buffer back, for [`PackedRows::in_buffer`].
    pub(crate) fn into_data(self) -> Vec<f32> {
        self.data.into_vec()
    }

    /// Row `r` of the matrix set to `src` (`k` values).
    pub(crate) fn set_row(&mut self, r: usize, src: &[f32]) {
        for &(p0, kcb) in &self.blocks {
            let block = &mut self.data[self.rows_p * p0..][..self.rows_p * kcb];
            let src = &src[p0..p0 + kcb];
            let il = self.il;
            let panel = &mut block[(r / il) * il * kcb..][..il * kcb];
            let lane = panel.iter_mut().skip(r % il).step_by(il);
            lane.zip(src).for_each(|(d, &v)| *d = v);
        }
    }

    /// The values of every reduction block (`rows_p · kcb` each, laid out as the tile reads
    /// them), writable.
    pub(crate) fn blocks_mut(&mut self) -> Vec<&mut [f32]> {
        let mut rest = &mut self.data[..];
        let mut out = Vec::with_capacity(self.blocks.len());
        for &(_, kcb) in &self.blocks {
            let (block, tail) = rest.split_at_mut(self.rows_p * kcb);
            out.push(block);
            rest = tail;
        }
        out
    }

    /// The matrix back, row-major `(rows, k)`.
    pub(crate) fn unpack(&self) -> Vec<f32> {
        if self.half.is_some() {
            return self.widened().unpack();
        }
        let mut w = vec![0f32; self.rows * self.k];
        for (r, dst) in w.chunks_exact_mut(self.k).enumerate() {
            self.unpack_row(r, dst);
        }
        w
    }

    /// Row `r` of the matrix into `dst` (`k` values).
    pub(crate) fn unpack_row(&self, r: usize, dst: &mut [f32]) {
        for &(p0, kcb) in &self.blocks {
            let block = &self.data[self.rows_p * p0..][..self.rows_p * kcb];
            let dst = &mut dst[p0..p0 + kcb];
            let il = self.il;
            let panel = &block[(r / il) * il * kcb..][..il * kcb];
            let lane = panel.iter().skip(r % il).step_by(il);
            dst.iter_mut().zip(lane).for_each(|(d, &v)| *d = v);
        }
    }
}

/// The columns `col0 .. col0 + cols` (whole panels) of a [`PackedCols`], writable on their own.
pub(crate) struct ColGroup<'a> {
    pub(crate) col0: usize,
    pub(crate) cols: usize,
    nr: usize,
    /// `(p0, kcb, values)` per reduction block.
    blocks: Vec<(usize, usize, &'a mut [f32])>,
}

impl ColGroup<'_> {
    /// Where row `p` lies: its reduction block and the row within that block.
    pub(crate) fn locate(&self, p: usize) -> (usize, usize) {
        let b = self.blocks.partition_point(|blk| blk.0 <= p) - 1;
        (b, p - self.blocks[b].0)
    }

    /// Row `kk` of reduction block `b` ([`ColGroup::locate`]), columns `c0 .. c0 + src.len()`
    /// (counted from the group's first column), set to `src`.
    pub(crate) fn write_run(&mut self, (b, kk): (usize, usize), c0: usize, src: &[f32]) {
        let nr = self.nr;
        let (_, kcb, part) = &mut self.blocks[b];
        let mut c = c0;
        for src in split_at_panels(c0, nr, src) {
            let at = (c / nr) * *kcb * nr + kk * nr + c % nr;
            super::im2col::copy_short(&mut part[at..at + src.len()], src);
            c += src.len();
        }
    }
}

/// `src` (columns from `c0`) cut where panels of `nr` columns end.
fn split_at_panels(c0: usize, nr: usize, mut src: &[f32]) -> impl Iterator<Item = &[f32]> {
    let mut c = c0;
    std::iter::from_fn(move || {
        if src.is_empty() {
            return None;
        }
        let (run, rest) = src.split_at((nr - c % nr).min(src.len()));
        (src, c) = (rest, c + run.len());
        Some(run)
    })
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
    /// On a 64-byte boundary (`crate::cpu::aligned`); empty where the values are held in half
    /// precision (`half`).
    pub(super) data: Aligned,
    pub(super) half: Option<HalfBits>,
}

impl PackedCols {
    /// The values' bits and their type where they are held in half precision (the packed
    /// layout, as `values`).
    pub(super) fn half_bits(&self) -> Option<(&[u16], Held)> {
        self.half.as_ref().map(|h| (&h.bits[..], h.held))
    }

    /// Pack the row-major `(cols, k)` matrix `w` (an `nn.Linear` weight `(out, in)`).
    pub(crate) fn new(w: &[f32], cols: usize, k: usize, isa: Isa, blocking: Blocking) -> PackedCols {
        assert_eq!(w.len(), cols * k);
        let nr = isa.nr();
        let panels = cols.div_ceil(nr);
        let blocks = k_blocks(k, blocking.kc);
        let mut data = Aligned::zeroed(panels * nr * k);
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
            half: None,
        }
    }

    /// A `(cols, k)` matrix of zeros in the buffer `data` (its allocation reused), to be
    /// filled by column groups ([`PackedCols::column_groups_mut`]).
    pub(crate) fn zeros_in(data: Vec<f32>, cols: usize, k: usize, isa: Isa, blocks: Vec<(usize, usize)>) -> PackedCols {
        let nr = isa.nr();
        let panels = cols.div_ceil(nr);
        let data = Aligned::zeroed_in(data, panels * nr * k);
        PackedCols {
            cols,
            k,
            pairs: None,
            nr,
            panels,
            blocks,
            data,
            half: None,
        }
    }

    /// The buffer back, for [`PackedCols::zeros_in`].
    pub(crate) fn into_data(self) -> Vec<f32> {
        self.data.into_vec()
    }

    /// The packed values split by runs of `per` whole panels (disjoint, so that column ranges
    /// can be written in parallel).
    pub(crate) fn column_groups_mut(&mut self, per: usize) -> Vec<ColGroup<'_>> {
        let (nr, per) = (self.nr, per.max(1));
        let mut groups: Vec<ColGroup> = (0..self.panels.div_ceil(per))
            .map(|g| ColGroup {
                col0: g * per * nr,
                cols: (per * nr).min(self.panels * nr - g * per * nr),
                nr,
                blocks: Vec::with_capacity(self.blocks.len()),
            })
            .collect();
        let mut rest = &mut self.data[..];
        for &(p0, kcb) in &self.blocks {
            let (block, tail) = rest.split_at_mut(self.panels * nr * kcb);
            rest = tail;
            for (g, part) in block.chunks_mut(per * kcb * nr).enumerate() {
                groups[g].blocks.push((p0, kcb, part));
            }
        }
        groups
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
        let widened;
        let data: &[f32] = match &self.half {
            None => &self.data,
            Some(h) => {
                widened = h.to_vec();
                &widened
            }
        };
        let nr = self.nr;
        let mut w = vec![0f32; self.cols * self.k];
        for &(p0, kcb) in &self.blocks {
            let block = &data[self.panels * nr * p0..][..self.panels * nr * kcb];
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

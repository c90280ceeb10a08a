//! The layer GEMM's tasks on the AMX bf16 tiles ([`crate::cpu::microkernel::amx`]), for products
//! whose both operands are bf16 values: a weight held in bf16 and activations from a bf16 tensor
//! (token rows, or an image, read as bf16 bits: every product exact). The task and its
//! reduction blocks are the f32 path's; per block the task's operands are laid out as the tiles
//! read them (the `A` rows row-major, read in place from a weight packed row by row; the `B`
//! columns in 16-wide panels of pairs) and every 32 × 32 block of the accumulator takes the
//! block's products; the write-out is the f32 path's.

use super::{ColsOf, Job, OutPtr, RowsOf, Task};
use crate::cpu::isa::Isa;
use crate::cpu::microkernel::amx::{Tiles, PANEL, STEP};
use crate::cpu::scratch::with_scratch;

/// Rows of a task's tile blocks (a task's rows are a multiple, but the last).
pub(super) const ROWS: usize = 32;
/// Columns of a tile block (two panels).
const COLS: usize = 32;

/// Whether a product runs on the AMX tiles: the tiles are available, the weight is held in bf16
/// and the other operand's values are bf16 values.
pub(super) fn applies(isa: Isa, a: &RowsOf, b: &ColsOf) -> bool {
    match (a, b) {
        (RowsOf::Bf16Matrix(..), ColsOf::Packed(p)) => super::bf16_tiles(isa, p.held()),
        (RowsOf::Packed(p), ColsOf::Image(img)) => img.bits.is_some() && super::bf16_tiles(isa, p.held()),
        _ => false,
    }
}

/// The reduction depth `kcb` rounded up to whole tile steps.
fn padded(kcb: usize) -> usize {
    kcb.next_multiple_of(STEP)
}

impl Job<'_> {
    /// [`Job::run`] on the AMX tiles.
    pub(super) fn run_amx(&self, t: Task, out: OutPtr) {
        let tiles = Tiles::configure().expect("AMX checked when the call was made");
        let nr = self.isa.nr();
        let (rows_p, cols_p) = (t.rows.next_multiple_of(ROWS), t.cols.next_multiple_of(COLS));
        let ldc = cols_p + if cols_p % 256 == 0 { 16 } else { 0 };
        let kc_max = self.blocks.iter().map(|b| b.1).max().unwrap_or(0);
        // The image's panels, bf16 bits (two to an f32 of the scratch).
        let image_len = match self.b {
            ColsOf::Image(_) => (t.cols.div_ceil(nr) * nr * kc_max).div_ceil(2),
            ColsOf::Packed(_) => 0,
        };
        let (a_len, b_len) = (rows_p * padded(kc_max), cols_p * padded(kc_max));
        let need = rows_p * ldc + image_len + (a_len + b_len).div_ceil(2);
        with_scratch(need, |scratch| {
            let (acc, rest) = scratch.split_at_mut(rows_p * ldc);
            let (image_buf, rest) = rest.split_at_mut(image_len);
            let halves = as_bits(rest);
            let (a_buf, rest) = halves.split_at_mut(a_len);
            let b_buf = &mut rest[..b_len];
            for (bi, &(p0, kcb)) in self.blocks.iter().enumerate() {
                let kp = padded(kcb);
                let b_blk = &mut b_buf[..cols_p * kp];
                self.pack_b_pairs(t, (p0, kcb), image_buf, b_blk);
                let a_rows = self.a_tile_rows(t, (p0, kcb), &mut a_buf[..rows_p * kp]);
                let panel = PANEL * kp;
                for jc in 0..cols_p / COLS {
                    let b = &b_blk[jc * 2 * panel..];
                    for ir in 0..rows_p / ROWS {
                        let c = &mut acc[ir * ROWS * ldc + jc * COLS..];
                        tiles.block_32x32(a_rows.group(ir), (b, panel), kp / STEP, (c, ldc), bi > 0);
                    }
                }
            }
            drop(tiles);
            match self.pairs {
                Some(half) => self.write_pairs(t, acc, ldc, half, out),
                None => self.write_out(t, acc, ldc, out),
            }
        });
    }

    /// The task's `B` columns over `[p0, p0 + kcb)` into `dst` as the tiles read them: panels of
    /// 16 columns, `kp / 2` rows of 16 pairs each (`(p / 2)·32 + 2·j + p % 2`), zeros past `kcb`.
    fn pack_b_pairs(&self, t: Task, (p0, kcb): (usize, usize), image_buf: &mut [f32], dst: &mut [u16]) {
        let nr = self.isa.nr();
        let panels = t.cols.div_ceil(nr);
        match self.b {
            ColsOf::Packed(p) => {
                let bits = p.bf16_bits().expect("a weight held in bf16");
                let start = p.panels * nr * p0 + (t.n0 / nr) * kcb * nr;
                interleave(&bits[start..][..panels * nr * kcb], kcb, nr, dst, bits_pairs);
            }
            ColsOf::Image(img) => {
                let len = panels * nr * kcb;
                let buf = &mut as_bits(image_buf)[..len];
                img.pack_bits(t.item, p0, kcb, t.n0, t.cols, nr, buf);
                interleave(buf, kcb, nr, dst, bits_pairs);
            }
        }
    }

    /// The task's `A` rows over `[p0, p0 + kcb)` as the tiles read them, row-major: read in place
    /// (a weight packed row by row, or bf16 token rows) where a 32-row group lies within the
    /// operand and the block is whole tile steps; the other groups copied into `buf` (rows of
    /// `kp` values, zero-padded).
    fn a_tile_rows<'s>(&'s self, t: Task, (p0, kcb): (usize, usize), buf: &'s mut [u16]) -> TileRows<'s> {
        let kp = padded(kcb);
        let groups = buf.len() / kp / ROWS;
        // The groups read in place, their first value and row distance.
        let (full, main, lda): (usize, &[u16], usize) = match self.a {
            RowsOf::Packed(p) => {
                let bits = p.bf16_bits().expect("a weight held in bf16");
                let block = &bits[p.rows_p * p0..][..p.rows_p * kcb];
                match p.il == 1 && kcb == kp && t.m0 + groups * ROWS <= p.rows_p {
                    true => (groups, &block[t.m0 * kcb..], kcb),
                    false => (0, &[], kcb),
                }
            }
            RowsOf::Bf16Matrix(x, lda) => match kcb == kp {
                true => (t.rows / ROWS, &x[t.m0 * lda + p0..], lda),
                false => (0, &[], lda),
            },
            RowsOf::Matrix(..) => unreachable!("the AMX tiles take a bf16 weight or bf16 activations as A"),
        };
        for (r, row) in buf[..(groups - full) * ROWS * kp].chunks_exact_mut(kp).enumerate() {
            let r = full * ROWS + r;
            row.fill(0);
            if r >= t.rows {
                continue;
            }
            match self.a {
                RowsOf::Packed(p) => {
                    let bits = p.bf16_bits().expect("a weight held in bf16");
                    let block = &bits[p.rows_p * p0..][..p.rows_p * kcb];
                    let (gr, il) = (t.m0 + r, p.il);
                    let first = (gr / il) * il * kcb + gr % il;
                    for (pp, d) in row[..kcb].iter_mut().enumerate() {
                        *d = block[first + pp * il];
                    }
                }
                RowsOf::Bf16Matrix(x, lda) => {
                    let start = (t.m0 + r) * lda + p0;
                    row[..kcb].copy_from_slice(&x[start..start + kcb]);
                }
                RowsOf::Matrix(..) => unreachable!(),
            }
        }
        TileRows {
            main,
            lda,
            full,
            tail: buf,
            tail_lda: kp,
        }
    }
}

/// A task's `A` rows for one reduction block: 32-row groups `0 .. full` in place, `lda` apart,
/// the others copied, `tail_lda` apart.
struct TileRows<'s> {
    main: &'s [u16],
    lda: usize,
    full: usize,
    tail: &'s [u16],
    tail_lda: usize,
}

impl TileRows<'_> {
    /// Group `g`'s first value and row distance.
    fn group(&self, g: usize) -> (&[u16], usize) {
        match g < self.full {
            true => (&self.main[g * ROWS * self.lda..], self.lda),
            false => (&self.tail[(g - self.full) * ROWS * self.tail_lda..], self.tail_lda),
        }
    }
}

/// Panels of `nr` columns (`src[jp·kcb·nr + p·nr + j]`) into the tiles' 16-column panels of
/// pairs (`kp·16` values each, [`Job::pack_b_pairs`]), `pairs` making a row of 16 pairs (32-bit,
/// row `p` in the low half) from rows `p` and `p + 1`; rows past `kcb` zero.
fn interleave<T: Copy + Default>(src: &[T], kcb: usize, nr: usize, dst: &mut [u16], pairs: Pairs<T>) {
    let kp = padded(kcb);
    let sub = nr / PANEL;
    let (head, dst, _) = {
        // SAFETY: u32 has no invalid bit patterns; `align_to_mut` only takes the aligned middle.
        unsafe { dst.align_to_mut::<u32>() }
    };
    assert!(head.is_empty(), "the scratch is 4-byte aligned");
    let zero = [T::default(); 32];
    for (jp, src) in src.chunks_exact(kcb * nr).enumerate() {
        for pp in 0..kp / 2 {
            let row = |p: usize| if p < kcb { &src[p * nr..][..nr] } else { &zero[..nr] };
            let (lo, hi) = (row(2 * pp), row(2 * pp + 1));
            for s in 0..sub {
                let d: &mut [u32; PANEL] = (&mut dst[(jp * sub + s) * PANEL * kp / 2 + pp * PANEL..][..PANEL])
                    .try_into()
                    .expect("16 pairs");
                let lo: &[T; PANEL] = lo[s * PANEL..][..PANEL].try_into().expect("16 values");
                let hi: &[T; PANEL] = hi[s * PANEL..][..PANEL].try_into().expect("16 values");
                pairs(lo, hi, d);
            }
        }
    }
}

/// 16 pairs from two rows of 16 values.
type Pairs<T> = fn(&[T; PANEL], &[T; PANEL], &mut [u32; PANEL]);

/// Pairs of bf16 bits, the first row's in the low half.
fn bits_pairs(lo: &[u16; PANEL], hi: &[u16; PANEL], d: &mut [u32; PANEL]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        fn go(lo: &[u16; PANEL], hi: &[u16; PANEL], d: &mut [u32; PANEL]) {
            // SAFETY: 16 u16 values (32 bytes) read from each row, 16 u32 values (64 bytes)
            // written: the arrays' sizes.
            unsafe {
                let l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(lo.as_ptr().cast()));
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(hi.as_ptr().cast()));
                _mm512_storeu_si512(d.as_mut_ptr().cast(), _mm512_or_si512(l, _mm512_slli_epi32::<16>(h)));
            }
        }
        // SAFETY: the AMX tiles run only where the CPU has AVX-512F (`amx::available`).
        unsafe { go(lo, hi, d) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for j in 0..PANEL {
        d[j] = lo[j] as u32 | (hi[j] as u32) << 16;
    }
}

/// A scratch run of f32 values taken as twice as many u16 values.
fn as_bits(x: &mut [f32]) -> &mut [u16] {
    // SAFETY: u16 has no invalid bit patterns and a smaller alignment than f32; the new slice
    // covers exactly the same bytes and borrows `x` mutably for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u16>(), 2 * x.len()) }
}

//! The 16 products `M_ξ = U_ξ · V_ξ` of a Winograd convolution with few tiles, `U` formed inside
//! each task from the direct weight instead of whole before them.
//!
//! With at most two `B` panels of tiles, each value of `U` is used by two tile columns and no
//! more, so forming the whole `U` (16/9 of the weight, 17 MiB at 512 channels) in memory first
//! and reading it back costs more than the products it feeds. Here a task takes a few output
//! channels and every position: per reduction block it transforms those channels' direct weight
//! (read once, in runs) into 16 `A` blocks in its scratch, then runs the 16 tile loops against
//! `V`, each into its own accumulator.

use super::super::gemm::{PackedCols, PackedRows};
use super::weight::{transform_rows, u_blocks};
use crate::cpu::caches;
use crate::cpu::isa::Isa;
use crate::cpu::microkernel::{tile, ALayout};
use crate::cpu::scratch::with_scratch;
use rayon::prelude::*;

/// Whether the products of `tiles` tiles run here: at most two panels of the tile.
pub(super) fn applies(isa: Isa, tiles: usize) -> bool {
    tiles <= 2 * isa.nr()
}

/// `m[ξ·C_out·tiles + co·tiles + t] = Σ_ci U_ξ[co, ci] · V_ξ[ci, t]` for every position `ξ`, with
/// `U` from the direct weight `direct` (reduction blocks [`u_blocks`], as `v`'s).
pub(super) fn products(isa: Isa, direct: &PackedRows, v: &[PackedCols], m: &mut [f32], tiles: usize) {
    let blocks = u_blocks(direct);
    assert_eq!(v.len(), 16);
    assert!(v.iter().all(|v| v.blocks == blocks && v.cols == tiles));
    let (c_out, mr) = (direct.rows, isa.mr());
    assert_eq!(m.len(), 16 * c_out * tiles);
    let rows = task_rows(isa, c_out, &blocks, tiles);
    // `outs[task][ξ]`: the task's rows of M_ξ.
    let mut outs: Vec<Vec<&mut [f32]>> = (0..c_out.div_ceil(rows)).map(|_| Vec::with_capacity(16)).collect();
    for m_xi in m.chunks_exact_mut(c_out * tiles) {
        for (task, part) in m_xi.chunks_mut(rows * tiles).enumerate() {
            outs[task].push(part);
        }
    }
    outs.into_par_iter().enumerate().for_each(|(task, mut out)| {
        let r0 = task * rows;
        let n = out[0].len() / tiles;
        Task {
            isa,
            direct,
            v,
            blocks: &blocks,
            tiles,
        }
        .run(r0, n.div_ceil(mr) * mr, &mut out);
    });
}

/// Output channels per task, a multiple of the tile height: the 16 `A` blocks and the 16
/// accumulators within half of L2, and at least two tasks per thread where there are channels
/// enough.
fn task_rows(isa: Isa, c_out: usize, blocks: &[(usize, usize)], tiles: usize) -> usize {
    let mr = isa.mr();
    let kc = blocks.iter().map(|b| b.1).max().unwrap_or(1);
    let cols = tiles.div_ceil(isa.nr()) * isa.nr();
    let per_row = 16 * (kc + cols) * size_of::<f32>();
    let fit = caches::sizes().1 / 2 / per_row;
    let spread = c_out.div_ceil(2 * rayon::current_num_threads());
    (fit.min(spread) / mr * mr).max(mr)
}

/// What every task reads.
struct Task<'a> {
    isa: Isa,
    direct: &'a PackedRows,
    v: &'a [PackedCols],
    blocks: &'a [(usize, usize)],
    tiles: usize,
}

impl Task<'_> {
    /// Output channels `r0 .. r0 + out[ξ].len() / tiles` (`rows_p` of them with padding) of every
    /// `M_ξ` into `out[ξ]`.
    fn run(&self, r0: usize, rows_p: usize, out: &mut [&mut [f32]]) {
        let (mr, nr, tiles) = (self.isa.mr(), self.isa.nr(), self.tiles);
        let panels = tiles.div_ceil(nr);
        let ldc = panels * nr;
        let kc = self.blocks.iter().map(|b| b.1).max().unwrap_or(0);
        let layout = if self.direct.il == 1 {
            ALayout::Rows(kc)
        } else {
            ALayout::Interleaved
        };
        // Whole cache lines each, so that every part starts on one as the scratch does.
        let (a_len, acc_len) = ((rows_p * kc).next_multiple_of(16), rows_p * ldc);
        with_scratch(16 * (a_len + acc_len), |scratch| {
            let (a, acc) = scratch.split_at_mut(16 * a_len);
            for (j, &(q0, kcb)) in self.blocks.iter().enumerate() {
                let mut a16: Vec<&mut [f32]> = a.chunks_exact_mut(a_len).map(|c| &mut c[..rows_p * kcb]).collect();
                transform_rows(self.direct, (q0, kcb), r0, &mut a16);
                let layout = match layout {
                    ALayout::Rows(_) => ALayout::Rows(kcb),
                    il => il,
                };
                for ((a_xi, acc_xi), v) in a16.iter().zip(acc.chunks_exact_mut(acc_len)).zip(self.v) {
                    let b = &v.data[v.panels * nr * q0..][..panels * kcb * nr];
                    for (jp, b_pan) in b.chunks_exact(kcb * nr).enumerate() {
                        for mp in 0..rows_p / mr {
                            let c = &mut acc_xi[mp * mr * ldc + jp * nr..];
                            tile(
                                self.isa,
                                mr,
                                (&a_xi[mp * mr * kcb..], layout),
                                kcb,
                                b_pan,
                                c,
                                ldc,
                                j > 0,
                            );
                        }
                    }
                }
            }
            for (dst, acc_xi) in out.iter_mut().zip(acc.chunks_exact(acc_len)) {
                for (d, s) in dst.chunks_exact_mut(tiles).zip(acc_xi.chunks_exact(ldc)) {
                    d.copy_from_slice(&s[..tiles]);
                }
            }
        });
    }
}

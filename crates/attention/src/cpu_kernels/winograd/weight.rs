//! The weight side of Winograd's F(2×2, 3×3): `U_ξ = (G g Gᵀ)[ξ]` of every 3 × 3 kernel, for the
//! 16 positions `ξ = 4i + j` of a 4 × 4 transformed tile.
//!
//! The direct weight is packed tap-major ([`super::super::im2col::tap_major`]) in reduction blocks
//! that never hold parts of two taps ([`super::super::im2col::conv_blocks`]), so what tap `t`
//! gives to block `(q0, kcb)` of `U` is one run per micro-panel of the direct block holding rows
//! `t·C_in + q0 ..`, laid out as `U`'s block lays out its rows: the transform is elementwise over
//! runs, 16 outputs from 9 inputs ([`transform_rows`]). It runs over the whole weight into
//! buffers of the pool ([`transform_weight`]), or a task's rows at a time inside the products
//! (`super::fused`).

use super::super::gemm::{Held, PackedRows};
use crate::cpu::pool;
use rayon::prelude::*;

/// `U`'s reduction blocks: the direct weight's blocks within tap 0 where taps are split into
/// blocks, else one block of all input channels.
pub(super) fn u_blocks(direct: &PackedRows) -> Vec<(usize, usize)> {
    let c_in = direct.k / 9;
    assert_eq!(direct.k, 9 * c_in, "a 3×3 kernel");
    if direct.blocks[0].1 <= c_in {
        direct.blocks.iter().copied().take_while(|b| b.0 < c_in).collect()
    } else {
        vec![(0, c_in)]
    }
}

/// The transformed weight, each `U_ξ` a packed `(C_out, C_in)` `A` operand in buffers of the
/// pool ([`recycle`] gives them back), in parallel over runs of micro-panels.
pub(crate) fn transform_weight(direct: &PackedRows) -> Vec<PackedRows> {
    let (c_out, c_in) = (direct.rows, direct.k / 9);
    let blocks = u_blocks(direct);
    let mut u: Vec<PackedRows> = (0..16)
        .map(|_| {
            let buf = pool::take(direct.rows_p * c_in);
            PackedRows::in_buffer(buf, c_out, c_in, direct.il, blocks.clone())
        })
        .collect();
    let il = direct.il;
    // `per_block[j][ξ]`: block j of U_ξ.
    let mut per_block: Vec<Vec<&mut [f32]>> = blocks.iter().map(|_| Vec::with_capacity(16)).collect();
    for packed in u.iter_mut() {
        for (j, block) in packed.blocks_mut().into_iter().enumerate() {
            per_block[j].push(block);
        }
    }
    // Jobs of about 16 K values per position: (block, first row, its 16 output runs).
    let mut jobs: Vec<(usize, usize, Vec<&mut [f32]>)> = vec![];
    for (j, outs) in per_block.into_iter().enumerate() {
        let kcb = blocks[j].1;
        let rows = (16 * 1024 / (il * kcb)).max(1) * il;
        let mut chunks: Vec<_> = outs.into_iter().map(|b| b.chunks_mut(rows * kcb)).collect();
        for r0 in (0..direct.rows_p).step_by(rows) {
            let dst: Vec<&mut [f32]> = chunks.iter_mut().map(|c| c.next().expect("a chunk per run")).collect();
            jobs.push((j, r0, dst));
        }
    }
    jobs.into_par_iter()
        .for_each(|(j, r0, mut dst)| transform_rows(direct, blocks[j], r0, &mut dst));
    u
}

/// The transformed weights' buffers back to the pool.
pub(crate) fn recycle(u: Vec<PackedRows>) {
    pool::give(u.into_iter().map(PackedRows::into_data));
}

/// `dst[ξ]` = block `(q0, kcb)` of `U_ξ` for the rows `r0 .. r0 + dst[ξ].len() / kcb` (`r0` and
/// the row count multiples of the direct weight's micro-panel height), laid out as in the
/// packed `U` (micro-panels of `direct.il` rows interleaved).
pub(super) fn transform_rows(direct: &PackedRows, (q0, kcb): (usize, usize), r0: usize, dst: &mut [&mut [f32]]) {
    let (c_in, il) = (direct.k / 9, direct.il);
    assert_eq!(dst.len(), 16);
    let rows = dst[0].len() / kcb;
    assert!(r0.is_multiple_of(il) && rows.is_multiple_of(il) && r0 + rows <= direct.rows_p);
    // Tap t's source: where its direct block starts in the packed values, its depth and the
    // run's offset in a row.
    let src: [(usize, usize, usize); 9] = std::array::from_fn(|t| {
        let p = t * c_in + q0;
        let b = direct.blocks.partition_point(|blk| blk.0 <= p) - 1;
        let (p0, depth) = direct.blocks[b];
        assert!(p + kcb <= p0 + depth, "a reduction block holds parts of two taps");
        (direct.rows_p * p0, depth, p - p0)
    });
    // A weight held in half precision is widened a run at a time into this thread's buffer.
    WIDENED.with_borrow_mut(|buf| {
        if src.iter().all(|&(_, depth, off)| depth == kcb && off == 0) {
            // Blocks of one tap each: the rows are one run in every source.
            let len = rows * kcb;
            let runs = tap_runs(direct, buf, len, |t| src[t].0 + r0 * kcb);
            return transform_run(runs, dst, 0);
        }
        for u in 0..rows / il {
            let unit = r0 / il + u;
            let runs = tap_runs(direct, buf, il * kcb, |t| {
                let (start, depth, off) = src[t];
                start + unit * il * depth + off * il
            });
            transform_run(runs, dst, u * il * kcb);
        }
    })
}

thread_local! {
    /// Runs of a half-precision weight widened for [`transform_rows`].
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The nine taps' runs of `len` packed values from `start(t)`: in place where the weight is held
/// in f32, else widened into `buf`.
fn tap_runs<'a>(
    direct: &'a PackedRows,
    buf: &'a mut Vec<f32>,
    len: usize,
    start: impl Fn(usize) -> usize,
) -> [&'a [f32]; 9] {
    if direct.held() != Held::F32 && buf.len() < 9 * len {
        buf.resize(9 * len, 0.0);
    }
    let mut parts = buf.chunks_mut(len.max(1));
    std::array::from_fn(|t| {
        let part: &'a mut [f32] = match direct.held() {
            Held::F32 => &mut [],
            _ => parts.next().expect("nine runs"),
        };
        direct.values(start(t), len, part)
    })
}

/// `dst[ξ][at + i] = (G g Gᵀ)[ξ]` of the 3 × 3 kernel `g[tap] = src[tap][i]`, for every `i`
/// (compiled for the widest vectors the CPU has; the same f32 operations, so the same bits).
fn transform_run(src: [&[f32]; 9], dst: &mut [&mut [f32]], at: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::isa::Isa::detect() == crate::cpu::isa::Isa::Avx512 {
            // SAFETY: AVX-512F detected.
            return unsafe { transform_run_avx512(src, dst, at) };
        }
        if crate::cpu::isa::Isa::detect() >= crate::cpu::isa::Isa::Avx2 {
            // SAFETY: AVX2 detected.
            return unsafe { transform_run_avx2(src, dst, at) };
        }
    }
    transform_run_any(src, dst, at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transform_run_avx512(src: [&[f32]; 9], dst: &mut [&mut [f32]], at: usize) {
    transform_run_any(src, dst, at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transform_run_avx2(src: [&[f32]; 9], dst: &mut [&mut [f32]], at: usize) {
    transform_run_any(src, dst, at)
}

#[inline(always)]
fn transform_run_any(src: [&[f32]; 9], dst: &mut [&mut [f32]], at: usize) {
    const L: usize = 16;
    let len = src[0].len();
    let mut i = 0;
    while i < len {
        if i + L <= len {
            let g: [[f32; L]; 9] = std::array::from_fn(|t| src[t][i..i + L].try_into().expect("L values"));
            for (d, lanes) in dst.iter_mut().zip(kernel_transform(&g)) {
                d[at + i..at + i + L].copy_from_slice(&lanes);
            }
            i += L;
        } else {
            let g: [[f32; 1]; 9] = std::array::from_fn(|t| [src[t][i]]);
            for (d, lane) in dst.iter_mut().zip(kernel_transform(&g)) {
                d[at + i] = lane[0];
            }
            i += 1;
        }
    }
}

/// `G a` of three taps, `L` lanes each: `a₀`, `½(a₀ + a₁ + a₂)`, `½(a₀ − a₁ + a₂)`, `a₂`.
#[inline(always)]
fn g_times<const L: usize>(a: [&[f32; L]; 3]) -> [[f32; L]; 4] {
    let (mut plus, mut minus) = ([0f32; L], [0f32; L]);
    for l in 0..L {
        plus[l] = 0.5 * (a[0][l] + a[1][l] + a[2][l]);
        minus[l] = 0.5 * (a[0][l] - a[1][l] + a[2][l]);
    }
    [*a[0], plus, minus, *a[2]]
}

/// `G g Gᵀ` of `L` 3 × 3 kernels at once (`g[tap][lane]`, taps row-major), out row-major
/// 4 × 4 (`[ξ][lane]`).
#[inline(always)]
fn kernel_transform<const L: usize>(g: &[[f32; L]; 9]) -> [[f32; L]; 16] {
    // G g, column by column: `cols[b][i]`.
    let cols = [
        g_times([&g[0], &g[3], &g[6]]),
        g_times([&g[1], &g[4], &g[7]]),
        g_times([&g[2], &g[5], &g[8]]),
    ];
    let mut out = [[0f32; L]; 16];
    for i in 0..4 {
        out[4 * i..4 * i + 4].copy_from_slice(&g_times([&cols[0][i], &cols[1][i], &cols[2][i]]));
    }
    out
}

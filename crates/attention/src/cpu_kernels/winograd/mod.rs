//! 3×3 convolutions (stride 1, padding 1) by Winograd's minimal filtering F(2×2, 3×3) (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): each 2 × 2 block of outputs
//! from a 4 × 4 patch of the input in 16 products per (input, output) channel pair instead of 36.
//!
//! With `d` a 4 × 4 input patch of one channel, `g` the 3 × 3 kernel of one channel pair and
//!
//! ```text
//! Bᵀ = [1  0 −1  0]     G = [1    0    0 ]     Aᵀ = [1  1  1  0]
//!      [0  1  1  0]         [½    ½    ½ ]          [0  1 −1 −1]
//!      [0 −1  1  0]         [½   −½    ½ ]
//!      [0  1  0 −1]         [0    0    1 ]
//! ```
//!
//! the 2 × 2 output block is `Aᵀ [Σ_ci (G g Gᵀ) ⊙ (Bᵀ d B)] A`. The sum over input channels, for
//! each of the 16 positions `ξ` of the 4 × 4 transformed tiles, is a matrix product
//! `M_ξ (C_out × tiles) = U_ξ (C_out × C_in) · V_ξ (C_in × tiles)`: 16 calls of the layer GEMM
//! ([`super::gemm`], its blocked accumulation included) doing 16/36 of the direct convolution's
//! multiply-adds. The transforms are additions (and the weight's halvings, exact), in f32.
//!
//! Memory stays bounded: the input is transformed a block of tile rows at a time (about 16 MiB
//! of `V` and `M` together), and the transformed weight `U` (16/9 of the weight) is formed per
//! call and dropped after it, so a block holds only its direct weight between calls.

use super::gemm::{self, Bias, Blocking, ColsOf, Epilogue, PackedCols, PackedRows, RowsOf};
use super::im2col::{copy_short, zero_short};
use super::packed::ColGroup;
use crate::cpu::isa::Isa;
use crate::cpu::pool;
use rayon::prelude::*;

mod fused;
mod weight;

/// Whether Winograd beats the direct convolution for this call: channels wide enough that the
/// input and output transforms (linear in the channels) are small next to the products
/// (quadratic), and at least one `B` panel of 2 × 2 tiles, so that the 16 products' tiles are
/// full (fewer tiles leave most of each tile's columns empty). Measured on a 2-core Zen 4 with
/// the AVX-512 tile (32-wide panels), one convolution: 1024 channels at 8 × 8 (16 tiles)
/// direct 7.4 ms, Winograd 9.0; 1280 channels at 2 × 8 × 8 (32 tiles) direct 21.6, Winograd
/// 14.9; 512 channels at 16 × 16 (64 tiles) direct 6.7, Winograd 4.1 – 5.4.
pub(crate) fn pays(isa: Isa, s: Shape) -> bool {
    let (th, tw) = s.tiles();
    s.c_in >= 64 && s.c_out >= 64 && s.batch * th * tw >= isa.nr()
}

/// Bytes of `V` and `M` per block of tile rows.
const BLOCK_BYTES: usize = 16 << 20;

/// The shape of one call.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) batch: usize,
    pub(crate) c_in: usize,
    pub(crate) c_out: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
}

impl Shape {
    /// Tile rows and columns of one image.
    fn tiles(self) -> (usize, usize) {
        (self.h.div_ceil(2), self.w.div_ceil(2))
    }
}

/// The weights of a convolution's 16 products.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// `U` formed whole ([`weight::transform_weight`]).
    Transformed(&'a [PackedRows]),
    /// The direct weight, `U` formed a task's rows at a time ([`fused`]).
    Direct(&'a PackedRows),
}

/// `out = epilogue(conv3x3(x))` for `x (B, C_in, H, W)` and `out (B, C_out, H, W)` with the
/// direct weight `direct` (packed tap-major by `PackedConv`). The epilogue is applied as
/// [`gemm::gemm`]'s write-out applies it.
pub(crate) fn conv(
    isa: Isa,
    blocking: Blocking,
    direct: &PackedRows,
    x: &[f32],
    s: Shape,
    epi: Epilogue,
    out: &mut [f32],
) {
    let (th, tw) = s.tiles();
    let hw = s.h * s.w;
    assert_eq!(x.len(), s.batch * s.c_in * hw);
    assert_eq!(out.len(), s.batch * s.c_out * hw);
    if fused::applies(isa, s.batch * th * tw) {
        return conv_in_blocks(isa, blocking, (Weights::Direct(direct), x), s, epi, out, usize::MAX);
    }
    // Tile rows per block: about 16 MiB of V and M, at least 128 tiles.
    let per_row = 16 * 4 * (s.c_in + s.c_out) * tw;
    let block_rows = (BLOCK_BYTES / per_row).max(128usize.div_ceil(tw));
    let u = weight::transform_weight(direct);
    conv_in_blocks(isa, blocking, (Weights::Transformed(&u), x), s, epi, out, block_rows);
    weight::recycle(u);
}

/// [`conv`] over blocks of `block_rows` tile rows.
fn conv_in_blocks(
    isa: Isa,
    blocking: Blocking,
    (weights, x): (Weights, &[f32]),
    s: Shape,
    epi: Epilogue,
    out: &mut [f32],
    block_rows: usize,
) {
    let (th, tw) = s.tiles();
    let hw = s.h * s.w;
    let block_rows = block_rows.clamp(1, s.batch * th);
    // V's reduction blocks are U's (the products read both by the same blocks).
    let blocks = match weights {
        Weights::Transformed(u) => u[0].blocks.clone(),
        Weights::Direct(d) => weight::u_blocks(d),
    };
    let mut v_bufs: Vec<Vec<f32>> = (0..16).map(|_| pool::take(s.c_in * block_rows * tw)).collect();
    let m_len = 16 * s.c_out * block_rows * tw;
    let mut m_buf = pool::take(m_len);
    m_buf.resize(m_len, 0.0);
    let m = &mut m_buf[..m_len];
    // Output planes by channel: `planes[co][item]`.
    let mut planes: Vec<Vec<&mut [f32]>> = (0..s.c_out).map(|_| Vec::with_capacity(s.batch)).collect();
    for (idx, plane) in out.chunks_exact_mut(hw).enumerate() {
        planes[idx % s.c_out].push(plane);
    }
    let total_rows = s.batch * th;
    for r0 in (0..total_rows).step_by(block_rows) {
        let rows = block_rows.min(total_rows - r0);
        let tiles = rows * tw;
        let m = &mut m[..16 * s.c_out * tiles];
        let mut v: Vec<PackedCols> = v_bufs
            .drain(..)
            .map(|buf| PackedCols::zeros_in(buf, tiles, s.c_in, isa, blocks.clone()))
            .collect();
        transform_input(x, s, r0, rows, &mut v);
        match weights {
            Weights::Direct(direct) => fused::products(isa, direct, &v, m, tiles),
            Weights::Transformed(u) => {
                let products = u.iter().zip(&v).zip(m.chunks_exact_mut(s.c_out * tiles));
                let products = products.map(|((u, v), out)| gemm::Product {
                    a: RowsOf::Packed(u),
                    b: ColsOf::Packed(v),
                    epi: Epilogue::NONE,
                    out,
                });
                gemm::gemm_batch(isa, blocking, products.collect());
            }
        }
        v_bufs = v.into_iter().map(PackedCols::into_data).collect();
        transform_output(m, s, r0, rows, epi, &mut planes);
    }
    pool::give(v_bufs.into_iter().chain([m_buf]));
}

/// `V_ξ[ci, t] = (Bᵀ d B)[ξ]` for the tiles `t` of global tile rows `r0 .. r0 + rows` (row
/// `item·th + ty`), written straight into the 16 packed `B` operands `v` (`(C_in, rows·tw)`
/// each), one task per run of column panels.
fn transform_input(x: &[f32], s: Shape, r0: usize, rows: usize, v: &mut [PackedCols]) {
    let (th, tw) = s.tiles();
    let (hw, tiles) = (s.h * s.w, rows * tw);
    let panels = v[0].panels;
    let per = panels.div_ceil(4 * rayon::current_num_threads());
    // `groups[g][ξ]`: the columns of panel run g of V_ξ.
    let mut groups: Vec<Vec<ColGroup>> = (0..panels.div_ceil(per)).map(|_| Vec::with_capacity(16)).collect();
    for packed in v.iter_mut() {
        for (g, part) in packed.column_groups_mut(per).into_iter().enumerate() {
            groups[g].push(part);
        }
    }
    groups.into_par_iter().for_each(|mut parts| {
        let c0 = parts[0].col0;
        let end = (c0 + parts[0].cols).min(tiles);
        let mut buf = RunScratch::new();
        let mut t = c0;
        while t < end {
            // The run of tiles tx0 .. tx0 + len of one tile row.
            let (gr, tx0) = (r0 + t / tw, t % tw);
            let len = (tw - tx0).min(end - t).min(MAX_RUN);
            let (item, ty) = (gr / th, gr % th);
            let channels = &x[item * s.c_in * hw..][..s.c_in * hw];
            let run = TileRun { ty, tx0, len };
            for (ci, chan) in channels.chunks_exact(hw).enumerate() {
                let at = parts[0].locate(ci);
                run.transform(chan, s, &mut buf, |xi, values| parts[xi].write_run(at, t - c0, values));
            }
            t += len;
        }
    });
}

/// Tiles `tx0 .. tx0 + len` of tile row `ty` of one image.
struct TileRun {
    ty: usize,
    tx0: usize,
    len: usize,
}

impl TileRun {
    /// `Bᵀ d B` of the run's tiles of one channel: `emit(ξ, values of the len tiles)`.
    fn transform(&self, chan: &[f32], s: Shape, buf: &mut RunScratch, mut emit: impl FnMut(usize, &[f32])) {
        let (tx0, len) = (self.tx0, self.len);
        let RunScratch {
            padded,
            even,
            odd,
            hrow,
            out,
        } = buf;
        for (r, h4) in hrow.iter_mut().enumerate() {
            let Some(y) = (2 * self.ty + r).checked_sub(1).filter(|&y| y < s.h) else {
                h4.iter_mut().for_each(|h| zero_short(&mut h[..len]));
                continue;
            };
            // The zero-padded input row (`p[j] = row[j − 1]`) has the 4 patch columns of tile
            // tx at `p[2tx .. 2tx + 4]`; `padded[j] = p[2·tx0 + j]`: row columns lo .. hi.
            let (lo, hi) = ((2 * tx0).saturating_sub(1), (2 * (tx0 + len) + 1).min(s.w));
            let at = lo + 1 - 2 * tx0;
            let padded = &mut padded[..2 * len + 2];
            zero_short(&mut padded[..at]);
            copy_short(&mut padded[at..at + hi - lo], &chan[y * s.w + lo..y * s.w + hi]);
            zero_short(&mut padded[at + hi - lo..]);
            for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(padded.chunks_exact(2)) {
                (*e, *o) = (pair[0], pair[1]);
            }
            row_transform(&even[..=len], &odd[..=len], h4);
        }
        let [r0, r1, r2, r3] = &*hrow;
        for (k, (((h0, h1), h2), h3)) in r0.iter().zip(r1).zip(r2).zip(r3).enumerate() {
            let (h0, h1, h2, h3) = (&h0[..len], &h1[..len], &h2[..len], &h3[..len]);
            // Column k of Bᵀ (d B): rows i = 0..4 of the transformed tiles.
            let out = &mut out[..len];
            combine(out, h0, h2, |a, c| a - c);
            emit(k, out);
            combine(out, h1, h2, |b, c| b + c);
            emit(4 + k, out);
            combine(out, h2, h1, |c, b| c - b);
            emit(8 + k, out);
            combine(out, h1, h3, |b, d| b - d);
            emit(12 + k, out);
        }
    }
}

/// `out[i] = f(a[i], b[i])`.
#[inline(always)]
fn combine(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
}

/// A task's buffers for [`TileRun::transform`].
struct RunScratch {
    padded: [f32; 2 * MAX_RUN + 2],
    even: [f32; MAX_RUN + 1],
    odd: [f32; MAX_RUN + 1],
    /// `d B` of the 4 patch rows: `hrow[r][k][tx]`.
    hrow: [[[f32; MAX_RUN]; 4]; 4],
    out: [f32; MAX_RUN],
}

impl RunScratch {
    fn new() -> Box<RunScratch> {
        Box::new(RunScratch {
            padded: [0.0; 2 * MAX_RUN + 2],
            even: [0.0; MAX_RUN + 1],
            odd: [0.0; MAX_RUN + 1],
            hrow: [[[0.0; MAX_RUN]; 4]; 4],
            out: [0.0; MAX_RUN],
        })
    }
}

/// The longest run of tiles transformed at once (a tile row is cut into runs of this many).
const MAX_RUN: usize = 64;

/// `d B` of every tile of a run: patch columns `p[2tx .. 2tx + 4]` (`even[tx]`, `odd[tx]`,
/// `even[tx + 1]`, `odd[tx + 1]`), out `h4[k][tx]`.
fn row_transform(even: &[f32], odd: &[f32], h4: &mut [[f32; MAX_RUN]; 4]) {
    let len = even.len() - 1;
    let [h0, h1, h2, h3] = h4;
    for tx in 0..len {
        let (d0, d1, d2, d3) = (even[tx], odd[tx], even[tx + 1], odd[tx + 1]);
        h0[tx] = d0 - d2;
        h1[tx] = d1 + d2;
        h2[tx] = d2 - d1;
        h3[tx] = d1 - d3;
    }
}

/// `Aᵀ M A` of every tile of the block into the output planes, then the epilogue.
fn transform_output(m: &[f32], s: Shape, r0: usize, rows: usize, epi: Epilogue, planes: &mut [Vec<&mut [f32]>]) {
    let (th, tw) = s.tiles();
    let (hw, tiles) = (s.h * s.w, rows * tw);
    planes.par_iter_mut().enumerate().for_each(|(co, items)| {
        // `Aᵀ M` of a tile row: `cols[(r·4 + k)·tw + tx]` for output row r of the tile.
        let mut cols = vec![0f32; 8 * tw];
        let mut line = vec![0f32; 2 * (2 * tw)];
        for gr in r0..r0 + rows {
            let (item, ty) = (gr / th, gr % th);
            let t0 = (gr - r0) * tw;
            let mrow = |xi: usize| &m[(xi * s.c_out + co) * tiles + t0..][..tw];
            let (upper, lower) = cols.split_at_mut(4 * tw);
            for k in 0..4 {
                let (m0, m1, m2, m3) = (mrow(k), mrow(4 + k), mrow(8 + k), mrow(12 + k));
                let (u, l) = (&mut upper[k * tw..][..tw], &mut lower[k * tw..][..tw]);
                for tx in 0..tw {
                    u[tx] = m0[tx] + m1[tx] + m2[tx];
                    l[tx] = m1[tx] - m2[tx] - m3[tx];
                }
            }
            // Then `(Aᵀ M) A` of each tile into its two output columns.
            for (sr, dst) in [&*upper, &*lower].into_iter().zip(line.chunks_exact_mut(2 * tw)) {
                let (s0, s1, s2, s3) = (&sr[..tw], &sr[tw..2 * tw], &sr[2 * tw..3 * tw], &sr[3 * tw..]);
                for (tx, pair) in dst.chunks_exact_mut(2).enumerate() {
                    pair[0] = s0[tx] + s1[tx] + s2[tx];
                    pair[1] = s1[tx] - s2[tx] - s3[tx];
                }
            }
            let (top, bottom) = line.split_at(2 * tw);
            let plane = &mut *items[item];
            for (dy, src) in [top, bottom].into_iter().enumerate() {
                let y = 2 * ty + dy;
                if y >= s.h {
                    break;
                }
                let start = y * s.w;
                let res = epi.residual.map(|r| &r[(item * s.c_out + co) * hw + start..][..s.w]);
                let add = epi.item_row.map(|v| v[item * s.c_out + co]);
                write_row(&mut plane[start..start + s.w], &src[..s.w], co, add, res, epi);
            }
        }
    });
}

/// `dst = ((src + bias) + add + residual) / div`, each step an f32 operation and a pass over the
/// row (as the GEMM's write-out).
fn write_row(dst: &mut [f32], src: &[f32], co: usize, add: Option<f32>, res: Option<&[f32]>, epi: Epilogue) {
    match epi.bias {
        Bias::PerRow(b) => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v + b[co]),
        Bias::None => dst.copy_from_slice(src),
        Bias::PerCol(_) => unreachable!("a convolution's bias is per output channel"),
    }
    if let Some(a) = add {
        dst.iter_mut().for_each(|d| *d += a);
    }
    if let Some(r) = res {
        dst.iter_mut().zip(r).for_each(|(d, &r)| *d += r);
    }
    if let Some(q) = epi.div {
        dst.iter_mut().for_each(|d| *d /= q);
    }
}

#[cfg(test)]
mod tests {
    use super::super::im2col;
    use super::*;

    /// The direct 3×3 convolution in f64, `(C_out, C_in, 3, 3)` weights.
    fn direct(x: &[f32], wt: &[f32], s: Shape) -> Vec<f64> {
        let mut out = vec![0f64; s.batch * s.c_out * s.h * s.w];
        for b in 0..s.batch {
            for co in 0..s.c_out {
                for y in 0..s.h {
                    for xx in 0..s.w {
                        let mut acc = 0f64;
                        for ci in 0..s.c_in {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let (iy, ix) = ((y + ky) as isize - 1, (xx + kx) as isize - 1);
                                    if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize {
                                        continue;
                                    }
                                    let xv = x[((b * s.c_in + ci) * s.h + iy as usize) * s.w + ix as usize];
                                    acc += xv as f64 * wt[((co * s.c_in + ci) * 3 + ky) * 3 + kx] as f64;
                                }
                            }
                        }
                        out[((b * s.c_out + co) * s.h + y) * s.w + xx] = acc;
                    }
                }
            }
        }
        out
    }

    /// Deterministic values in [−1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn winograd_matches_the_direct_convolution() {
        let Some(isa) = Isa::with_tiles() else { return };
        let blocking = Blocking::for_isa(isa);
        // Odd and even sizes, a tile row wider than the block, batch > 1 across a block edge.
        // Reduction blocks of whole taps together, of one tap, and of parts of a tap (200
        // channels: blocks of 80, 80, 40 with the AVX-512 tile's depth; also a depth of 24).
        for (batch, c_in, c_out, h, w) in [
            (1, 3, 5, 4, 4),
            (2, 7, 9, 5, 7),
            (3, 16, 13, 9, 6),
            (1, 40, 33, 17, 30),
            (2, 8, 8, 6, 141),
            (1, 200, 14, 6, 5),
        ] {
            let s = Shape {
                batch,
                c_in,
                c_out,
                h,
                w,
            };
            let x = values(batch * c_in * h * w, 1);
            let wt = values(c_out * c_in * 9, 2);
            let bias = values(c_out, 3);
            let want = direct(&x, &wt, s);
            let epi = Epilogue {
                bias: Bias::PerRow(&bias),
                ..Epilogue::NONE
            };
            // Both weight layouts the tiles read (interleaved and row-major), whole and one-tile-
            // row blocks, two reduction depths.
            let layouts = [(isa.mr(), usize::MAX), (1, usize::MAX), (isa.mr(), 1), (1, 1)];
            for ((il, block_rows), kc) in layouts.into_iter().flat_map(|l| [(l, blocking.kc), (l, 24)]) {
                let blocking = Blocking { kc, ..blocking };
                let blocks = im2col::conv_blocks(c_in, 9, kc);
                let mut packed = PackedRows::zeros_with(c_out, c_in * 9, il, blocks);
                for (r, row) in im2col::tap_major(&wt, c_in, 9).chunks_exact(c_in * 9).enumerate() {
                    packed.set_row(r, row);
                }
                let u = weight::transform_weight(&packed);
                for weights in [Weights::Transformed(&u), Weights::Direct(&packed)] {
                    let mut got = vec![0f32; want.len()];
                    conv_in_blocks(isa, blocking, (weights, &x), s, epi, &mut got, block_rows);
                    let hw = h * w;
                    let scale = (c_in * 9) as f64;
                    for (i, (&g, &want)) in got.iter().zip(&want).enumerate() {
                        let want = want + bias[(i / hw) % c_out] as f64;
                        let err = (g as f64 - want).abs();
                        let fused = matches!(weights, Weights::Direct(_));
                        let case = (batch, c_in, c_out, h, w, il, block_rows, kc, fused);
                        assert!(err <= 1e-6 * scale, "{case:?} at {i}: {g} vs {want}");
                    }
                }
            }
        }
    }
}

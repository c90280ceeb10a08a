//! The `B` operand of a convolution: the im2col matrix of an image, never formed whole. Each
//! GEMM task packs the `(kc, NR)` panels of its own columns (output positions) and reduction
//! block (input channel × kernel offset) just before it uses them, so the only copy is one
//! cache-sized block at a time (PyTorch's and Candle's CPU convolutions form the full
//! `(C_in·k·k, H·W)` matrix, 9× the input for a 3×3 kernel).

/// `batch` images `(channels, h, w)` (row-major, one after the other), read as the im2col
/// matrix of a stride-1 convolution with an odd `ksize × ksize` kernel and zero padding
/// `ksize / 2`: row `ci·k·k + ky·k + kx` (PyTorch's weight order), column `y·w + x`, value
/// `x[ci, y + ky − pad, x + kx − pad]` (0 outside the image).
#[derive(Clone, Copy)]
pub(crate) struct Image<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) batch: usize,
    pub(crate) channels: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) ksize: usize,
}

/// Positions `j0 .. j0 + len` of a panel lie in image row `y`, from column `x0` on.
#[derive(Clone, Copy, Default)]
struct Run {
    j0: usize,
    y: usize,
    x0: usize,
    len: usize,
}

impl Image<'_> {
    /// Panels of `nr` columns for the columns `n0 .. n0 + cols` of item `item` and the rows
    /// `p0 .. p0 + kc`: `dst[(jp·kc + kk)·nr + j]` = matrix `[p0 + kk, n0 + jp·nr + j]`, zero
    /// past the last column.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pack(&self, item: usize, p0: usize, kc: usize, n0: usize, cols: usize, nr: usize, dst: &mut [f32]) {
        let (hw, taps) = (self.h * self.w, self.ksize * self.ksize);
        let img = &self.x[item * self.channels * hw..][..self.channels * hw];
        for (jp, panel) in dst.chunks_exact_mut(kc * nr).enumerate() {
            let c0 = n0 + jp * nr;
            let width = nr.min(n0 + cols - c0);
            if self.ksize == 1 {
                for (kk, row) in panel.chunks_exact_mut(nr).enumerate() {
                    row[..width].copy_from_slice(&img[(p0 + kk) * hw + c0..][..width]);
                    row[width..].fill(0.0);
                }
                continue;
            }
            let mut runs = [Run::default(); 64];
            let count = self.runs(c0, width, &mut runs);
            let runs = &runs[..count];
            let pad = (self.ksize / 2) as isize;
            for (kk, row) in panel.chunks_exact_mut(nr).enumerate() {
                let (ci, tap) = ((p0 + kk) / taps, (p0 + kk) % taps);
                let dy = (tap / self.ksize) as isize - pad;
                let dx = (tap % self.ksize) as isize - pad;
                let chan = &img[ci * hw..][..hw];
                row[width..].fill(0.0);
                for r in runs {
                    self.copy_run(chan, r, dy, dx, &mut row[r.j0..r.j0 + r.len]);
                }
            }
        }
    }

    /// Split the positions `c0 .. c0 + width` into runs within one image row.
    fn runs(&self, c0: usize, width: usize, out: &mut [Run; 64]) -> usize {
        let (mut j, mut count) = (0, 0);
        while j < width {
            let (y, x0) = ((c0 + j) / self.w, (c0 + j) % self.w);
            let len = (self.w - x0).min(width - j);
            out[count] = Run { j0: j, y, x0, len };
            count += 1;
            j += len;
        }
        count
    }

    /// One run shifted by `(dy, dx)`: the part inside the image copied, the rest zero.
    fn copy_run(&self, chan: &[f32], r: &Run, dy: isize, dx: isize, dst: &mut [f32]) {
        let y = r.y as isize + dy;
        if y < 0 || y >= self.h as isize {
            dst.fill(0.0);
            return;
        }
        let xs = r.x0 as isize + dx;
        let lo = (-xs).clamp(0, r.len as isize) as usize;
        let hi = (self.w as isize - xs).clamp(lo as isize, r.len as isize) as usize;
        dst[..lo].fill(0.0);
        dst[hi..].fill(0.0);
        if hi > lo {
            let start = y as usize * self.w + (xs + lo as isize) as usize;
            dst[lo..hi].copy_from_slice(&chan[start..start + hi - lo]);
        }
    }
}

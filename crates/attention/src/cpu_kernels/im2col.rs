//! The `B` operand of a convolution: the im2col matrix of an image, never formed whole. Each
//! GEMM task packs the `(kc, NR)` panels of its own columns (output positions) and reduction
//! block (input channel × kernel offset) just before it uses them, so the only copy is one
//! cache-sized block at a time (PyTorch's and Candle's CPU convolutions form the full
//! `(C_in·k·k, H·W)` matrix, 9× the input for a 3×3 kernel).

/// `batch` images `(channels, h, w)` (row-major, one after the other), read as the im2col
/// matrix of a stride-1 convolution with an odd `ksize × ksize` kernel and zero padding
/// `ksize / 2`: row `(ky·k + kx)·channels + ci` (tap-major: [`tap_major`] puts a PyTorch weight
/// in this order), column `y·w + x`, value `x[ci, y + ky − pad, x + kx − pad]` (0 outside the
/// image).
#[derive(Clone, Copy)]
pub(crate) struct Image<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) batch: usize,
    pub(crate) channels: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) ksize: usize,
    /// The image as bf16 bits instead (then `x` is empty): only for the AMX bf16 tiles, which
    /// pack it as it is ([`Image::pack_bits`]).
    pub(crate) bits: Option<&'a [u16]>,
}

/// Positions `j0 .. j0 + len` of a panel lie in image row `y`, from column `x0` on.
#[derive(Clone, Copy)]
struct Run {
    j0: usize,
    y: usize,
    x0: usize,
    len: usize,
}

/// A PyTorch convolution weight `(rows, channels, k, k)` (row-major, `taps = k·k`) in the
/// im2col row order of [`Image`]: `out[r][tap·channels + ci] = w[r][ci·taps + tap]`.
#[cfg(test)]
pub(crate) fn tap_major(w: &[f32], channels: usize, taps: usize) -> Vec<f32> {
    let k = channels * taps;
    let mut out = vec![0f32; w.len()];
    for (src, dst) in w.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        for (ci, taps_of) in src.chunks_exact(taps).enumerate() {
            for (tap, &v) in taps_of.iter().enumerate() {
                dst[tap * channels + ci] = v;
            }
        }
    }
    out
}

/// One row of [`tap_major`]: `src` (`channels · taps` values in PyTorch's order) into `dst`.
pub(crate) fn tap_major_row(src: &[f32], channels: usize, taps: usize, dst: &mut [f32]) {
    for (ci, taps_of) in src.chunks_exact(taps).enumerate() {
        for (tap, &v) in taps_of.iter().enumerate() {
            dst[tap * channels + ci] = v;
        }
    }
}

/// [`tap_major`] undone: PyTorch's order again.
pub(crate) fn torch_order(w: &[f32], channels: usize, taps: usize) -> Vec<f32> {
    let k = channels * taps;
    let mut out = vec![0f32; w.len()];
    for (src, dst) in w.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        for (ci, taps_of) in dst.chunks_exact_mut(taps).enumerate() {
            for (tap, v) in taps_of.iter_mut().enumerate() {
                *v = src[tap * channels + ci];
            }
        }
    }
    out
}

/// The reduction blocks of a convolution weight in [`tap_major`] order: each tap's channels in
/// blocks of about `kc` ([`super::gemm::k_blocks`]), or where a tap has fewer than `kc / 2`
/// channels, whole taps together, as many as fit `kc`. Either way no block holds part of a tap
/// and part of another, which the Winograd weight transform relies on.
pub(crate) fn conv_blocks(channels: usize, taps: usize, kc: usize) -> Vec<(usize, usize)> {
    if 2 * channels >= kc {
        let per_tap = super::gemm::k_blocks(channels, kc);
        (0..taps)
            .flat_map(|t| per_tap.iter().map(move |&(q0, len)| (t * channels + q0, len)))
            .collect()
    } else {
        let per_block = (kc / channels.max(1)).max(1);
        (0..taps)
            .step_by(per_block)
            .map(|t| (t * channels, per_block.min(taps - t) * channels))
            .collect()
    }
}

impl Image<'_> {
    /// Panels of `nr` columns for the columns `n0 .. n0 + cols` of item `item` and the rows
    /// `p0 .. p0 + kc`: `dst[(jp·kc + kk)·nr + j]` = matrix `[p0 + kk, n0 + jp·nr + j]`, zero
    /// past the last column.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pack(&self, item: usize, p0: usize, kc: usize, n0: usize, cols: usize, nr: usize, dst: &mut [f32]) {
        self.pack_from(self.x, (item, p0, kc, n0, cols, nr), dst)
    }

    /// [`Image::pack`] of the bf16 image [`Image::bits`], the values kept as bf16 bits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pack_bits(
        &self,
        item: usize,
        p0: usize,
        kc: usize,
        n0: usize,
        cols: usize,
        nr: usize,
        dst: &mut [u16],
    ) {
        let bits = self.bits.expect("a bf16 image");
        self.pack_from(bits, (item, p0, kc, n0, cols, nr), dst)
    }

    /// [`Image::pack`] from the image's values `x` (f32 or bf16 bits).
    fn pack_from<T: Copy + Default>(
        &self,
        x: &[T],
        (item, p0, kc, n0, cols, nr): (usize, usize, usize, usize, usize, usize),
        dst: &mut [T],
    ) {
        let hw = self.h * self.w;
        let img = &x[item * self.channels * hw..][..self.channels * hw];
        let panels = cols.div_ceil(nr);
        let panel_width = |jp: usize| nr.min(cols - jp * nr);
        if self.ksize == 1 {
            for jp in 0..panels {
                let (c0, width) = (n0 + jp * nr, panel_width(jp));
                for (kk, row) in dst[jp * kc * nr..][..kc * nr].chunks_exact_mut(nr).enumerate() {
                    copy_short(&mut row[..width], &img[(p0 + kk) * hw + c0..][..width]);
                    zero_short(&mut row[width..]);
                }
            }
            return;
        }
        // The runs of every panel (positions within one image row), found once per pack.
        let mut runs = Vec::with_capacity(panels + cols / self.w.max(1) + 1);
        let mut first = Vec::with_capacity(panels + 1);
        for jp in 0..panels {
            first.push(runs.len());
            self.runs(n0 + jp * nr, panel_width(jp), &mut runs);
        }
        first.push(runs.len());
        let (k, pad) = (self.ksize, (self.ksize / 2) as isize);
        // (tap, input channel) of row p0, advanced row by row (no division per row).
        let (mut tap, mut ci) = (p0 / self.channels, p0 % self.channels);
        for kk in 0..kc {
            let (dy, dx) = ((tap / k) as isize - pad, (tap % k) as isize - pad);
            let chan = &img[ci * hw..][..hw];
            for jp in 0..panels {
                let row = &mut dst[(jp * kc + kk) * nr..][..nr];
                zero_short(&mut row[panel_width(jp)..]);
                for r in &runs[first[jp]..first[jp + 1]] {
                    self.copy_run(chan, r, dy, dx, &mut row[r.j0..r.j0 + r.len]);
                }
            }
            ci += 1;
            if ci == self.channels {
                (tap, ci) = (tap + 1, 0);
            }
        }
    }

    /// Ask for the image values that [`Image::pack`] of the same columns and rows `p0 .. p0 +
    /// kc` will read to be brought towards L2 (a hint: nothing is read or written). A task calls
    /// it for its next reduction block before it runs the tiles of this one, so the scattered
    /// image rows (a few hundred bytes per channel, far apart) arrive while it computes; packing
    /// from a cold image otherwise waits on each of them.
    pub(crate) fn prefetch(&self, item: usize, p0: usize, kc: usize, n0: usize, cols: usize) {
        let (hw, kk) = (self.h * self.w, self.ksize * self.ksize);
        if kc == 0 || cols == 0 || p0 + kc > self.channels * kk {
            return;
        }
        // The positions a column range reads, in every channel: `pad` rows and columns around.
        let reach = (self.ksize / 2) * (self.w + 1);
        let (lo, hi) = (n0.saturating_sub(reach), (n0 + cols + reach).min(hw));
        if self.bits.is_some() {
            return;
        }
        let img = &self.x[item * self.channels * hw..][..self.channels * hw];
        // Rows p0 .. p0 + kc read the channels from p0 % channels on, kc of them (all if kc
        // spans a whole tap).
        let first = p0 % self.channels;
        for c in 0..kc.min(self.channels) {
            let ci = (first + c) % self.channels;
            let span = &img[ci * hw + lo..ci * hw + hi];
            for line in span.chunks(16) {
                prefetch_l2(line.as_ptr());
            }
        }
    }

    /// Append the runs (within one image row) of the positions `c0 .. c0 + width`; `j0` counts
    /// from `c0`.
    fn runs(&self, c0: usize, width: usize, out: &mut Vec<Run>) {
        let mut j = 0;
        while j < width {
            let (y, x0) = ((c0 + j) / self.w, (c0 + j) % self.w);
            let len = (self.w - x0).min(width - j);
            out.push(Run { j0: j, y, x0, len });
            j += len;
        }
    }

    /// One run shifted by `(dy, dx)`: the part inside the image copied, the rest zero.
    fn copy_run<T: Copy + Default>(&self, chan: &[T], r: &Run, dy: isize, dx: isize, dst: &mut [T]) {
        let y = r.y as isize + dy;
        if y < 0 || y >= self.h as isize {
            zero_short(dst);
            return;
        }
        let xs = r.x0 as isize + dx;
        let lo = (-xs).clamp(0, r.len as isize) as usize;
        let hi = (self.w as isize - xs).clamp(lo as isize, r.len as isize) as usize;
        zero_short(&mut dst[..lo]);
        zero_short(&mut dst[hi..]);
        if hi > lo {
            let start = y as usize * self.w + (xs + lo as isize) as usize;
            copy_short(&mut dst[lo..hi], &chan[start..start + hi - lo]);
        }
    }
}

/// Hint that the cache line holding `p` will be read soon (into L2); a no-op off x86-64.
#[inline(always)]
fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint and never faults; `p` points into a live slice.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `dst = src` for the few values of a panel row, inline (a `memmove` call per run of 16 values
/// cost more than the copy: 13 % of a 3×3 convolution).
#[inline(always)]
pub(super) fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
    for (d, s) in (&mut d).zip(&mut s) {
        let v: [T; 8] = s.try_into().expect("8 values");
        d.copy_from_slice(&v);
    }
    for (d, &s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = s;
    }
}

/// `dst = 0` for the few values of a panel row, inline.
#[inline(always)]
pub(super) fn zero_short<T: Copy + Default>(dst: &mut [T]) {
    let mut d = dst.chunks_exact_mut(8);
    for d in &mut d {
        d.copy_from_slice(&[T::default(); 8]);
    }
    for d in d.into_remainder() {
        *d = T::default();
    }
}

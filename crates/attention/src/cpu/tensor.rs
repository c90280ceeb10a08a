//! A fast transposed copy ([`contiguous`]), part of the bottom layer ([`crate::cpu`]): every
//! image block swaps its token and channel axes, which Candle copies one element at a time.

use candle_core::{DType, Device, Layout, Result, Storage, Tensor};
use rayon::prelude::*;

/// The elements of a CPU tensor as its layout places them, from the start offset on.
pub(crate) fn cpu_slice<'a, T: candle_core::WithDType>(storage: &'a Storage, layout: &Layout) -> Option<&'a [T]> {
    match storage {
        // An empty view may start past the end of an empty buffer.
        Storage::Cpu(s) => T::cpu_storage_as_slice(s)
            .ok()
            .map(|d| d.get(layout.start_offset()..).unwrap_or(&[])),
        _ => None,
    }
}

/// `x` made contiguous. A batched transpose of a contiguous tensor (`y.transpose(-2, -1)` for
/// contiguous `y`, the token/channel swaps of every image block) on the CPU is copied in tiles,
/// in parallel; anything else is `x.contiguous()`.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    let r = x.rank();
    if x.is_contiguous() || r < 2 || !x.device().is_cpu() || !x.transpose(r - 2, r - 1)?.is_contiguous() {
        return x.contiguous();
    }
    let dims = x.dims();
    let (rows, cols) = (dims[r - 2], dims[r - 1]);
    // x is (.., rows, cols) over storage laid out (.., cols, rows).
    let (storage, layout) = x.storage_and_layout();
    macro_rules! go {
        ($t:ty) => {{
            let src = cpu_slice::<$t>(&storage, layout).expect("a CPU tensor");
            Tensor::from_vec(transpose_batches(src, x.elem_count(), cols, rows), dims, &Device::Cpu)
        }};
    }
    match x.dtype() {
        DType::F32 => go!(f32),
        DType::F16 => go!(half::f16),
        DType::BF16 => go!(half::bf16),
        DType::F64 => go!(f64),
        _ => x.contiguous(),
    }
}

/// `src` holds `len / (rows·cols)` row-major `(rows, cols)` matrices; returns their transposes,
/// one after the other. Blocks of `TILE × TILE` go through a local buffer, so that both the reads
/// and the writes are runs of `TILE` elements (writing single elements down a column of a
/// power-of-two-wide matrix would cycle through one L1 set).
fn transpose_batches<T: Copy + Send + Sync + Default>(src: &[T], len: usize, rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 16;
    let mut out = vec![T::default(); len];
    if len == 0 {
        return out;
    }
    // One job: TILE output rows (= input columns) of one matrix.
    out.par_chunks_mut(rows * cols)
        .zip(src[..len].par_chunks(rows * cols))
        .for_each(|(dst, src)| {
            dst.par_chunks_mut(TILE * rows).enumerate().for_each(|(t, dst)| {
                let c0 = t * TILE;
                let cw = TILE.min(cols - c0);
                let mut buf = [[T::default(); TILE]; TILE];
                for r0 in (0..rows).step_by(TILE) {
                    let rh = TILE.min(rows - r0);
                    for r in 0..rh {
                        let row = &src[(r0 + r) * cols + c0..][..cw];
                        for (c, &v) in row.iter().enumerate() {
                            buf[c][r] = v;
                        }
                    }
                    for (c, col) in buf.iter().take(cw).enumerate() {
                        dst[c * rows + r0..][..rh].copy_from_slice(&col[..rh]);
                    }
                }
            });
        });
    out
}

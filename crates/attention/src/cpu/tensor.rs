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

/// Elements per parallel job of [`cast`] (a few L2-sized runs per thread on large tensors).
const CAST_CHUNK: usize = 1 << 16;

/// `x` converted to `dtype`, where both are f32, f16 or bf16 and `x` is a contiguous CPU tensor:
/// in parallel, vectorised (`half`'s slice conversions), each value rounded to nearest even as
/// `Tensor::to_dtype` rounds it (the same bits); `None` elsewhere. Candle converts one element at
/// a time on one thread, which a half-precision model pays at every layer (its input widened,
/// its output rounded).
pub(crate) fn cast(x: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
    use half::slice::HalfFloatSliceExt;
    let supported = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    if !x.device().is_cpu() || !x.is_contiguous() || !supported(x.dtype()) || !supported(dtype) || x.dtype() == dtype {
        return Ok(None);
    }
    let (storage, layout) = x.storage_and_layout();
    let n = x.elem_count();
    macro_rules! widen {
        ($t:ty) => {{
            let src = &cpu_slice::<$t>(&storage, layout).expect("a CPU tensor")[..n];
            let mut out = vec![0f32; n];
            out.par_chunks_mut(CAST_CHUNK)
                .zip(src.par_chunks(CAST_CHUNK))
                .for_each(|(d, s)| s.convert_to_f32_slice(d));
            Tensor::from_vec(out, x.dims(), &Device::Cpu)?
        }};
    }
    macro_rules! narrow {
        ($t:ty) => {{
            let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..n];
            let mut out = vec![<$t>::ZERO; n];
            out.par_chunks_mut(CAST_CHUNK)
                .zip(src.par_chunks(CAST_CHUNK))
                .for_each(|(d, s)| d.convert_from_f32_slice(s));
            Tensor::from_vec(out, x.dims(), &Device::Cpu)?
        }};
    }
    let y = match (x.dtype(), dtype) {
        (DType::F16, DType::F32) => widen!(half::f16),
        (DType::BF16, DType::F32) => widen!(half::bf16),
        (DType::F32, DType::F16) => narrow!(half::f16),
        (DType::F32, DType::BF16) => narrow!(half::bf16),
        _ => return Ok(None),
    };
    Ok(Some(y))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`cast`] gives `to_dtype`'s bits both ways, on ties, subnormals, infinities, NaN and
    /// values past the half types' range, over several parallel chunks.
    #[test]
    fn cast_gives_to_dtypes_bits() {
        let special = [
            0.0f32,
            -0.0,
            1.0 + f32::EPSILON * 4096.0, // a bf16 tie
            1.0 + f32::EPSILON * 12288.0,
            1e-40,
            -3e-39,
            6e-8,
            65520.0,
            3e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let n = 3 * CAST_CHUNK + 17;
        let mut s = 7u64;
        let v: Vec<f32> = (0..n)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                special.get(i % 40).copied().unwrap_or(f32::from_bits((s >> 32) as u32))
            })
            .collect();
        let x = Tensor::from_vec(v, (n,), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let f = t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            f.iter()
                .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
                .collect()
        };
        for dt in [DType::F16, DType::BF16] {
            let ours = cast(&x, dt).unwrap().expect("a supported cast");
            let theirs = x.to_dtype(dt).unwrap();
            assert_eq!(bits(&ours), bits(&theirs), "f32 -> {dt:?}");
            let back = cast(&theirs, DType::F32).unwrap().expect("a supported cast");
            assert_eq!(
                bits(&back),
                bits(&theirs.to_dtype(DType::F32).unwrap()),
                "{dt:?} -> f32"
            );
        }
        assert!(cast(&x, DType::F64).unwrap().is_none());
        assert!(cast(&x.to_dtype(DType::F16).unwrap(), DType::BF16).unwrap().is_none());
    }
}

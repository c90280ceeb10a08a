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

/// Values a [`Half`] loop widens and rounds at a time (on the stack).
const RUN: usize = 512;

/// The half-precision element types, widened to f32 and rounded back a run at a time: f16 by
/// `half`'s slice conversions (F16C where the CPU has it), bf16 by bit operations the compiler
/// vectorises. Both round to nearest, ties to even, NaN kept a quiet NaN: `to_dtype`'s bits.
pub(crate) trait Half: Copy + Send + Sync + 'static {
    const ZERO: Self;
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Half for half::f16 {
    const ZERO: Self = half::f16::ZERO;
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl Half for half::bf16 {
    const ZERO: Self = half::bf16::ZERO;
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = f32::from_bits((s.to_bits() as u32) << 16));
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.iter_mut().zip(src).for_each(|(d, &x)| {
            let b = x.to_bits();
            let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
            let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
            *d = half::bf16::from_bits(if nan { (b >> 16) as u16 | 0x0040 } else { rounded });
        });
    }
}

/// `f` on runs of widened values of `src`, each result run rounded into `dst`.
fn map_runs<T: Half>(src: &[T], dst: &mut [T], f: &(impl Fn(&mut [f32]) + Sync)) {
    let mut buf = [0f32; RUN];
    for (s, d) in src.chunks(RUN).zip(dst.chunks_mut(RUN)) {
        let b = &mut buf[..s.len()];
        T::widen(s, b);
        f(b);
        T::narrow(b, d);
    }
}

/// `x` converted to `dtype`, where both are f32, f16 or bf16 and `x` is a contiguous CPU tensor:
/// in parallel, vectorised ([`Half`]), each value rounded to nearest even as `Tensor::to_dtype`
/// rounds it (the same bits); `None` elsewhere. Candle converts one element at a time on one
/// thread, which a half-precision model pays at every layer (its input widened, its output
/// rounded).
pub(crate) fn cast(x: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
    let supported = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    if !x.device().is_cpu() || !x.is_contiguous() || !supported(x.dtype()) || !supported(dtype) || x.dtype() == dtype {
        return Ok(None);
    }
    let (storage, layout) = x.storage_and_layout();
    let n = x.elem_count();
    fn widen<T: Half + candle_core::WithDType>(storage: &Storage, layout: &Layout, n: usize) -> Vec<f32> {
        let src = &cpu_slice::<T>(storage, layout).expect("a CPU tensor")[..n];
        let mut out = vec![0f32; n];
        out.par_chunks_mut(CAST_CHUNK)
            .zip(src.par_chunks(CAST_CHUNK))
            .for_each(|(d, s)| T::widen(s, d));
        out
    }
    fn narrow<T: Half + candle_core::WithDType>(storage: &Storage, layout: &Layout, n: usize) -> Vec<T> {
        let src = &cpu_slice::<f32>(storage, layout).expect("a CPU tensor")[..n];
        let mut out = vec![T::ZERO; n];
        out.par_chunks_mut(CAST_CHUNK)
            .zip(src.par_chunks(CAST_CHUNK))
            .for_each(|(d, s)| T::narrow(s, d));
        out
    }
    let dims = x.dims();
    let y = match (x.dtype(), dtype) {
        (DType::F16, DType::F32) => Tensor::from_vec(widen::<half::f16>(&storage, layout, n), dims, &Device::Cpu)?,
        (DType::BF16, DType::F32) => Tensor::from_vec(widen::<half::bf16>(&storage, layout, n), dims, &Device::Cpu)?,
        (DType::F32, DType::F16) => Tensor::from_vec(narrow::<half::f16>(&storage, layout, n), dims, &Device::Cpu)?,
        (DType::F32, DType::BF16) => Tensor::from_vec(narrow::<half::bf16>(&storage, layout, n), dims, &Device::Cpu)?,
        _ => return Ok(None),
    };
    Ok(Some(y))
}

/// `f` applied to every element of a contiguous f16 / bf16 CPU tensor, each value widened to f32
/// and the result rounded once to the tensor's dtype (nearest, ties to even), in parallel: the
/// half-precision elementwise ops PyTorch's CPU kernels compute in f32 (`None` for other
/// tensors).
pub(crate) fn map_half(x: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> Result<Option<Tensor>> {
    if !x.device().is_cpu() || !x.is_contiguous() || !matches!(x.dtype(), DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let (storage, layout) = x.storage_and_layout();
    let n = x.elem_count();
    let run = |v: &mut [f32]| v.iter_mut().for_each(|v| *v = f(*v));
    fn go<T: Half + candle_core::WithDType>(
        s: &Storage,
        l: &Layout,
        n: usize,
        run: &(impl Fn(&mut [f32]) + Sync),
    ) -> Vec<T> {
        let src = &cpu_slice::<T>(s, l).expect("a CPU tensor")[..n];
        let mut out = vec![T::ZERO; n];
        out.par_chunks_mut(CAST_CHUNK)
            .zip(src.par_chunks(CAST_CHUNK))
            .for_each(|(d, s)| map_runs(s, d, run));
        out
    }
    Ok(Some(match x.dtype() {
        DType::F16 => Tensor::from_vec(go::<half::f16>(&storage, layout, n, &run), x.dims(), &Device::Cpu)?,
        _ => Tensor::from_vec(go::<half::bf16>(&storage, layout, n, &run), x.dims(), &Device::Cpu)?,
    }))
}

/// `a + b` for two contiguous f16 / bf16 CPU tensors of one shape and dtype: each sum in f32,
/// rounded once (nearest, ties to even), in parallel, as PyTorch's CPU add computes it (`None`
/// for other tensors).
pub(crate) fn add_half(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    let half = matches!(a.dtype(), DType::F16 | DType::BF16);
    let cpu = a.device().is_cpu() && b.device().is_cpu();
    if !half || !cpu || a.dtype() != b.dtype() || a.dims() != b.dims() || !a.is_contiguous() || !b.is_contiguous() {
        return Ok(None);
    }
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let n = a.elem_count();
    fn go<T: Half + candle_core::WithDType>(x: &[T], y: &[T]) -> Vec<T> {
        let mut out = vec![T::ZERO; x.len()];
        out.par_chunks_mut(CAST_CHUNK)
            .zip(x.par_chunks(CAST_CHUNK).zip(y.par_chunks(CAST_CHUNK)))
            .for_each(|(d, (x, y))| {
                let (mut bx, mut by) = ([0f32; RUN], [0f32; RUN]);
                for ((d, x), y) in d.chunks_mut(RUN).zip(x.chunks(RUN)).zip(y.chunks(RUN)) {
                    let (bx, by) = (&mut bx[..x.len()], &mut by[..x.len()]);
                    T::widen(x, bx);
                    T::widen(y, by);
                    bx.iter_mut().zip(by.iter()).for_each(|(a, b)| *a += b);
                    T::narrow(bx, d);
                }
            });
        out
    }
    macro_rules! run {
        ($t:ty) => {{
            let x = &cpu_slice::<$t>(&sa, la).expect("a CPU tensor")[..n];
            let y = &cpu_slice::<$t>(&sb, lb).expect("a CPU tensor")[..n];
            Tensor::from_vec(go(x, y), a.dims(), &Device::Cpu)?
        }};
    }
    Ok(Some(match a.dtype() {
        DType::F16 => run!(half::f16),
        _ => run!(half::bf16),
    }))
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
        // The half-precision elementwise helpers: Candle's f32 ops, rounded once.
        let y = Tensor::from_vec(
            (0..n).map(|i| (i % 97) as f32 * 0.37 - 11.0).collect(),
            (n,),
            &Device::Cpu,
        )
        .unwrap();
        for dt in [DType::F16, DType::BF16] {
            let (a, b) = (x.to_dtype(dt).unwrap(), y.to_dtype(dt).unwrap());
            let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = (wide(&a) + wide(&b)).unwrap().to_dtype(dt).unwrap();
            assert_eq!(bits(&add_half(&a, &b).unwrap().unwrap()), bits(&want), "{dt:?} add");
            let want = candle_nn::ops::silu(&wide(&b)).unwrap().to_dtype(dt).unwrap();
            let silu = map_half(&b, |v| v / (1.0 + (-v).exp())).unwrap().unwrap();
            assert_eq!(bits(&silu), bits(&want), "{dt:?} silu");
        }
        assert!(cast(&x.to_dtype(DType::F16).unwrap(), DType::BF16).unwrap().is_none());
    }
}

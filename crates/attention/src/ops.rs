//! The tensor operations of the PyTorch code, each with the rounding PyTorch's CPU kernels give
//! it: the ops layer, above the kernels ([`crate::cpu_kernels`]) and the bottom layer
//! (`crate::cpu`), below the attention core ([`crate::sdpa`]) and the layers, which build on
//! these.
//!
//! In f32 and f64 every function here is the plain math. In f16/bf16 they mirror where PyTorch
//! (2.15, CPU) rounds to the half type: [`matmul`] (`@`, `bmm`, `einsum`), [`mul`] / [`div`] by
//! a Python float and [`softmax`] are computed in f32 and rounded once to the input dtype, as
//! PyTorch's kernels do (f32 accumulation). Candle's own half-precision ops differ here:
//! `Tensor * f64` rounds the scalar to the half type first, and its CPU softmax and sums
//! accumulate in the half type (Candle issue #3727).
//!
//! **On CUDA** half operands go to Candle's matmul as they are ([`native_half_gemm`]): Candle
//! calls cuBLAS with `CUBLAS_COMPUTE_32F` for f16/bf16 (f32 accumulation, one rounding of the
//! product, as PyTorch's CUDA matmul) unless `set_gemm_reduced_precision_f16/bf16(true)` was
//! called, so the f32 copies the CPU path makes would only cost time (and tensor cores).

use crate::cpu::contiguous;
use candle_core::{DType, Result, Tensor};

/// The dtype attention arithmetic runs in for inputs of `dtype`: f32 for half types.
pub fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// Whether `dtype` is f16 or bf16.
pub fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `x` in its compute dtype (f32 for half inputs; f32/f64 unchanged).
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    cast(x, compute_dtype(x.dtype()))
}

/// [`cast`] as a method, for chains (`y.cast_to(x.dtype())`).
pub trait CastTo {
    fn cast_to(&self, dtype: DType) -> Result<Tensor>;
}

impl CastTo for Tensor {
    fn cast_to(&self, dtype: DType) -> Result<Tensor> {
        cast(self, dtype)
    }
}

/// `x.to_dtype(dtype)`, the same bits; between f32 and f16/bf16 on the CPU in parallel
/// (`crate::cpu::cast`).
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    match crate::cpu::cast(x, dtype)? {
        Some(y) => Ok(y),
        None => x.to_dtype(dtype),
    }
}

/// `x.float()` written in a published forward (guided-diffusion's `softmax(weight.float())`,
/// diffusers' `upcast_attention` / `upcast_softmax`): f16/bf16 to f32; f32 unchanged; f64
/// unchanged, or rounded to f32 where the float64 run keeps the published casts
/// ([`crate::float64_run::Casts::Kept`]: a plain `.double()` twin).
pub fn published_float(x: &Tensor) -> Result<Tensor> {
    let kept = crate::float64_run::casts_kept();
    match x.dtype() {
        DType::F64 if kept => x.to_dtype(DType::F32),
        DType::F64 => Ok(x.clone()),
        _ => upcast(x),
    }
}

/// Round `x` to `dtype` and back to `x`'s dtype: a cast point of the PyTorch code.
pub fn round_through(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == x.dtype() {
        return Ok(x.clone());
    }
    x.to_dtype(dtype)?.to_dtype(x.dtype())
}

/// Whether a product with `x` as its left operand may run in `x`'s half dtype itself: `x` on a
/// CUDA device, f16 or bf16, Candle's cuBLAS call accumulating in f32 for that dtype (its
/// reduced-precision flag off), no stage trace being recorded (a trace keeps the reference
/// path everywhere) and the CUDA layers on ([`cuda_layers`]; an invalid setting counts as off
/// here, the fused layers and convolutions report it).
pub fn native_half(x: &Tensor) -> bool {
    let f32_accumulation = match x.dtype() {
        DType::F16 => !candle_core::cuda::gemm_reduced_precision_f16(),
        DType::BF16 => !candle_core::cuda::gemm_reduced_precision_bf16(),
        _ => false,
    };
    f32_accumulation && x.device().is_cuda() && !crate::trace::enabled() && matches!(cuda_layers(), Ok(true))
}

/// Whether the CUDA layers (fused kernels, products and convolutions in the input's half dtype)
/// are on: `UNET_ATTENTION_CUDA_LAYERS` (`unet_attention::cuda::layers_enabled`); `false`
/// without the `cuda` feature.
pub fn cuda_layers() -> Result<bool> {
    #[cfg(feature = "cuda")]
    return crate::cuda::layers_enabled();
    #[cfg(not(feature = "cuda"))]
    Ok(false)
}

/// [`native_half`] for `a @ b`: `b` of `a`'s dtype on `a`'s device too.
pub fn native_half_gemm(a: &Tensor, b: &Tensor) -> bool {
    native_half(a) && b.dtype() == a.dtype() && b.device().same_device(a.device())
}

/// `a @ b` (`torch.matmul`/`bmm`/`einsum` on same-rank batched operands): accumulated in at
/// least f32, rounded once to `a`'s dtype (on CUDA in half precision by cuBLAS itself, see
/// [`native_half_gemm`]).
///
/// An f32 product on the CPU whose reduction is deeper than `2 ·` [`MATMUL_KC`] is summed in
/// blocks of [`MATMUL_KC`] (one product per block, the block sums added in order), as PyTorch's
/// `bmm` (MKL) blocks it: Candle's CPU GEMM accumulates a reduction of a few hundred in one chain
/// of fused multiply-adds, whose error grows with the depth. Measured on ldm's `LinAttnBlock`
/// (the 416-token context sum of `c01606`, validation set `w`): one chain 2.4× PyTorch's RMS
/// error, beyond all of 300 PyTorch runs on nudged inputs (`scripts/accuracy_spread.py`).
/// Half-precision inputs keep one product (their committed bit-identity with PyTorch).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if native_half_gemm(a, b) {
        return contiguous(a)?.matmul(&contiguous(b)?);
    }
    let dtype = a.dtype();
    let (a, b) = (contiguous(&upcast(a)?)?, contiguous(&upcast(b)?)?);
    if dtype == DType::F32 {
        return blocked_matmul(&a, &b);
    }
    a.matmul(&b)?.to_dtype(dtype)
}

/// Depth of the reduction blocks of an f32 CPU [`matmul`].
pub const MATMUL_KC: usize = 64;

/// `a @ b`, the reduction in blocks of [`MATMUL_KC`] where it is deeper than twice that (f32 on
/// the CPU; elsewhere one product).
fn blocked_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    let k = if ra >= 2 { a.dim(ra - 1)? } else { 0 };
    if !a.device().is_cpu() || rb < 2 || b.dim(rb - 2)? != k || k <= 2 * MATMUL_KC {
        return a.matmul(b);
    }
    let mut sum: Option<Tensor> = None;
    for k0 in (0..k).step_by(MATMUL_KC) {
        let len = MATMUL_KC.min(k - k0);
        let part = a
            .narrow(ra - 1, k0, len)?
            .contiguous()?
            .matmul(&b.narrow(rb - 2, k0, len)?.contiguous()?)?;
        sum = Some(match sum {
            Some(s) => (s + part)?,
            None => part,
        });
    }
    sum.ok_or_else(|| candle_core::Error::Msg("matmul: an empty reduction".into()))
}

/// `a + b` of tensors of one shape, as PyTorch's CPU kernel adds them: in f32, each element
/// rounded once to the dtype (round to nearest, ties to even). Candle 0.11's NEON `bf16` add
/// narrows its f32 sums by truncation (`vshrn`), one ulp toward zero from PyTorch's result in
/// about half of the elements, a bias that a residual stack accumulates; on aarch64 a bfloat16
/// CPU sum therefore goes through f32 here. Elsewhere Candle's own add (its AVX2 and scalar paths
/// round to nearest).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    // Contiguous half-precision operands of one shape: one parallel pass (Candle's half add is
    // one thread, widening through a buffer).
    if let Some(sum) = crate::cpu::add_half(a, b)? {
        return Ok(sum);
    }
    if cfg!(target_arch = "aarch64") && a.dtype() == DType::BF16 && a.device().is_cpu() {
        return add_through_f32(a, b);
    }
    a + b
}

/// [`add`]'s f32 form: both operands widened, added, the sum rounded once.
fn add_through_f32(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    (a.to_dtype(DType::F32)? + b.to_dtype(DType::F32)?)?.to_dtype(a.dtype())
}

/// `x * s` for a Python float `s`: the product in at least f32, rounded once (Candle's `x * s`
/// on a half tensor would first round `s` itself to the half type).
pub fn mul(x: &Tensor, s: f64) -> Result<Tensor> {
    if s == 1.0 {
        return Ok(x.clone());
    }
    upcast(x)?.affine(s, 0.0)?.to_dtype(x.dtype())
}

/// `x / d` for a Python float `d`: a true division in at least f32, rounded once, as PyTorch's
/// CPU kernels divide by `d` rounded to f32. (Its CUDA kernel multiplies by `1/d` instead when
/// `d` is a CPU scalar: at most one rounding of the output dtype apart; this keeps the division.)
pub fn div(x: &Tensor, d: f64) -> Result<Tensor> {
    if d == 1.0 {
        return Ok(x.clone());
    }
    let xc = upcast(x)?;
    // Built in f32 unless the run is f64: Metal has no f64 tensors.
    let d = match xc.dtype() {
        DType::F64 => Tensor::full(d, (), x.device())?,
        dtype => Tensor::full(d as f32, (), x.device())?.to_dtype(dtype)?,
    };
    xc.broadcast_div(&d)?.to_dtype(x.dtype())
}

/// Softmax over `dim` in the compute dtype ([`compute_dtype`]: f32 for half inputs); the
/// result stays in the compute dtype (a softmax of `x.float()`).
pub fn softmax_upcast<Dm: candle_core::shape::Dim>(xs: &Tensor, dim: Dm) -> Result<Tensor> {
    let dim = dim.to_index(xs.shape(), "softmax")?;
    let last = xs.rank() - 1;
    let xs = upcast(xs)?;
    if xs.elem_count() == 0 {
        // Nothing to normalize (no keys, or no rows); Candle's kernel panics on a zero-length row.
        return Ok(xs);
    }
    if dim == last {
        candle_nn::ops::softmax_last_dim(&contiguous(&xs)?)
    } else {
        let moved = contiguous(&xs.transpose(dim, last)?)?;
        candle_nn::ops::softmax_last_dim(&moved)?.transpose(dim, last)
    }
}

/// `x.softmax(dim)`: accumulated in at least f32 (PyTorch's CPU kernel), in `x`'s dtype.
pub fn softmax<Dm: candle_core::shape::Dim>(xs: &Tensor, dim: Dm) -> Result<Tensor> {
    softmax_upcast(xs, dim)?.to_dtype(xs.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// bfloat16 sums round to nearest as PyTorch's do, on every architecture: sums whose f32
    /// value lies above the halfway point between two bfloat16 values round up (Candle's NEON
    /// add truncated them on aarch64), ties to even.
    #[test]
    fn bfloat16_sums_round_to_nearest() {
        let dev = Device::Cpu;
        // 256 + 1.5 = 257.5: bfloat16 holds 256 and 258 there (8 bits of mantissa), and 257.5 is
        // nearer 258; 256 + 1 = 257 is a tie, to even (256). 16 elements: the vector path.
        let a = Tensor::full(256f32, 16, &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for (b, want) in [(1.5f32, 258f32), (1.0, 256.0), (-1.5, 254.0), (3.0, 260.0)] {
            let b = Tensor::full(b, 16, &dev).unwrap().to_dtype(DType::BF16).unwrap();
            let got = add(&a, &b)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert!(got.iter().all(|&g| g == want), "256 + {b}: {got:?}, want {want}");
            let widened = add_through_f32(&a, &b)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(got, widened);
        }
    }

    /// A deep f32 reduction is summed in blocks: on 4096 products of 0.1 the blocked sum is far
    /// closer to the exact one than Candle's single chain, and a product that is not deep is
    /// Candle's own, bit for bit.
    #[test]
    fn deep_f32_products_are_summed_in_blocks() {
        let dev = Device::Cpu;
        let k = 4096;
        let a = Tensor::full(0.1f32, (2, 1, k), &dev).unwrap();
        let b = Tensor::ones((2, k, 3), DType::F32, &dev).unwrap();
        let exact = 0.1f32 as f64 * k as f64;
        let err = |t: Tensor| -> f64 {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| (*x as f64 - exact).abs()).fold(0.0, f64::max)
        };
        let blocked = err(matmul(&a, &b).unwrap());
        let chain = err(a.matmul(&b).unwrap());
        assert!(blocked * 8.0 < chain, "blocked {blocked:e}, one chain {chain:e}");
        let (a, b) = (
            a.narrow(2, 0, 2 * MATMUL_KC).unwrap(),
            b.narrow(1, 0, 2 * MATMUL_KC).unwrap(),
        );
        let ours = matmul(&a, &b).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let candle = a.matmul(&b).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(ours, candle);
    }
}

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
    x.to_dtype(compute_dtype(x.dtype()))
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
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if native_half_gemm(a, b) {
        return contiguous(a)?.matmul(&contiguous(b)?);
    }
    let dtype = a.dtype();
    contiguous(&upcast(a)?)?
        .matmul(&contiguous(&upcast(b)?)?)?
        .to_dtype(dtype)
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

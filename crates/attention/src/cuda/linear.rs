//! `nn.Linear` with a bias in f16/bf16 on CUDA as PyTorch computes it there: one cuBLAS GEMM
//! `y = x·Wᵀ + b` whose f32 accumulator takes the bias before the single rounding to the
//! storage dtype ([`linear_with_bias`]).
//!
//! PyTorch 2.x's `F.linear` on a contiguous input with a bias runs `addmm(bias, x, Wᵀ)`, which
//! on CUDA is either cuBLASLt with its bias epilogue or cuBLAS's `C = A·B + β·C` over a copy of
//! the bias (β = 1); both sum the bias into the f32 accumulator and round once. A product
//! rounded to f16 and then added to the bias rounds twice. Here: the bias broadcast to the
//! output's rows, then `cublasGemmEx` with β = 1 over it, in place (f32 compute type, the path
//! PyTorch takes without cuBLASLt): one pass over the output more than the product alone, as
//! the separate bias add it replaces.
//!
//! **Status: compiled in CI, never run on a GPU yet**; the GPU kit's `layers` stage
//! (`examples/layers_check.rs`, "projection") checks it against the CPU's f32 product and bias
//! rounded once.

use candle_core::cuda::cudarc::cublas::{sys, CudaBlas, Gemm, GemmConfig};
use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{bail, CpuStorage, DType, InplaceOp3, Layout, Result, Tensor, D};

/// `x · weightᵀ + bias` on `x`'s last dimension, `(.., in)` → `(.., out)`, in `x`'s dtype with
/// the bias inside cuBLAS's f32 sum (see the module docs). `None` where it does not apply: not
/// CUDA, not f16/bf16, operands of other dtypes or devices, a weight that is not `(out, in)` or
/// a bias that is not `(out)`, an empty operand, or sizes past cuBLAS's 32-bit arguments.
pub fn linear_with_bias(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Option<Tensor>> {
    let dtype = x.dtype();
    let same = |t: &Tensor| t.dtype() == dtype && t.device().same_device(x.device());
    if !x.device().is_cuda() || !matches!(dtype, DType::F16 | DType::BF16) || !same(weight) || !same(bias) {
        return Ok(None);
    }
    if x.rank() == 0 || weight.rank() != 2 || bias.rank() != 1 {
        return Ok(None);
    }
    let k = x.dim(D::Minus1)?;
    let (n, k_weight) = weight.dims2()?;
    let m = x.elem_count() / k.max(1);
    let fits = |v: usize| v > 0 && v <= i32::MAX as usize;
    if k_weight != k || bias.dim(0)? != n || ![m, n, k].into_iter().all(fits) {
        return Ok(None);
    }
    let rows = x.contiguous()?.reshape((m, k))?;
    // The output starts as the bias in every row, in storage of its own (a broadcast made
    // contiguous is a copy; one row is copied explicitly, as its view would be the bias's).
    let out = if m > 1 {
        bias.broadcast_as((m, n))?.contiguous()?
    } else {
        bias.reshape((1, n))?.copy()?
    };
    out.inplace_op3(&rows, &weight.contiguous()?, &AccumulateProduct)?;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank ≥ 1") = n;
    Ok(Some(out.reshape(dims)?))
}

/// `out (m, n) += rows (m, k) · weightᵀ (weight (n, k))` in one GEMM with β = 1, in place.
struct AccumulateProduct;

impl InplaceOp3 for AccumulateProduct {
    fn name(&self) -> &'static str {
        "unet-linear-with-bias"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        bail!("linear_with_bias runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        out: &mut CudaStorage,
        ol: &Layout,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<()> {
        let (m, k) = xl.shape().dims2()?;
        let (n, _) = wl.shape().dims2()?;
        if !xl.is_contiguous() || !wl.is_contiguous() || !ol.is_contiguous() || ol.dims() != [m, n] {
            bail!(
                "linear_with_bias: expected contiguous (m, n), (m, k), (n, k) operands, found {:?}, {:?}, {:?}",
                ol.dims(),
                xl.dims(),
                wl.dims()
            )
        }
        let at = Offsets {
            out: ol.start_offset(),
            x: xl.start_offset(),
            w: wl.start_offset(),
        };
        let dev = x.device.clone();
        match (&mut out.slice, &x.slice, &w.slice) {
            (CudaStorageSlice::F16(os), CudaStorageSlice::F16(xs), CudaStorageSlice::F16(ws)) => {
                gemm(&dev, (os, xs, ws), at, (m, n, k), half::f16::ONE)
            }
            (CudaStorageSlice::BF16(os), CudaStorageSlice::BF16(xs), CudaStorageSlice::BF16(ws)) => {
                gemm(&dev, (os, xs, ws), at, (m, n, k), half::bf16::ONE)
            }
            _ => bail!("linear_with_bias: expected three f16 or three bf16 operands"),
        }
    }
}

/// Where each operand starts in its storage, in elements.
#[derive(Clone, Copy)]
struct Offsets {
    out: usize,
    x: usize,
    w: usize,
}

/// `out = x · wᵀ + out` by cuBLAS (column-major: `outᵀ (n × m) = w (op T of the k × n view) ·
/// xᵀ (k × m) + outᵀ`), α = β = 1, f32 compute type (cudarc's `Gemm` for f16/bf16).
fn gemm<T>(
    dev: &CudaDevice,
    (out, x, w): (&mut CudaSlice<T>, &CudaSlice<T>, &CudaSlice<T>),
    at: Offsets,
    (m, n, k): (usize, usize, usize),
    one: T,
) -> Result<()>
where
    T: DeviceRepr + Copy,
    CudaBlas: Gemm<T>,
{
    let cfg = GemmConfig {
        transa: sys::cublasOperation_t::CUBLAS_OP_T,
        transb: sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: one,
        lda: k as i32,
        ldb: k as i32,
        beta: one,
        ldc: n as i32,
    };
    let blas = dev.cublas_handle();
    // SAFETY: `w` holds n rows of k, `x` m rows of k and `out` m rows of n elements from the
    // given offsets (checked contiguous above), which is what the leading dimensions describe;
    // cuBLAS runs on the device's stream, as Candle's own GEMMs.
    unsafe {
        blas.gemm(
            cfg,
            &w.slice(at.w..at.w + n * k),
            &x.slice(at.x..at.x + m * k),
            &mut out.slice_mut(at.out..at.out + m * n),
        )
    }
    .w()?;
    Ok(())
}

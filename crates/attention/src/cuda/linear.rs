//! `nn.Linear` with a bias in f16/bf16 on CUDA as PyTorch computes it there: one cuBLAS GEMM
//! `y = x·Wᵀ + b` whose f32 accumulator takes the bias before the single rounding to the
//! storage dtype ([`linear_with_bias`]).
//!
//! PyTorch 2.x's `F.linear` on a contiguous input with a bias runs `addmm(bias, x, Wᵀ)`, which
//! on CUDA is either cuBLASLt with its bias epilogue or cuBLAS's `C = A·B + β·C` over a copy of
//! the bias (β = 1); both sum the bias into the f32 accumulator and round once. A product
//! rounded to f16 and then added to the bias rounds twice. Here: the bias broadcast to the
//! output's rows, then `cublasGemmEx` with β = 1 over it (f32 compute type, the path PyTorch
//! takes without cuBLASLt).
//!
//! **Status: compiled in CI, never run on a GPU yet**; the GPU kit's `layers` stage
//! (`examples/layers_check.rs`, "projection") checks it against the CPU's f32 product and bias
//! rounded once.

use candle_core::cuda::cudarc::cublas::{sys, CudaBlas, Gemm, GemmConfig};
use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

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
    let start = bias.broadcast_as((m, n))?.contiguous()?;
    let y = rows.apply_op3_no_bwd(&weight.contiguous()?, &start, &BiasedGemm)?;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank ≥ 1") = n;
    Ok(Some(y.reshape(dims)?))
}

/// `(rows (m, k), weight (n, k), start (m, n))` → `rows · weightᵀ + start` in one GEMM with β = 1,
/// into a new tensor (the start is copied first: it may share the bias's storage).
struct BiasedGemm;

impl CustomOp3 for BiasedGemm {
    fn name(&self) -> &'static str {
        "unet-linear-with-bias"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("linear_with_bias runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        c: &CudaStorage,
        cl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (m, k) = xl.shape().dims2()?;
        let (n, _) = wl.shape().dims2()?;
        if !xl.is_contiguous() || !wl.is_contiguous() || !cl.is_contiguous() || cl.dims() != [m, n] {
            bail!(
                "linear_with_bias: expected contiguous (m, k), (n, k), (m, n) operands, found {:?}, {:?}, {:?}",
                xl.dims(),
                wl.dims(),
                cl.dims()
            )
        }
        let at = Offsets {
            x: xl.start_offset(),
            w: wl.start_offset(),
            c: cl.start_offset(),
        };
        let dev = &x.device;
        let out = match (&x.slice, &w.slice, &c.slice) {
            (CudaStorageSlice::F16(xs), CudaStorageSlice::F16(ws), CudaStorageSlice::F16(cs)) => {
                gemm(dev, (xs, ws, cs), at, (m, n, k), half::f16::ONE)?
            }
            (CudaStorageSlice::BF16(xs), CudaStorageSlice::BF16(ws), CudaStorageSlice::BF16(cs)) => {
                gemm(dev, (xs, ws, cs), at, (m, n, k), half::bf16::ONE)?
            }
            _ => bail!("linear_with_bias: expected three f16 or three bf16 operands"),
        };
        Ok((out, Shape::from((m, n))))
    }
}

/// Where each operand starts in its storage, in elements.
#[derive(Clone, Copy)]
struct Offsets {
    x: usize,
    w: usize,
    c: usize,
}

/// The start copied into a new `(m, n)` buffer, then `buffer = x · wᵀ + buffer` by cuBLAS
/// (column-major: `bufferᵀ (n × m) = w (op T of the k × n view) · xᵀ (k × m)`), α = β = 1, f32
/// compute type (cudarc's `Gemm` for f16/bf16).
fn gemm<T>(
    dev: &CudaDevice,
    (x, w, c): (&CudaSlice<T>, &CudaSlice<T>, &CudaSlice<T>),
    at: Offsets,
    (m, n, k): (usize, usize, usize),
    one: T,
) -> Result<CudaStorage>
where
    T: DeviceRepr + candle_core::cuda::CudaDType + Copy,
    CudaBlas: Gemm<T>,
{
    // SAFETY: every element is written by the copy below before it is read.
    let mut out = unsafe { dev.alloc::<T>(m * n)? };
    dev.memcpy_dtod(&c.slice(at.c..at.c + m * n), &mut out)?;
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
    // given offsets (checked contiguous by the caller), which is what the leading dimensions
    // above describe; cuBLAS runs on the device's stream, as Candle's own GEMMs.
    unsafe {
        blas.gemm(
            cfg,
            &w.slice(at.w..at.w + n * k),
            &x.slice(at.x..at.x + m * k),
            &mut out,
        )
    }
    .w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

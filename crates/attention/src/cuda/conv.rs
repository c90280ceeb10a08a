//! This crate's own cuDNN forward convolution (feature `cudnn`): [`cudnn_conv2d`], what
//! `nn.Conv2d` runs on CUDA in PyTorch, with PyTorch's numerics.
//!
//! **Status: compiled in CI, never run on a GPU yet** (the GPU kit's `conv` stage,
//! `examples/conv_check.rs`, checks it against an f64 reference).
//!
//! **Why not Candle's `cudnn` conv2d**: Candle runs f16 with an f16 compute type (cuDNN's
//! TRUE_HALF_CONFIG: the sums accumulate in f16), f32 with cuDNN's default math (TF32 on Ampere
//! and later), picks the algorithm on every call and zeroes a fresh workspace every call. Here,
//! as PyTorch does with `torch.backends.cudnn.benchmark = False`:
//!
//! * **Numerics**: f16 and bf16 data with an **f32 compute type** (PSEUDO_HALF / PSEUDO_BFLOAT16
//!   configs) and tensor-op math; f32 with `CUDNN_FMA_MATH` (strict f32, no TF32) unless the
//!   TF32 mode is on ([`super::tf32`]; then tensor-op math); f64 in double with default math.
//! * **Algorithm**: chosen once per (device, shapes, padding, dtype, math) by cuDNN's heuristics
//!   (`cudnnGetConvolutionForwardAlgorithm_v7`: the first result whose status is success and whose
//!   workspace is at most [`WORKSPACE_CAP`]), its math type adopted as PyTorch does (never for
//!   strict f32, which stays FMA), and cached process-wide ([`plan_cache_stats`]); the other
//!   usable results are kept in order, and an algorithm whose launch fails (not supported after
//!   all, no room for its workspace) gives way to the next, for that call and the later ones, as
//!   PyTorch tries them in turn.
//! * **Workspace**: one buffer per device, grown when a call needs more, never zeroed.
//! * **Handles**: cuDNN handles are not thread-safe, so each thread keeps its own per device
//!   (as Candle does), bound to the device's stream.
//!
//! **Limits** (outside them [`cudnn_conv2d`] returns `None` and the caller falls back): a CUDA
//! device; input `(N, C, H, W)` and weight `(K, C, R, S)` of one dtype (f16, bf16, f32, f64) on
//! that device; stride 1, no dilation, one group, zero padding `(ph, pw)`; a non-empty output;
//! every size and element count below 2³¹; an algorithm within the workspace cap. Inputs that are
//! not contiguous (or whose start is not 16-byte aligned) are copied first, as PyTorch makes its
//! input contiguous.

use candle_core::cuda::cudarc::cudnn::{result, sys, CudnnError};
use candle_core::cuda::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage, CudaStorageSlice as S, DeviceId, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// The largest workspace an algorithm may ask for (1 GiB); algorithms wanting more are skipped.
pub const WORKSPACE_CAP: usize = 1 << 30;

/// `conv2d(x, w)` with stride 1 and zero padding `(ph, pw)`, no bias, in `x`'s dtype, on cuDNN
/// (see the module docs); `None` where it does not apply (the caller then takes another path).
/// Errors (cuDNN's, a bad `UNET_ATTENTION_TF32`) are Candle errors naming the cuDNN call.
pub fn cudnn_conv2d(x: &Tensor, w: &Tensor, padding: [usize; 2]) -> Result<Option<Tensor>> {
    let Device::Cuda(dev) = x.device() else {
        return Ok(None);
    };
    let dtype = x.dtype();
    let supported = matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    if !supported || w.dtype() != dtype || !w.device().same_device(x.device()) || x.rank() != 4 || w.rank() != 4 {
        return Ok(None);
    }
    let Some(geom) = Geometry::new(x.dims(), w.dims(), padding) else {
        return Ok(None);
    };
    let math = Math::for_dtype(dtype)?;
    let key = PlanKey {
        device: dev.id(),
        dtype,
        math,
        geom,
    };
    let plans = plans(dev, &key)?;
    if plans.is_empty() {
        return Ok(None);
    }
    let (x, w) = (ready(x)?, ready(w)?);
    Ok(Some(x.apply_op2_no_bwd(&w, &CudnnConv { key, plans })?))
}

/// How often [`cudnn_conv2d`] found its algorithm in the cache (`hits`) and how often it asked
/// cuDNN's heuristics (`misses`, the number of distinct keys planned), since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCacheStats {
    pub hits: u64,
    pub misses: u64,
}

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// The algorithm cache's counters.
pub fn plan_cache_stats() -> PlanCacheStats {
    PlanCacheStats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
    }
}

/// `t` contiguous, starting at a 16-byte aligned element (cuDNN's vectorised kernels assume it).
fn ready(t: &Tensor) -> Result<Tensor> {
    let offset_bytes = t.layout().start_offset() * t.dtype().size_in_bytes();
    if t.is_contiguous() && offset_bytes.is_multiple_of(16) {
        Ok(t.clone())
    } else {
        t.force_contiguous()
    }
}

/// The sizes of one convolution, as cuDNN takes them (`c_int`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Geometry {
    x: [i32; 4],
    w: [i32; 4],
    y: [i32; 4],
    pad: [i32; 2],
}

impl Geometry {
    /// `None` where the shapes do not make a convolution this module runs.
    fn new(x: &[usize], w: &[usize], pad: [usize; 2]) -> Option<Geometry> {
        let (&[n, c, h, wd], &[k, wc, r, s]) = (x, w) else {
            return None;
        };
        let oh = (h + 2 * pad[0]).checked_sub(r)? + 1;
        let ow = (wd + 2 * pad[1]).checked_sub(s)? + 1;
        let y = [n, k, oh, ow];
        let limit = i32::MAX as usize;
        let count = |d: &[usize]| d.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        let sizes_ok = [x, w, &y[..]]
            .iter()
            .all(|d| count(d).is_some_and(|e| e > 0 && e <= limit));
        let i = |v: usize| i32::try_from(v).ok();
        if c != wc || !sizes_ok {
            return None;
        }
        Some(Geometry {
            x: [i(n)?, i(c)?, i(h)?, i(wd)?],
            w: [i(k)?, i(wc)?, i(r)?, i(s)?],
            y: [i(n)?, i(k)?, i(oh)?, i(ow)?],
            pad: [i(pad[0])?, i(pad[1])?],
        })
    }

    fn out_shape(&self) -> Shape {
        Shape::from(self.y.map(|d| d as usize).to_vec())
    }
}

/// cuDNN's math type for a dtype, as PyTorch sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Math {
    /// f32 without TF32: `CUDNN_FMA_MATH`, never adopted from the heuristics.
    StrictFma,
    /// f16, bf16, and f32 in the TF32 mode: `CUDNN_TENSOR_OP_MATH`.
    TensorOp,
    /// f64: `CUDNN_DEFAULT_MATH`.
    Default,
}

impl Math {
    fn for_dtype(dtype: DType) -> Result<Math> {
        Ok(match dtype {
            DType::F32 if super::tf32()? => Math::TensorOp,
            DType::F32 => Math::StrictFma,
            DType::F64 => Math::Default,
            _ => Math::TensorOp,
        })
    }

    fn raw(self) -> sys::cudnnMathType_t {
        match self {
            Math::StrictFma => sys::cudnnMathType_t::CUDNN_FMA_MATH,
            Math::TensorOp => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            Math::Default => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        }
    }
}

/// What selects a [`Plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    device: DeviceId,
    dtype: DType,
    math: Math,
    geom: Geometry,
}

/// An algorithm cuDNN's heuristics offer for a [`PlanKey`], with its math type and workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    algo: sys::cudnnConvolutionFwdAlgo_t,
    math: sys::cudnnMathType_t,
    workspace: usize,
}

/// The usable algorithms of each key in the heuristics' order, the one calls run first at the
/// front (an algorithm whose launch failed is dropped, as PyTorch moves on to the next); empty:
/// cuDNN has none for the key within the workspace cap.
static PLANS: LazyLock<Mutex<HashMap<PlanKey, Vec<Plan>>>> = LazyLock::new(Default::default);
/// One workspace per device, grown on demand.
static WORKSPACES: LazyLock<Mutex<HashMap<DeviceId, CudaSlice<u8>>>> = LazyLock::new(Default::default);

/// A lock that a panic elsewhere did not poison for good (the maps stay valid).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cached plans of `key`, or the heuristics' (then cached).
fn plans(dev: &CudaDevice, key: &PlanKey) -> Result<Vec<Plan>> {
    if let Some(p) = lock(&PLANS).get(key) {
        HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(p.clone());
    }
    let found = with_handle(dev, |h| {
        let d = Descriptors::new(key)?;
        choose(h, &d, key.math)
    })?;
    MISSES.fetch_add(1, Ordering::Relaxed);
    lock(&PLANS).insert(*key, found.clone());
    Ok(found)
}

/// Drop plans of `key` whose launch failed, so later calls start with the next.
fn drop_failed(key: &PlanKey, failed: &[Plan]) {
    if let Some(p) = lock(&PLANS).get_mut(key) {
        p.retain(|plan| !failed.contains(plan));
    }
}

/// The heuristic results that succeed within [`WORKSPACE_CAP`], in the heuristics' order (each
/// one's workspace size asked again with the math type set, as the launch will run it).
fn choose(h: sys::cudnnHandle_t, d: &Descriptors, math: Math) -> Result<Vec<Plan>> {
    let mut max: i32 = 0;
    // SAFETY: `h` is a live handle; `max` is a valid out-pointer.
    unsafe { sys::cudnnGetConvolutionForwardAlgorithmMaxCount(h, &mut max) }
        .result()
        .map_err(err("cudnnGetConvolutionForwardAlgorithmMaxCount"))?;
    let n = max.clamp(1, 64) as usize;
    // SAFETY: a plain C struct of enums whose 0 is a valid value, an f32, a size_t and ints.
    let mut perf: Vec<sys::cudnnConvolutionFwdAlgoPerf_t> = vec![unsafe { std::mem::zeroed() }; n];
    let mut returned: i32 = 0;
    // SAFETY: the handle and descriptors are live; `perf` has room for `n` results.
    unsafe {
        result::get_convolution_forward_algorithm(
            h,
            d.x.0,
            d.w.0,
            d.conv.0,
            d.y.0,
            n as i32,
            &mut returned,
            perf.as_mut_ptr(),
        )
    }
    .map_err(err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
    let mut plans = Vec::new();
    for p in perf.iter().take(returned.clamp(0, n as i32) as usize) {
        if p.status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS || p.memory > WORKSPACE_CAP {
            continue;
        }
        let math = if math == Math::StrictFma {
            math.raw()
        } else {
            p.mathType
        };
        d.conv.set_math(math)?;
        // SAFETY: the handle and descriptors are live.
        let ws = unsafe { result::get_convolution_forward_workspace_size(h, d.x.0, d.w.0, d.conv.0, d.y.0, p.algo) };
        match ws {
            Ok(workspace) if workspace <= WORKSPACE_CAP => plans.push(Plan {
                algo: p.algo,
                math,
                workspace,
            }),
            _ => continue,
        }
    }
    Ok(plans)
}

/// A Candle error naming the cuDNN call that failed.
fn err(call: &'static str) -> impl Fn(CudnnError) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("cuDNN conv2d: {call} failed: {:?}", e.0))
}

/// A cuDNN handle of this thread, bound to one device's stream.
struct Handle(sys::cudnnHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreate`, destroyed once; an error here has no one to go to.
        let _ = unsafe { result::destroy_handle(self.0) };
    }
}

thread_local! {
    /// This thread's handles, per device (cuDNN handles are not to be shared between threads).
    static HANDLES: RefCell<HashMap<DeviceId, Handle>> = RefCell::new(HashMap::new());
}

/// `f` with this thread's handle for `dev` (created on first use), the device's context current.
fn with_handle<R>(dev: &CudaDevice, f: impl FnOnce(sys::cudnnHandle_t) -> Result<R>) -> Result<R> {
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().w()?;
    let h = HANDLES.with(|m| -> Result<sys::cudnnHandle_t> {
        let mut m = m.borrow_mut();
        if let Some(h) = m.get(&dev.id()) {
            return Ok(h.0);
        }
        let h = Handle(result::create_handle().map_err(err("cudnnCreate"))?);
        // SAFETY: `h` is live and the stream is the device's, alive as long as the device.
        unsafe { result::set_stream(h.0, stream.cu_stream() as sys::cudaStream_t) }.map_err(err("cudnnSetStream"))?;
        let raw = h.0;
        m.insert(dev.id(), h);
        Ok(raw)
    })?;
    f(h)
}

/// A tensor descriptor (NCHW, packed).
struct TensorDesc(sys::cudnnTensorDescriptor_t);
/// A filter descriptor (KCRS).
struct FilterDesc(sys::cudnnFilterDescriptor_t);
/// A convolution descriptor.
struct ConvDesc(sys::cudnnConvolutionDescriptor_t);

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateTensorDescriptor`, destroyed once.
        let _ = unsafe { result::destroy_tensor_descriptor(self.0) };
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateFilterDescriptor`, destroyed once.
        let _ = unsafe { result::destroy_filter_descriptor(self.0) };
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateConvolutionDescriptor`, destroyed once.
        let _ = unsafe { result::destroy_convolution_descriptor(self.0) };
    }
}

impl ConvDesc {
    fn set_math(&self, math: sys::cudnnMathType_t) -> Result<()> {
        // SAFETY: the descriptor is live.
        unsafe { result::set_convolution_math_type(self.0, math) }.map_err(err("cudnnSetConvolutionMathType"))
    }
}

/// The descriptors of one convolution (input, filter, output, convolution with its math type).
struct Descriptors {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
}

impl Descriptors {
    fn new(key: &PlanKey) -> Result<Descriptors> {
        use sys::cudnnDataType_t as T;
        let (data, compute) = match key.dtype {
            DType::F16 => (T::CUDNN_DATA_HALF, T::CUDNN_DATA_FLOAT),
            DType::BF16 => (T::CUDNN_DATA_BFLOAT16, T::CUDNN_DATA_FLOAT),
            DType::F32 => (T::CUDNN_DATA_FLOAT, T::CUDNN_DATA_FLOAT),
            DType::F64 => (T::CUDNN_DATA_DOUBLE, T::CUDNN_DATA_DOUBLE),
            other => bail!("cuDNN conv2d: unsupported dtype {other:?}"),
        };
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let g = &key.geom;
        let tensor = |dims: [i32; 4]| -> Result<TensorDesc> {
            let d = TensorDesc(result::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?);
            // SAFETY: the descriptor is live.
            unsafe { result::set_tensor4d_descriptor(d.0, nchw, data, dims) }
                .map_err(err("cudnnSetTensor4dDescriptor"))?;
            Ok(d)
        };
        let (x, y) = (tensor(g.x)?, tensor(g.y)?);
        let w = FilterDesc(result::create_filter_descriptor().map_err(err("cudnnCreateFilterDescriptor"))?);
        // SAFETY: the descriptor is live.
        unsafe { result::set_filter4d_descriptor(w.0, data, nchw, g.w) }.map_err(err("cudnnSetFilter4dDescriptor"))?;
        let conv = ConvDesc(result::create_convolution_descriptor().map_err(err("cudnnCreateConvolutionDescriptor"))?);
        let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
        let [ph, pw] = g.pad;
        // SAFETY: the descriptor is live.
        unsafe { result::set_convolution2d_descriptor(conv.0, ph, pw, 1, 1, 1, 1, mode, compute) }
            .map_err(err("cudnnSetConvolution2dDescriptor"))?;
        conv.set_math(key.math.raw())?;
        Ok(Descriptors { x, w, y, conv })
    }
}

/// The convolution as a Candle op on (input, weight), both contiguous: the first of `plans` whose
/// workspace and launch succeed (at least one plan).
struct CudnnConv {
    key: PlanKey,
    plans: Vec<Plan>,
}

/// The device workspace of at least `bytes` (grown, never shrunk or zeroed), locked while the
/// launch that uses it is enqueued.
fn workspace(dev: &CudaDevice, bytes: usize) -> Result<MutexGuard<'static, HashMap<DeviceId, CudaSlice<u8>>>> {
    let mut all = lock(&WORKSPACES);
    if bytes > 0 && all.get(&dev.id()).is_none_or(|w| w.len() < bytes) {
        // The old buffer (if any) is freed in stream order after the work already queued on it.
        all.remove(&dev.id());
        // SAFETY: scratch memory; cuDNN writes before it reads.
        let fresh = unsafe { dev.alloc::<u8>(bytes) }?;
        all.insert(dev.id(), fresh);
    }
    Ok(all)
}

impl CudnnConv {
    fn run<T: CudaDType + DeviceRepr>(
        &self,
        dev: &CudaDevice,
        (x, x_off): (&CudaSlice<T>, usize),
        (w, w_off): (&CudaSlice<T>, usize),
    ) -> Result<CudaStorage> {
        let g = &self.key.geom;
        let y_len = g.y.iter().map(|&d| d as usize).product::<usize>();
        // SAFETY: cuDNN writes every element of the output (beta = 0).
        let mut y = unsafe { dev.alloc::<T>(y_len) }?;
        let size = std::mem::size_of::<T>() as u64;
        let (f32_one, f32_zero, f64_one, f64_zero) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if self.key.dtype == DType::F64 {
            (&f64_one as *const f64 as _, &f64_zero as *const f64 as _)
        } else {
            (&f32_one as *const f32 as _, &f32_zero as *const f32 as _)
        };
        let (x, w) = ((x, x_off as u64 * size), (w, w_off as u64 * size));
        with_handle(dev, |h| {
            let d = Descriptors::new(&self.key)?;
            let mut failed = Vec::new();
            for plan in &self.plans {
                match launch(h, &d, plan, dev, (x, w, &mut y), (alpha, beta)) {
                    Ok(()) => {
                        drop_failed(&self.key, &failed);
                        return Ok(());
                    }
                    // Not supported for these descriptors after all, or no room for its
                    // workspace: the next algorithm, as PyTorch tries them in turn.
                    Err(_) if failed.len() + 1 < self.plans.len() => failed.push(*plan),
                    Err(e) => {
                        drop_failed(&self.key, &failed);
                        return Err(e);
                    }
                }
            }
            bail!("cuDNN conv2d: no algorithm to run")
        })?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
}

/// A convolution's input or weight: its slice and the byte offset of its first element.
type Operand<'a, T> = (&'a CudaSlice<T>, u64);

/// One algorithm's launch, enqueued on the device's stream: `x` and `w`, the output `y`, the
/// scaling factors.
fn launch<T: CudaDType + DeviceRepr>(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    plan: &Plan,
    dev: &CudaDevice,
    ((x, x_off), (w, w_off), y): (Operand<T>, Operand<T>, &mut CudaSlice<T>),
    (alpha, beta): (*const c_void, *const c_void),
) -> Result<()> {
    let stream = dev.cuda_stream();
    d.conv.set_math(plan.math)?;
    let mut ws = workspace(dev, plan.workspace)?;
    let (xp, _gx) = x.device_ptr(&stream);
    let (wp, _gw) = w.device_ptr(&stream);
    let (yp, _gy) = y.device_ptr_mut(&stream);
    let (wsp, ws_len, _gws) = match ws.get_mut(&dev.id()).filter(|_| plan.workspace > 0) {
        Some(buf) => {
            let len = buf.len();
            let (p, g) = buf.device_ptr_mut(&stream);
            (p as *mut c_void, len, Some(g))
        }
        None => (std::ptr::null_mut(), 0, None),
    };
    // SAFETY: handle and descriptors are live and describe these buffers (contiguous NCHW /
    // KCRS of the plan's sizes, `T` the descriptors' data type, the byte offsets inside the
    // slices); alpha/beta are of the scaling type cuDNN expects for the data type; the
    // workspace holds `ws_len >= plan.workspace` bytes; every guard lives past the call.
    unsafe {
        result::convolution_forward(
            h,
            alpha,
            d.x.0,
            (xp + x_off) as *const c_void,
            d.w.0,
            (wp + w_off) as *const c_void,
            d.conv.0,
            plan.algo,
            wsp,
            ws_len,
            beta,
            d.y.0,
            yp as *mut c_void,
        )
    }
    .map_err(err("cudnnConvolutionForward"))
}

impl CustomOp2 for CudnnConv {
    fn name(&self) -> &'static str {
        "unet-cudnn-conv2d"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("the cuDNN convolution runs on CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout, w: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let g = &self.key.geom;
        let dims_ok = xl.dims().iter().zip(g.x).all(|(&a, b)| a == b as usize)
            && wl.dims().iter().zip(g.w).all(|(&a, b)| a == b as usize);
        if !xl.is_contiguous() || !wl.is_contiguous() || !dims_ok {
            bail!("cuDNN conv2d: expected contiguous tensors of the planned shapes, got {xl:?} and {wl:?}")
        }
        let dev = &x.device;
        let (xo, wo) = (xl.start_offset(), wl.start_offset());
        let out = match (&x.slice, &w.slice) {
            (S::F16(a), S::F16(b)) => self.run(dev, (a, xo), (b, wo))?,
            (S::BF16(a), S::BF16(b)) => self.run(dev, (a, xo), (b, wo))?,
            (S::F32(a), S::F32(b)) => self.run(dev, (a, xo), (b, wo))?,
            (S::F64(a), S::F64(b)) => self.run(dev, (a, xo), (b, wo))?,
            _ => bail!("cuDNN conv2d: input and weight must be f16, bf16, f32 or f64, of one dtype"),
        };
        Ok((out, g.out_shape()))
    }
}

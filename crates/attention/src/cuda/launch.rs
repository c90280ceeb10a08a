//! Launching `kernels/fused_attention.cu` through Candle's CUDA device: the [`Plan`] (kernel,
//! tiles, grid, shared memory, key splits), the kernels' argument block ([`Args`], laid out as
//! the CUDA `struct Args`), and the [`FusedAttention`] `CustomOp3` whose `cuda_fwd` launches the
//! attention kernel and, when the keys are split, the merge kernel.

use super::{Dims, FusedOptions};
use candle_core::cuda::cudarc::driver::{
    sys, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

include!(concat!(env!("OUT_DIR"), "/fused_ptx.rs"));

/// The name Candle's device caches the loaded PTX module under.
const MODULE: &str = "unet_attention_fused";
/// Threads per block of the attention kernels (4 warps).
const THREADS: u32 = 128;
/// Queries per block of the mma kernels.
const BR: usize = 64;
/// Output-column chunks the mma kernels are compiled for (`fattn_{f16,bf16}_dv{N}`).
const DVCS: [usize; 8] = [16, 32, 64, 96, 128, 160, 192, 256];

/// What the plan needs to know of the GPU.
pub(crate) struct Gpu {
    sms: usize,
    smem_optin: usize,
}

impl Gpu {
    /// `None` where the kernel cannot run: no PTX in this build, or compute capability below 8.0.
    pub(crate) fn query(dev: &CudaDevice) -> Result<Option<Gpu>> {
        if PTX.is_none() {
            return Ok(None);
        }
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        let attr = |a| ctx.attribute(a).w();
        use sys::CUdevice_attribute as A;
        if attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? < 8 {
            return Ok(None);
        }
        Ok(Some(Gpu {
            sms: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize,
            smem_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize,
        }))
    }
}

/// Kernels, grid and workspace of one call.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    dims: Dims,
    dtype: DType,
    kernel: String,
    merge: &'static str,
    dp: usize,
    chunks: usize,
    grid: (u32, u32, u32),
    smem: usize,
    splits: usize,
    tiles_per_split: usize,
}

impl Plan {
    /// `None` where the shape does not fit the kernels (shared memory, grid or index limits).
    pub(crate) fn new(s: &Dims, dtype: DType, gpu: &Gpu, opts: FusedOptions) -> Option<Plan> {
        let (dp, chunks, rows, key_tile, smem, kernel, merge) = match dtype {
            DType::F32 => {
                let ni = s.d.div_ceil(32).next_power_of_two();
                let rows = if ni <= 4 { 16 } else { 8 };
                let smem = (rows * s.d + 32 * (s.d | 1) + 32 * s.d) * 4;
                (s.d, 1, rows, 32, smem, format!("fattn_f32_ni{ni}"), "fattn_merge_f32")
            }
            DType::F16 | DType::BF16 => {
                let dp = s.d.div_ceil(16) * 16;
                let dvc = DVCS.into_iter().find(|&c| c >= dp).unwrap_or(256);
                let bc = if dvc <= 160 { 64 } else { 32 };
                let smem = (BR * (dp + 8) + bc * (dp + 8) + bc * (dvc + 8)) * 2;
                let (name, merge) = if dtype == DType::F16 {
                    ("f16", "fattn_merge_f16")
                } else {
                    ("bf16", "fattn_merge_bf16")
                };
                (
                    dp,
                    s.d.div_ceil(dvc),
                    BR,
                    bc,
                    smem,
                    format!("fattn_{name}_dv{dvc}"),
                    merge,
                )
            }
            _ => return None,
        };
        let bh = s.b * s.h;
        let q_tiles = s.lq.div_ceil(rows);
        let key_tiles = s.lk.div_ceil(key_tile);
        let ctas = q_tiles * bh * chunks;
        let wanted = opts.splits.unwrap_or_else(|| {
            if ctas >= gpu.sms {
                1
            } else {
                (2 * gpu.sms).div_ceil(ctas).min(key_tiles / 2).min(64)
            }
        });
        let tiles_per_split = key_tiles.div_ceil(wanted.clamp(1, key_tiles));
        let splits = key_tiles.div_ceil(tiles_per_split);
        let fits_i32 = |x: usize| x <= i32::MAX as usize;
        let ok = smem <= gpu.smem_optin
            && bh * chunks <= 65_535
            && splits <= 65_535
            && [q_tiles, s.lq, s.lk, bh, bh * s.lq].into_iter().all(fits_i32);
        ok.then(|| Plan {
            dims: *s,
            dtype,
            kernel,
            merge,
            dp,
            chunks,
            grid: (q_tiles as u32, (bh * chunks) as u32, splits as u32),
            smem,
            splits,
            tiles_per_split,
        })
    }
}

/// The CUDA `struct Args` of `kernels/fused_attention.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Args {
    q: u64,
    k: u64,
    v: u64,
    mask: u64,
    out: u64,
    ws_o: u64,
    ws_ml: u64,
    heads: i32,
    bhs: i32,
    lq: i32,
    lk: i32,
    d: i32,
    dp: i32,
    chunks: i32,
    splits: i32,
    tiles_per_split: i32,
    vec: i32,
    q_s: [i64; 3],
    k_s: [i64; 3],
    v_s: [i64; 3],
    m_s: [i64; 4],
    scale: f32,
}

// SAFETY: plain old data, `#[repr(C)]` with the field order, types and alignment of the CUDA
// struct it is passed as (7 pointers, 10 ints, 13 long longs, 1 float).
unsafe impl DeviceRepr for Args {}

impl Args {
    /// The sizes of `plan` and the scale; the pointers, strides and `vec` are the launch's to fill.
    fn sizes(plan: &Plan, scale: f32) -> Args {
        let s = plan.dims;
        Args {
            heads: s.h as i32,
            bhs: (s.b * s.h) as i32,
            lq: s.lq as i32,
            lk: s.lk as i32,
            d: s.d as i32,
            dp: plan.dp as i32,
            chunks: plan.chunks as i32,
            splits: plan.splits as i32,
            tiles_per_split: plan.tiles_per_split as i32,
            scale,
            ..Args::default()
        }
    }
}

/// The fused attention as a Candle op on (q, k, v); the mask (f32, broadcast to (B, H, Lq, Lk))
/// rides along.
pub(crate) struct FusedAttention {
    pub mask: Option<Tensor>,
    pub scale: f32,
    pub plan: Plan,
}

/// Device address of element `offset` of a 16- or 32-bit float storage, and its use guard
/// (`kernels`: who asks, for the error on another dtype). The fused layers' launches use it too.
pub(super) fn storage_ptr<'a>(
    st: &'a CudaStorage,
    offset: usize,
    stream: &'a CudaStream,
    kernels: &str,
) -> Result<(u64, SyncOnDrop<'a>)> {
    fn at<'a, T>(x: &'a CudaSlice<T>, offset: usize, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        let (p, g) = x.device_ptr(stream);
        (p + (offset * std::mem::size_of::<T>()) as u64, g)
    }
    Ok(match &st.slice {
        CudaStorageSlice::F16(x) => at(x, offset, stream),
        CudaStorageSlice::BF16(x) => at(x, offset, stream),
        CudaStorageSlice::F32(x) => at(x, offset, stream),
        _ => bail!("{kernels}: expected f16, bf16 or f32 storage, found another dtype"),
    })
}

fn strides3(l: &Layout) -> Result<[i64; 3]> {
    let s = l.stride();
    // A head dim of 1 may carry any stride (Candle calls such a layout contiguous, so
    // `contiguous()` keeps it); the kernel never steps along the last dim, so accept it.
    if s.len() != 4 || (s[3] != 1 && l.dims()[3] != 1) {
        bail!("fused attention: expected a rank-4 layout with a contiguous last dim, found strides {s:?}")
    }
    Ok([s[0] as i64, s[1] as i64, s[2] as i64])
}

/// The strides of a rank-4 mask layout.
fn strides4(l: &Layout) -> [i64; 4] {
    let s = l.stride();
    [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64]
}

/// One input of the kernel: its storage and layout.
type Input<'a> = (&'a CudaStorage, &'a Layout);

impl FusedAttention {
    fn run<T: CudaDType + DeviceRepr>(&self, q: Input<'_>, k: Input<'_>, v: Input<'_>) -> Result<CudaStorage> {
        let (p, s) = (&self.plan, self.plan.dims);
        let dev = &q.0.device;
        let Some(ptx) = PTX else {
            bail!("fused attention: this build has no PTX (CUDA_COMPUTE_CAP below 8.0)")
        };
        let rows = s.b * s.h * s.lq;
        // SAFETY: every element is written by the kernels below before it is read.
        let mut out = unsafe { dev.alloc::<T>(rows * s.d)? };
        let mut ws_o = dev.alloc_zeros::<f32>(if p.splits > 1 { p.splits * rows * s.d } else { 1 })?;
        let mut ws_ml = dev.alloc_zeros::<f32>(if p.splits > 1 { p.splits * rows * 2 } else { 1 })?;
        self.launch_attention(ptx, (q, k, v), &mut out, (&mut ws_o, &mut ws_ml))?;
        if p.splits > 1 {
            self.launch_merge(ptx, dev, (&ws_o, &ws_ml), &mut out)?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    /// The attention kernel of the plan: into `out`, or with split keys into the workspace
    /// (partial outputs, and each row's max and sum).
    fn launch_attention<T: DeviceRepr>(
        &self,
        ptx: &str,
        ((q, ql), (k, kl), (v, vl)): (Input<'_>, Input<'_>, Input<'_>),
        out: &mut CudaSlice<T>,
        (ws_o, ws_ml): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    ) -> Result<()> {
        let p = &self.plan;
        let dev = &q.device;
        let stream = dev.cuda_stream();
        let mut args = Args::sizes(p, self.scale);
        (args.q_s, args.k_s, args.v_s) = (strides3(ql)?, strides3(kl)?, strides3(vl)?);
        let mask_store = self.mask.as_ref().map(|m| m.storage_and_layout());
        let (qp, _gq) = storage_ptr(q, ql.start_offset(), &stream, "fused attention")?;
        let (kp, _gk) = storage_ptr(k, kl.start_offset(), &stream, "fused attention")?;
        let (vp, _gv) = storage_ptr(v, vl.start_offset(), &stream, "fused attention")?;
        // cp.async copies 16 bytes and faults on an address that is not 16-byte aligned: every
        // row start must be, so the strides must be multiples of 8 elements and the start
        // address itself (the allocation's base plus the view's offset, checked as an address
        // rather than assuming the allocator's alignment) a multiple of 16 bytes. Else the
        // kernel copies element by element.
        let aligned = |st: &[i64; 3], ptr: u64| st.iter().all(|x| x % 8 == 0) && ptr.is_multiple_of(16);
        let vec =
            p.dims.d.is_multiple_of(8) && aligned(&args.q_s, qp) && aligned(&args.k_s, kp) && aligned(&args.v_s, vp);
        args.vec = vec as i32;
        let _gm = match &mask_store {
            None => None,
            Some((st, ml)) => {
                let Storage::Cuda(cs) = &**st else {
                    bail!("fused attention: the mask is not on the CUDA device")
                };
                let (mp, g) = storage_ptr(cs, ml.start_offset(), &stream, "fused attention")?;
                (args.mask, args.m_s) = (mp, strides4(ml));
                Some(g)
            }
        };
        let (op, _go) = out.device_ptr_mut(&stream);
        let (wo, _gwo) = ws_o.device_ptr_mut(&stream);
        let (wm, _gwm) = ws_ml.device_ptr_mut(&stream);
        let split = p.splits > 1;
        (args.q, args.k, args.v, args.out) = (qp, kp, vp, op);
        (args.ws_o, args.ws_ml) = if split { (wo, wm) } else { (0, 0) };
        let func = dev.get_or_load_custom_func(&p.kernel, MODULE, ptx)?;
        if p.smem > 48 * 1024 {
            use sys::CUfunction_attribute as F;
            // cuFuncSetAttribute acts on the current context: make it this device's on this
            // thread (cudarc binds it for launches, not for attributes).
            stream.context().bind_to_thread().w()?;
            func.set_attribute(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, p.smem as i32)
                .w()?;
        }
        let cfg = LaunchConfig {
            grid_dim: p.grid,
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: p.smem as u32,
        };
        let mut b = func.builder();
        b.arg(&args);
        // SAFETY: `args` matches the kernel's parameter; every pointer in it is live (its
        // guard is held) and addresses the extent the grid reads or writes.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// The merge kernel: the split keys' partial outputs in the workspace combined into `out`.
    fn launch_merge<T: DeviceRepr>(
        &self,
        ptx: &str,
        dev: &CudaDevice,
        (ws_o, ws_ml): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let (p, s) = (&self.plan, self.plan.dims);
        let rows = s.b * s.h * s.lq;
        let func = dev.get_or_load_custom_func(p.merge, MODULE, ptx)?;
        let (rows_i, d_i, splits_i) = (rows as i32, s.d as i32, p.splits as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = func.builder();
        b.arg(ws_o).arg(ws_ml).arg(out).arg(&rows_i).arg(&d_i).arg(&splits_i);
        // SAFETY: the workspace holds `splits` partial outputs and (m, l) of `rows` rows.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}

impl CustomOp3 for FusedAttention {
    fn name(&self) -> &'static str {
        "unet-fused-attention"
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
        bail!("fused attention runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let s = self.plan.dims;
        let io = ((q, ql), (k, kl), (v, vl));
        let out = match self.plan.dtype {
            DType::F16 => self.run::<half::f16>(io.0, io.1, io.2)?,
            DType::BF16 => self.run::<half::bf16>(io.0, io.1, io.2)?,
            DType::F32 => self.run::<f32>(io.0, io.1, io.2)?,
            other => bail!("fused attention: unsupported dtype {other:?}"),
        };
        Ok((out, Shape::from((s.b, s.h, s.lq, s.d))))
    }
}

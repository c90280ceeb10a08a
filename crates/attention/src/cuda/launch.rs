//! Launching `kernels/fused_attention.cu` through Candle's CUDA device: what the plan
//! (`crate::cuda_plan`: kernel, tiles, grid, shared memory, key splits, the argument block) needs
//! of the GPU, and the [`FusedAttention`] `CustomOp3` whose `cuda_fwd` launches the attention
//! kernel and, when the keys are split, the merge kernel.

use super::module::{self, Image};
use crate::cuda_plan::{vector_copies, Args, GpuLimits, Plan, THREADS};
use candle_core::cuda::cudarc::driver::{
    sys, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

include!(concat!(env!("OUT_DIR"), "/fused_image.rs"));

/// The attention kernels' fat binary (`build.rs`).
pub(crate) static FUSED: Image = Image {
    what: "the fused attention kernels",
    bytes: FUSED_IMAGE,
};

/// What the plan needs to know of the GPU: `None` where the kernels cannot run on it (see
/// [`module::runs`]: compute capability below 8.0, no entry of the image for it, or a load the
/// driver refused; a note says which, once).
pub(crate) fn gpu_limits(dev: &CudaDevice) -> Result<Option<GpuLimits>> {
    if !module::runs(dev, &FUSED)? {
        return Ok(None);
    }
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let attr = |a| ctx.attribute(a).w();
    use sys::CUdevice_attribute as A;
    Ok(Some(GpuLimits {
        sms: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize,
        smem_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize,
    }))
}

/// Thread blocks of `plan`'s attention kernel that fit one SM at once, as the driver computes
/// it from the kernel's registers and the plan's shared memory
/// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`); at least 1. Where the driver cannot say,
/// 2 (the number the key splits were planned for before this query).
/// Asked once per device, kernel and shared memory size (a few driver calls), then remembered.
pub(crate) fn blocks_per_sm(dev: &CudaDevice, plan: &Plan) -> Result<usize> {
    type Key = (candle_core::cuda::DeviceId, String, usize);
    static KNOWN: OnceLock<Mutex<HashMap<Key, usize>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Mutex::default);
    let key = (dev.id(), plan.kernel.clone(), plan.smem);
    if let Some(&n) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(n);
    }
    let func = module::function(dev, &FUSED, &plan.kernel)?;
    dev.cuda_stream().context().bind_to_thread().w()?;
    let n = func
        .occupancy_max_active_blocks_per_multiprocessor(plan.threads, plan.smem, None)
        .map_or(2, |n| (n as usize).max(1));
    known.lock().unwrap_or_else(|e| e.into_inner()).insert(key, n);
    Ok(n)
}

// SAFETY: plain old data: `Args` is `#[repr(C)]` with the field order, types and alignment of
// the CUDA struct it is passed as (7 pointers, 10 ints, 13 long longs, 1 float).
unsafe impl DeviceRepr for Args {}

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
        let rows = s.b * s.h * s.lq;
        // SAFETY: every element is written by the kernels below before it is read.
        let mut out = unsafe { dev.alloc::<T>(rows * s.d)? };
        // The split workspace, only when the keys are split (unsplit, the kernels get null
        // pointers and never touch them).
        let mut ws = match p.workspace() {
            None => None,
            Some((ws_o_len, ws_ml_len)) => {
                // SAFETY: every split writes its partial output of every (row, column) and its
                // (m, l) of every row before the merge reads them (the emulated tests run with
                // these buffers filled with NaN).
                let ws_o = unsafe { dev.alloc::<f32>(ws_o_len)? };
                // SAFETY: as for `ws_o`: each split writes its (m, l) of every row before the merge.
                let ws_ml = unsafe { dev.alloc::<f32>(ws_ml_len)? };
                Some((ws_o, ws_ml))
            }
        };
        self.launch_attention((q, k, v), &mut out, ws.as_mut())?;
        if let Some((ws_o, ws_ml)) = &ws {
            self.launch_merge(dev, (ws_o, ws_ml), &mut out)?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    /// The attention kernel of the plan: into `out`, or with split keys into the workspace `ws`
    /// (partial outputs, and each row's max and sum; `None` unsplit: null pointers).
    fn launch_attention<T: DeviceRepr>(
        &self,
        ((q, ql), (k, kl), (v, vl)): (Input<'_>, Input<'_>, Input<'_>),
        out: &mut CudaSlice<T>,
        ws: Option<&mut (CudaSlice<f32>, CudaSlice<f32>)>,
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
        // cp.async copies 16 bytes and faults on an address that is not 16-byte aligned: the
        // start addresses are checked as addresses (the allocation's base plus the view's
        // offset), not assumed from the allocator.
        let vec = vector_copies(p.dims.d, [(args.q_s, qp), (args.k_s, kp), (args.v_s, vp)]);
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
        let ws = ws.map(|(o, m)| (o.device_ptr_mut(&stream), m.device_ptr_mut(&stream)));
        (args.q, args.k, args.v, args.out) = (qp, kp, vp, op);
        (args.ws_o, args.ws_ml) = ws.as_ref().map_or((0, 0), |((wo, _), (wm, _))| (*wo, *wm));
        let func = module::function(dev, &FUSED, &p.kernel)?;
        let cfg = LaunchConfig {
            grid_dim: p.grid,
            block_dim: (p.threads, 1, 1),
            shared_mem_bytes: p.smem as u32,
        };
        let mut b = stream.launch_builder(&func);
        b.arg(&args);
        // SAFETY: `args` matches the kernel's parameter; every pointer in it is live (its
        // guard is held) and addresses the extent the grid reads or writes.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// The merge kernel: the split keys' partial outputs in the workspace combined into `out`.
    fn launch_merge<T: DeviceRepr>(
        &self,
        dev: &CudaDevice,
        (ws_o, ws_ml): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let (p, s) = (&self.plan, self.plan.dims);
        let rows = p.merge_rows();
        let func = module::function(dev, &FUSED, p.merge)?;
        let stream = dev.cuda_stream();
        let (rows_i, d_i, splits_i) = (rows as i32, s.d as i32, p.splits as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&func);
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

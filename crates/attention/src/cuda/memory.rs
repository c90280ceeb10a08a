//! GPU memory of a CUDA device as the benchmarks report it: the bytes in use in the device's
//! stream-ordered memory pool, now and at their peak since the last reset.
//!
//! Candle's CUDA device (through cudarc) allocates every tensor with `cuMemAllocAsync` where the
//! device supports memory pools (every GPU of compute capability ≥ 6.0 with a recent driver),
//! so the pool's `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` / `_HIGH` counters are what PyTorch's
//! `torch.cuda.memory_allocated()` / `max_memory_allocated()` are for its caching allocator: the
//! bytes of live allocations, not what the pool keeps reserved. Neither side counts cuBLAS's
//! own workspace. Where the device has no pool (`has_async_alloc` is false: allocations go
//! through `cuMemAlloc`), [`PoolMemory::of`] gives `None`; the device-wide reading
//! [`device_used_bytes`] (total − free, every process and library included) is there as a
//! coarser cross-check.

use candle_core::cuda::cudarc::driver::sys;
use candle_core::cuda::{CudaDevice, WrapErr};
use candle_core::Result;

/// The memory pool the device's allocations come from.
pub struct PoolMemory {
    pool: sys::CUmemoryPool,
    dev: CudaDevice,
}

impl PoolMemory {
    /// The pool of `dev`, `None` where its allocations do not come from one.
    pub fn of(dev: &CudaDevice) -> Result<Option<PoolMemory>> {
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        if !ctx.has_async_alloc() {
            return Ok(None);
        }
        ctx.bind_to_thread().w()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle comes from the context.
        unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }
            .result()
            .w()?;
        Ok(Some(PoolMemory { pool, dev: dev.clone() }))
    }

    fn get(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        self.dev.cuda_stream().context().bind_to_thread().w()?;
        let mut value: u64 = 0;
        // SAFETY: the USED_MEM attributes are `cuuint64_t`; `value` outlives the call.
        unsafe { sys::cuMemPoolGetAttribute(self.pool, attr, (&mut value as *mut u64).cast()) }
            .result()
            .w()?;
        Ok(value)
    }

    /// Bytes of live allocations from the pool now (queued work included: synchronize first).
    pub fn used_bytes(&self) -> Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// The most bytes of live allocations since [`Self::reset_peak`] (or since the pool was
    /// created).
    pub fn peak_bytes(&self) -> Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    /// Start a new peak at the current use (the driver accepts only 0, which resets the high
    /// mark to the current use).
    pub fn reset_peak(&self) -> Result<()> {
        self.dev.cuda_stream().context().bind_to_thread().w()?;
        let mut zero: u64 = 0;
        // SAFETY: as in `get`; the driver reads the value during the call.
        unsafe {
            sys::cuMemPoolSetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
        .result()
        .w()
    }
}

/// Bytes in use on the whole device (total − free, as `cuMemGetInfo` reports: other processes,
/// the CUDA context, library workspaces and the pool's reserve included).
pub fn device_used_bytes(dev: &CudaDevice) -> Result<u64> {
    let stream = dev.cuda_stream();
    let (free, total) = stream.context().mem_get_info().w()?;
    Ok(total.saturating_sub(free) as u64)
}

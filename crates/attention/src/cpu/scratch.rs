//! Scratch memory of the CPU kernels, part of the bottom layer ([`crate::cpu`]): each rayon
//! worker's scratch ([`with_scratch`]: score tiles, packed operands, a GEMM task's blocks), and
//! the attention kernel's packing buffer ([`packing_buffer`]), both kept between calls so that a
//! denoising loop does not allocate and fault in fresh pages on every step. (The larger buffers
//! of the Winograd path are kept by [`super::pool`].)

use super::aligned::Aligned;

thread_local! {
    /// A worker's scratch (score tile, mask row, and for the tile engine its packed operands and
    /// output tile), kept between tasks: no allocation and zeroing per task.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `f` on `need` floats of this worker's scratch, starting on a 64-byte boundary (contents
/// arbitrary: a task writes every element before it reads it).
pub(crate) fn with_scratch<R>(need: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut scratch = Aligned::in_vec(SCRATCH.take(), need);
    let out = f(&mut scratch);
    SCRATCH.set(scratch.into_vec());
    out
}

/// One buffer for the packed (or transposed) K and V of an attention call, kept for the next call: a
/// denoising loop calls the same shapes over and over, and a fresh buffer of that size costs a
/// page fault per 4 KiB each time. At most [`KEEP`](packing_buffer::KEEP) floats are kept.
pub(crate) mod packing_buffer {
    use super::Aligned;
    use std::sync::Mutex;

    /// 64 MiB of f32.
    pub(crate) const KEEP: usize = 16 << 20;
    static KEPT: Mutex<Vec<f32>> = Mutex::new(Vec::new());

    /// A buffer of exactly `len` floats on a 64-byte boundary (in the kept one if it is large
    /// enough; contents arbitrary).
    pub(crate) fn take(len: usize) -> Aligned {
        Aligned::in_vec(
            std::mem::take(&mut *KEPT.lock().unwrap_or_else(|e| e.into_inner())),
            len,
        )
    }

    /// Keep `v` for the next call, unless it is larger than [`KEEP`] or a larger one is kept.
    pub(crate) fn give_back(v: Aligned) {
        let v = v.into_vec();
        if v.capacity() <= KEEP {
            let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
            if kept.capacity() < v.capacity() {
                *kept = v;
            }
        }
    }
}

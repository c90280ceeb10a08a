//! Large scratch buffers kept from one call to the next, part of the bottom layer
//! ([`crate::cpu`]): the Winograd path's transformed weights and tile blocks, so that a call in a loop does not map fresh pages: a fresh 100 MiB buffer
//! costs about 25,000 page faults, each a kernel entry and a page cleared, and glibc hands
//! buffers of 32 MiB and more straight back to the kernel when they are freed.
//!
//! Buffers keep their length and values when given back; whoever takes one writes every value it
//! reads. At most [`KEEP_BYTES`] are kept (the largest buffers first); the rest are freed.

use std::sync::Mutex;

/// Bytes the pool keeps between calls at most: the transformed weights of a 1280-channel 3×3
/// convolution (105 MiB) and one block of its tiles.
const KEEP_BYTES: usize = 128 << 20;

static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A kept buffer for `len` values: the smallest whose capacity holds them, else the largest (for
/// the caller to grow), else a new empty one. Its length and values are as it was given back.
pub(crate) fn take(len: usize) -> Vec<f32> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let fits = (0..pool.len())
        .filter(|&i| pool[i].capacity() >= len)
        .min_by_key(|&i| pool[i].capacity());
    let largest = (0..pool.len()).max_by_key(|&i| pool[i].capacity());
    fits.or(largest).map(|i| pool.swap_remove(i)).unwrap_or_default()
}

/// Give buffers back for later calls.
pub(crate) fn give(buffers: impl IntoIterator<Item = Vec<f32>>) {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.extend(buffers);
    pool.sort_by_key(|v| std::cmp::Reverse(v.capacity()));
    let mut kept = 0;
    pool.retain(|v| {
        kept += v.capacity() * size_of::<f32>();
        kept <= KEEP_BYTES
    });
}

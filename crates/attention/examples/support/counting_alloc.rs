//! A global allocator that counts the bytes the process holds on the heap (now, and the peak
//! since the last [`take_peak`]): the whole-model benchmark's memory profile attributes each
//! peak to the stage of the forward that reached it. Every candle CPU tensor and every buffer
//! of our kernels is a heap allocation, so the count is the process's tensor memory (plus the
//! small things); memory-mapped files are not in it (`VmRSS` counts those).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALL_TIME: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = NOW.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
    ALL_TIME.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator with the caller's arguments; the
// counting touches only atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                NOW.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

/// Bytes held now.
pub fn now() -> usize {
    NOW.load(Ordering::Relaxed)
}

/// The peak since the last call (then reset to what is held now).
pub fn take_peak() -> usize {
    PEAK.swap(now(), Ordering::Relaxed)
}

/// The peak since the process started.
#[allow(dead_code)] // (not every user reads it)
pub fn all_time_peak() -> usize {
    ALL_TIME.load(Ordering::Relaxed)
}

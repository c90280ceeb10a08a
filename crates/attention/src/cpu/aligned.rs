//! f32 buffers whose values start on a 64-byte boundary ([`Aligned`]), part of the bottom layer
//! ([`crate::cpu`]): the packed operands and scratch the register tiles read 64 bytes at a time.
//!
//! glibc places a large allocation 16 bytes into its first page, so a `Vec<f32>` of packed panels
//! starts 16 bytes past a cache line and every 64-byte load of an AVX-512 tile (a `B` panel row, an
//! accumulator row) spans two lines. Intel's cores pay for that (a line-split load takes two L1
//! accesses, and the tile issues its `B` loads beside twelve broadcasts per step on the same load
//! ports); AMD's Zen 4 splits a 512-bit load into two 256-bit halves and hardly notices (measured:
//! whole blocks within 1 %). PyTorch's CPU allocator aligns every tensor to 64 bytes, as oneDNN
//! and MKL ask; so do these buffers, at the cost of 15 floats each.

/// f32 values per 64 bytes.
const LINE: usize = 16;

/// `len` f32 values starting on a 64-byte boundary, inside a `Vec` (which can be taken back out
/// for reuse: [`Aligned::into_vec`]).
#[derive(Debug, Default)]
pub(crate) struct Aligned {
    vec: Vec<f32>,
    start: usize,
    len: usize,
}

impl Aligned {
    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Aligned {
        Aligned::zeroed_in(Vec::new(), len)
    }

    /// `len` zeros in `vec`'s allocation (grown where it is too small).
    pub(crate) fn zeroed_in(mut vec: Vec<f32>, len: usize) -> Aligned {
        vec.clear();
        Aligned::in_vec(vec, len)
    }

    /// `len` values in `vec`'s allocation (grown where it is too small): whatever it held, zeros
    /// past its old length, for a caller that writes every value before it reads it.
    pub(crate) fn in_vec(mut vec: Vec<f32>, len: usize) -> Aligned {
        if vec.len() < len + LINE - 1 {
            vec.resize(len + LINE - 1, 0.0);
        }
        let start = start_in(&vec);
        Aligned { vec, start, len }
    }

    /// The allocation, for reuse.
    pub(crate) fn into_vec(self) -> Vec<f32> {
        self.vec
    }
}

/// The index of `vec`'s first value on a 64-byte boundary (below [`LINE`]: f32 values are 4-byte
/// aligned).
pub(crate) fn start_in(vec: &[f32]) -> usize {
    let addr = vec.as_ptr() as usize;
    (64 - addr % 64) % 64 / 4
}

/// Floats of a scratch holding parts of `sizes` floats, each starting a whole number of cache lines
/// after the first ([`split_lines`]).
pub(crate) fn lines_len(sizes: &[usize]) -> usize {
    sizes.iter().map(|&n| n.next_multiple_of(LINE)).sum()
}

/// `buf` (of at least [`lines_len`]`(&sizes)` floats) cut into parts of `sizes` floats, each
/// starting a whole number of cache lines after `buf` does: on 64-byte boundaries where `buf` is
/// ([`Aligned`], the scratch).
pub(crate) fn split_lines<const N: usize>(mut buf: &mut [f32], sizes: [usize; N]) -> [&mut [f32]; N] {
    sizes.map(|n| {
        let (part, rest) = std::mem::take(&mut buf).split_at_mut(n.next_multiple_of(LINE));
        buf = rest;
        &mut part[..n]
    })
}

impl Clone for Aligned {
    fn clone(&self) -> Aligned {
        let mut copy = Aligned::in_vec(Vec::new(), self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::ops::Deref for Aligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.vec[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::Aligned;

    #[test]
    fn aligned_buffers_start_on_a_cache_line_and_keep_their_values() {
        for len in [0usize, 1, 15, 16, 1000, 1 << 20] {
            let a = Aligned::zeroed(len);
            assert_eq!(a.len(), len);
            assert_eq!(a.as_ptr() as usize % 64, 0);
            assert!(a.iter().all(|&v| v == 0.0));
        }
        let mut a = Aligned::zeroed(100);
        a.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        let copy = a.clone();
        assert_eq!(copy.as_ptr() as usize % 64, 0);
        assert_eq!(&copy[..], &a[..]);
        // Reused: the values stay where the alignment does (same allocation), zeros on request.
        let again = Aligned::in_vec(a.into_vec(), 50);
        assert_eq!(again.as_ptr() as usize % 64, 0);
        assert_eq!(again[49], 49.0);
        let zeros = Aligned::zeroed_in(again.into_vec(), 80);
        assert!(zeros.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn scratch_parts_start_on_cache_lines() {
        let sizes = [5usize, 0, 16, 33, 1];
        let mut buf = Aligned::zeroed(super::lines_len(&sizes));
        assert_eq!(buf.len(), 16 + 16 + 48 + 16); // the empty part takes no line
        let parts = super::split_lines(&mut buf, sizes);
        for (part, n) in parts.iter().zip(sizes) {
            assert_eq!(part.len(), n);
            assert_eq!(part.as_ptr() as usize % 64, 0);
        }
    }
}

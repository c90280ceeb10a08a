//! [`Engine::Gemm`](super::Engine::Gemm): both tile products of a task as `gemm` calls, on any
//! CPU. K is transposed once per batch·head to `(D, Lk)`, so `gemm` packs Kᵀ as a plain copy.

use super::{with_scratch, Dims, Inputs, Softmax};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Each `(rows, cols)` matrix of `x` transposed into `out`, in parallel over matrices, in 16×16
/// tiles.
pub(super) fn transpose_heads(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const T: usize = 16;
    out.par_chunks_mut(rows * cols)
        .zip(x.par_chunks(rows * cols))
        .for_each(|(dst, src)| {
            for r0 in (0..rows).step_by(T) {
                for c0 in (0..cols).step_by(T) {
                    for r in r0..(r0 + T).min(rows) {
                        for c in c0..(c0 + T).min(cols) {
                            dst[c * rows + r] = src[r * cols + c];
                        }
                    }
                }
            }
        });
}

/// `C (+)= A·B` for f32 row-major-or-strided operands (`rs`/`cs`: row/column strides), one thread.
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    c_rs: usize,
    accumulate: bool,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
) {
    // Bounds of every element each operand's strides reach.
    assert!(m > 0 && n > 0 && k > 0);
    assert!(c.len() > (m - 1) * c_rs + (n - 1));
    assert!(a.len() > (m - 1) * a_rs + (k - 1) * a_cs);
    assert!(b.len() > (k - 1) * b_rs + (n - 1) * b_cs);
    // SAFETY: the asserts above keep every access within the slices; `c` is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// One task: query rows `q0 .. q0 + o.len() / dv` of batch·head `bh`,
/// written into `o`.
pub(super) fn task(inp: &Inputs, dims: &Dims, bh: usize, q0: usize, o: &mut [MaybeUninit<f32>]) {
    let Dims {
        lq,
        lk,
        d,
        dv,
        kv_block,
        ..
    } = *dims;
    o.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just initialised, and f32 and MaybeUninit<f32> share a layout.
    let o = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
    let rows = o.len() / dv;
    let q = &inp.q[(bh * lq + q0) * d..][..rows * d];
    let kt = &inp.k[bh * lk * d..][..lk * d]; // (D, Lk)
    let v = &inp.v[bh * lk * dv..][..lk * dv];
    let kb = kv_block.min(lk);
    // The worker's score tile and mask row.
    with_scratch(rows * kb + kb, |scratch| {
        let (s, mask_row) = scratch.split_at_mut(rows * kb);
        let mut softmax = Softmax::new(inp, dims, bh, rows);
        for k0 in (0..lk).step_by(kb) {
            let n = kb.min(lk - k0);
            let first = k0 == 0;
            let s = &mut s[..rows * n];
            // S = Q_blk · K_blkᵀ, with Kᵀ stored (D, Lk).
            gemm_f32(rows, n, d, s, n, false, q, d, 1, &kt[k0..], lk, 1);
            for (r, srow) in s.chunks_exact_mut(n).enumerate() {
                let alpha = softmax.update(r, q0 + r, k0, srow, mask_row);
                if !first && alpha != 1.0 {
                    (softmax.ops.scale)(&mut o[r * dv..(r + 1) * dv], alpha);
                }
            }
            // O (+)= P · V_blk
            gemm_f32(rows, dv, n, o, dv, !first, s, n, 1, &v[k0 * dv..], dv, 1);
        }
        for (r, row) in o.chunks_exact_mut(dv).enumerate() {
            (softmax.ops.scale)(row, softmax.factor(r));
        }
    })
}

//! `nn.LayerNorm` over the last dimension on the CPU as PyTorch 2.x computes it
//! (`aten/src/ATen/native/cpu/layer_norm_kernel.cpp`, PyTorch 2.15 measured): the row's mean
//! and biased variance by `RowwiseMoments` ([`super::moments::rowwise`]), then
//!
//! * f32 rows: `rstd = 1/sqrt(var + eps)` in f32 and `y = ((x − mean)·rstd)·γ + β`, the last
//!   product and sum fused where the CPU has FMA;
//! * f16/bf16 rows (upcast exactly; PyTorch's mixed-type kernel): `rstd` likewise,
//!   `y = (x·rstd + (−rstd·mean))·γ + β` in f32, both multiply-adds fused, rounded once to the
//!   half type by the caller.
//!
//! Bit for bit PyTorch 2.15's output (`tests/attention/norm_kernels.rs`). A two-pass
//! mean in f32 (Candle's `mean_keepdim`, a sequential sum) is less accurate than the Welford
//! cascade on long or near-constant rows, where `x − mean` is then off by the mean's error.

use super::moments::{fma, rowwise};
use crate::cpu::isa::fma_reported;
use crate::cpu::{contiguous, cpu_slice};
use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS: usize = 16;

/// `F.layer_norm(x, (n,), weight, bias, eps)` of an f32 CPU tensor `(..., n)` with f32
/// `weight`/`bias` `(n,)` (both or neither), as PyTorch's CPU kernel computes it (see the
/// module docs); `input`: PyTorch's dtype of the rows (f16/bf16 upcast: its half-precision
/// kernel). `None` where it does not apply (not CPU, not f32, shapes that do not fit).
pub fn layer_norm(x: &Tensor, affine: Option<(&Tensor, &Tensor)>, eps: f64, input: DType) -> Result<Option<Tensor>> {
    let n = x.dims().last().copied().unwrap_or(0);
    let mut all = vec![x];
    if let Some((w, b)) = affine {
        all.extend([w, b]);
        if w.elem_count() != n || b.elem_count() != n {
            return Ok(None);
        }
    }
    if n == 0 || !all.iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32) {
        return Ok(None);
    }
    let x = contiguous(x)?;
    let affine = match affine {
        Some((w, b)) => Some((w.flatten_all()?.to_vec1::<f32>()?, b.flatten_all()?.to_vec1::<f32>()?)),
        None => None,
    };
    let (storage, layout) = x.storage_and_layout();
    let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..x.elem_count()];
    let mut out = vec![0f32; src.len()];
    let fused = fma_reported();
    let affine = affine.as_ref().map(|(w, b)| (&w[..], &b[..]));
    out.par_chunks_mut(n * ROWS)
        .zip(src.par_chunks(n * ROWS))
        .for_each(|(dst, xs)| {
            for (dst, row) in dst.chunks_mut(n).zip(xs.chunks(n)) {
                if fused {
                    row_fused(row, dst, affine, eps, input)
                } else {
                    norm_row::<false>(row, dst, affine, eps, input)
                }
            }
        });
    drop(storage);
    Ok(Some(Tensor::from_vec(out, x.dims(), &Device::Cpu)?))
}

/// [`norm_row`] with fused multiply-adds, compiled for them.
fn row_fused(row: &[f32], dst: &mut [f32], affine: Option<(&[f32], &[f32])>, eps: f64, input: DType) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        fn go(row: &[f32], dst: &mut [f32], affine: Option<(&[f32], &[f32])>, eps: f64, input: DType) {
            norm_row::<true>(row, dst, affine, eps, input)
        }
        // SAFETY: only called where `fma_reported` found AVX2 and FMA.
        unsafe { go(row, dst, affine, eps, input) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    norm_row::<true>(row, dst, affine, eps, input)
}

#[inline(always)]
fn norm_row<const FUSED: bool>(row: &[f32], dst: &mut [f32], affine: Option<(&[f32], &[f32])>, eps: f64, input: DType) {
    let (mean, var) = rowwise::<FUSED>(row, input);
    let rstd = 1.0 / (var + eps as f32).sqrt();
    if matches!(input, DType::F16 | DType::BF16) {
        let shift = -rstd * mean;
        for (i, (d, &x)) in dst.iter_mut().zip(row).enumerate() {
            let t = fma::<FUSED>(x, rstd, shift);
            *d = match affine {
                Some((w, b)) => fma::<FUSED>(t, w[i], b[i]),
                None => t,
            };
        }
        return;
    }
    match affine {
        Some((w, b)) => {
            for (((d, &x), &w), &b) in dst.iter_mut().zip(row).zip(w).zip(b) {
                *d = fma::<FUSED>((x - mean) * rstd, w, b);
            }
        }
        None => {
            for (d, &x) in dst.iter_mut().zip(row) {
                *d = (x - mean) * rstd;
            }
        }
    }
}

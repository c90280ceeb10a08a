//! The TF32 mode (off by default): the counterpart of PyTorch's
//! `torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.allow_tf32` together.
//!
//! On, f32 work on CUDA may round its inputs to TF32 (10-bit mantissa) on tensor cores: Candle's
//! cuBLAS f32 GEMMs (`candle_core::cuda::set_gemm_reduced_precision_f32(true)`) and this crate's
//! cuDNN f32 convolutions (tensor-op math instead of FMA; feature `cudnn`). The fused attention
//! kernel's f32 variant stays plain FMA either way. Off, f32 is strict f32, what the parity
//! bundles (exported in strict f32) are checked against. f16/bf16 are not affected.
//!
//! Set by [`set_tf32`], else by `UNET_ATTENTION_TF32=off|on`, read once (the first call of
//! [`tf32`]: the first CUDA convolution, `unet_parity::cli::open_device` on CUDA, or a program's
//! own call); a value that is neither is an error returned by every call that reads it.

use candle_core::Result;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// 0: no override; 1: off; 2: on.
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Turn the TF32 mode on or off for every later call in this process (over the environment).
pub fn set_tf32(on: bool) {
    OVERRIDE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    candle_core::cuda::set_gemm_reduced_precision_f32(on);
}

/// Whether the TF32 mode is on: [`set_tf32`]'s last value, else `UNET_ATTENTION_TF32` (unset or
/// blank: off). Reading `on` from the environment also turns on Candle's TF32 GEMMs.
pub fn tf32() -> Result<bool> {
    match OVERRIDE.load(Ordering::Relaxed) {
        1 => return Ok(false),
        2 => return Ok(true),
        _ => {}
    }
    static ENV: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let on = crate::cpu::setting::choice("UNET_ATTENTION_TF32", &[("off", false), ("on", true)]);
        if on == Ok(true) && OVERRIDE.load(Ordering::Relaxed) == 0 {
            candle_core::cuda::set_gemm_reduced_precision_f32(true);
        }
        on
    })
    .clone()
    .map_err(candle_core::Error::msg)
}

//! unet-attention as a library user has it, one module per area, and the layering rule over
//! `src/` (`layering`). One test binary: none of these tests changes process-wide state (the
//! `UNET_ATTENTION_*` settings, the layer or attention path), so they can share a process.

mod common;

mod candle_interop;
mod dual_transformer;
mod finite_masks;
mod fused_path;
mod half_overflow;
mod layering;
mod norm_kernels;
mod sdpa_paths;

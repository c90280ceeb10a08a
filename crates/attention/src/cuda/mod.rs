//! This crate's own fused attention forward on CUDA (feature `cuda`): `softmax(q·kᵀ·scale +
//! mask)·v` in one kernel, without the score matrix in memory; and its fused layers
//! (`layers.rs`: GroupNorm with pre-add and swish, LayerNorm, GEGLU/SwiGLU gates, the bias +
//! residual + rescale epilogue; [`group_norm`], [`layer_norm`], [`gated`], [`epilogue`]), and `nn.Linear` with its bias
//! inside cuBLAS's f32 sum, as PyTorch's `addmm` ([`linear_with_bias`]).
//!
//! **Status: compiled in CI, never run on a GPU yet**; its source runs on the CPU under a CUDA
//! emulator in the unit tests (`cuda_plan/emulated.rs`, docs/gpu.md), with the same launch plans. [`SdpaPath::Auto`](crate::sdpa::SdpaPath)
//! does not pick it ([`AUTO_PICKS_FUSED`] is `false`); `UNET_ATTENTION_SDPA=fused` (or
//! [`SdpaPath::Fused`](crate::sdpa::SdpaPath::Fused)) does. The GPU kit's `fused` stage
//! (`examples/fused_check.rs`) checks it against the chunked path; once that passes on a GPU,
//! flip [`AUTO_PICKS_FUSED`].
//!
//! **Algorithm** (FlashAttention-2, written from the paper; `kernels/fused_attention.cu`): a thread
//! block of 4 warps owns 64 queries (16 per warp); key/value tiles of 64 keys (32 when the head
//! dim is over 160) stream through shared memory (`cp.async`, the next k tile loading during
//! p·v, the v tile during q·kᵀ); `mma.sync.m16n8k16` on `ldmatrix` fragments, f32 accumulation;
//! running row max and sum (online softmax), one division at the end. The probabilities are
//! rounded to f16/bf16 before p·v, as PyTorch's CUDA kernels do. Head dims 1 – 512 (padded with
//! zeros to a multiple of 16 in shared memory). Head dims over 256 (the VAE's 512) run the wide
//! kernel (`kernels/attention_wide.cuh`): 8 warps on one 64-query tile, the two halves of each
//! 16-row block splitting a key tile's scores (each computed once), sharing their rounded
//! probabilities through shared memory and splitting the output columns. f32: plain FMA, no
//! tensor cores. **Variants** ([`FusedVariant`], `UNET_ATTENTION_FUSED_VARIANT`): the default
//! f16/bf16 kernels take the softmax's exponentials as FlashAttention-2 does (one FFMA with the
//! scale and log2 e folded in, then the approximate `ex2`); they also come with `expf` (`base`),
//! with 8 warps (128 queries a block), (`chunked`) with head dims over 256 as column chunks of 256, a thread block
//! each recomputing q·kᵀ, and (`r32`, head dims up to 128) with 32 query rows a warp (128 a
//! block, each k and v fragment serving two row blocks), to be timed against the default on a GPU. **Split-KV**: when
//! (batch·heads·query tiles·chunks) fills less than 80 % of the blocks the GPU holds at once
//! (SMs × the kernel's occupancy, from the driver), the key tiles are split over up to 64
//! thread blocks per tile, as few as keep those places busy in whole waves, and a merge kernel
//! combines their f32 partial outputs and `(max, sum)` (`UNET_ATTENTION_FUSED_SPLITS` forces a
//! count).
//!
//! **Limits** (outside them [`fused_sdpa`] returns `None` and the caller falls back): a CUDA
//! device of compute capability ≥ 8.0 that the build's fat binary serves (SASS of its
//! architecture, or PTX the driver compiles: [`kernel_image`]; `UNET_ATTENTION_CUDA_ARCHS`, by
//! default sm_80 and sm_90 SASS and compute_80 PTX); q, k, v
//! f16, bf16 or f32, all one dtype, rank 4 `(B, H, L, D)` with equal batch and heads and equal
//! head dims `1 ≤ D ≤ 512` (v's head dim too); at least one query and one key; an additive mask
//! that broadcasts to `(B, H, Lq, Lk)` (boolean and key-padding masks arrive here as additive
//! ones). A row whose keys are all masked by −∞ gives 0 in every dtype (PyTorch's fused kernels do;
//! the chunked path gives NaN in f32); by one finite value (−1e9, `finfo(float32).min`, ...) the
//! mean of those keys' values, the softmax of equal logits, as PyTorch gives. Memory: the output,
//! plus `splits × B·H·Lq·(D + 2)` f32 of workspace when the keys are split (none unsplit).
//!
//! Also here: the TF32 mode ([`tf32`], [`set_tf32`]: off by default) and, with the feature
//! `cudnn`, this crate's own cuDNN convolution ([`conv`]: f16/bf16 with f32 accumulation, strict
//! f32, the algorithm cached).

mod launch;
mod layers;
mod layers_launch;
mod linear;
pub mod memory;
mod module;

pub use layers::{
    epilogue, gated, group_norm, layer_norm, layers_built, layers_enabled, layers_image, BiasAxis, GateAct, NormAct,
    AUTO_PICKS_CUDA_LAYERS,
};

pub use crate::cuda_plan::FusedVariant;
use crate::cuda_plan::{Dims, Plan};
use candle_core::{DType, Device, Result, Tensor};
pub use linear::linear_with_bias;
use std::sync::OnceLock;

#[cfg(feature = "cudnn")]
pub mod conv;
mod tf32_mode;
pub use tf32_mode::{set_tf32, tf32};

/// Whether [`SdpaPath::Auto`](crate::sdpa::SdpaPath::Auto) runs the fused kernel on CUDA. `false`
/// until the GPU kit's `fused` stage has passed on a GPU: flip it then.
pub const AUTO_PICKS_FUSED: bool = false;

/// Knobs of [`fused_sdpa`], for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FusedOptions {
    /// Split the keys over this many thread blocks per query tile (clamped to the number of key
    /// tiles; 1 turns split-KV off). `None`: [`fused_splits`] (`UNET_ATTENTION_FUSED_SPLITS`),
    /// and where that is `auto`, the fewest splits that keep the GPU's resident block places
    /// busy in whole waves (from the SM count and the kernel's occupancy the driver reports).
    pub splits: Option<usize>,
    /// Which f16/bf16 kernel. `None`: [`fused_variant`] (`UNET_ATTENTION_FUSED_VARIANT`).
    pub variant: Option<FusedVariant>,
}

/// The f16/bf16 kernel variant `UNET_ATTENTION_FUSED_VARIANT` names (`exp2`, the default when
/// unset or blank, `base`, `w8`, `w8-exp2`, `chunked`, `r32`; see [`FusedVariant`]), read once; another value is an
/// error from every call. For timing the variants against each other on a GPU (the kit's
/// `fusedcore` stage); `exp2` (FlashAttention-2's softmax) is the default until such a run says
/// otherwise, `base` keeps the `expf` softmax to time it against.
pub fn fused_variant() -> Result<FusedVariant> {
    static SETTING: OnceLock<std::result::Result<FusedVariant, String>> = OnceLock::new();
    SETTING
        .get_or_init(|| crate::cpu::setting::choice("UNET_ATTENTION_FUSED_VARIANT", &FusedVariant::ALL))
        .clone()
        .map_err(candle_core::Error::msg)
}

/// The key splits `UNET_ATTENTION_FUSED_SPLITS` asks for: `None` (unset, blank or `auto`: chosen
/// from the GPU, see [`FusedOptions::splits`]) or a positive count, read once; another value is
/// an error from every call. For timing split counts on a GPU (the kit's `splits` stage);
/// [`FusedOptions::splits`] overrides it.
pub fn fused_splits() -> Result<Option<usize>> {
    static SETTING: OnceLock<std::result::Result<Option<usize>, String>> = OnceLock::new();
    SETTING
        .get_or_init(|| {
            crate::cpu::setting::parsed(
                "UNET_ATTENTION_FUSED_SPLITS",
                "auto or a positive number",
                crate::cuda_plan::parse_splits,
            )
            .map(Option::flatten)
        })
        .clone()
        .map_err(candle_core::Error::msg)
}

/// Whether this build carries the attention kernels (always, under the `cuda` feature: a fat
/// binary of SASS and PTX, `build.rs`; whether a GPU runs it is [`kernel_image`]'s question).
pub fn kernel_built() -> bool {
    !launch::FUSED.bytes.is_empty()
}

/// What the GPU of `dev` runs of the attention kernels' image, in words: `sm_90 machine code`,
/// `compute_80 PTX compiled by the driver` (slow first call) or `fallback: <why>` (then
/// [`fused_sdpa`] returns `None` and the chunked path runs).
pub fn kernel_image(dev: &candle_core::cuda::CudaDevice) -> Result<String> {
    module::describe_selection(dev, &launch::FUSED)
}

/// The fused attention forward where it applies (see the module docs), `None` where it does
/// not (the caller then takes another path). Shapes and semantics as [`crate::sdpa::sdpa`].
pub fn fused_sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    opts: FusedOptions,
) -> Result<Option<Tensor>> {
    let Device::Cuda(dev) = q.device() else {
        return Ok(None);
    };
    let Some(shape) = supported_dims(q, k, v)? else {
        return Ok(None);
    };
    let Some(gpu) = launch::gpu_limits(dev)? else {
        return Ok(None);
    };
    let mask = match mask {
        None => None,
        Some(m) if !m.device().same_device(q.device()) || !m.dtype().is_float() => return Ok(None),
        Some(m) => match m
            .to_dtype(DType::F32)?
            .broadcast_as((shape.b, shape.h, shape.lq, shape.lk))
        {
            Ok(full) => Some(full),
            Err(_) => return Ok(None),
        },
    };
    let variant = match opts.variant {
        Some(v) => v,
        None => fused_variant()?,
    };
    let Some(plan) = Plan::new(&shape, q.dtype(), &gpu, variant) else {
        return Ok(None);
    };
    let splits = match opts.splits.map_or_else(fused_splits, |n| Ok(Some(n)))? {
        Some(n) => n,
        None => plan.auto_splits(gpu.sms * launch::blocks_per_sm(dev, &plan)?),
    };
    let Some(plan) = plan.split_keys(splits) else {
        return Ok(None);
    };
    let last_dim_contiguous = |t: &Tensor| -> Result<Tensor> {
        if t.stride()[3] == 1 {
            Ok(t.clone())
        } else {
            t.contiguous()
        }
    };
    let (q, k, v) = (
        last_dim_contiguous(q)?,
        last_dim_contiguous(k)?,
        last_dim_contiguous(v)?,
    );
    let op = launch::FusedAttention {
        mask,
        scale: scale as f32,
        plan,
    };
    Ok(Some(q.apply_op3_no_bwd(&k, &v, &op)?))
}

fn supported_dims(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<Dims>> {
    let dtype = q.dtype();
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
        || k.dtype() != dtype
        || v.dtype() != dtype
        || q.rank() != 4
        || k.rank() != 4
        || v.rank() != 4
        || !k.device().same_device(q.device())
        || !v.device().same_device(q.device())
    {
        return Ok(None);
    }
    let (b, h, lq, d) = q.dims4()?;
    let (kb, kh, lk, kd) = k.dims4()?;
    let ok = (kb, kh, kd) == (b, h, d) && v.dims() == [b, h, lk, d] && (1..=512).contains(&d) && lq > 0 && lk > 0;
    Ok(ok.then_some(Dims { b, h, lq, lk, d }))
}

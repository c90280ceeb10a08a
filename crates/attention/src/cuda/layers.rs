//! Fused layers on CUDA (`kernels/fused_layers.cu`): GroupNorm with an optional pre-add and
//! swish ([`group_norm`]), LayerNorm ([`layer_norm`]), the gated activations of GEGLU/SwiGLU ([`gated`]) and the bias +
//! residual + rescale epilogue of a projection ([`epilogue`]). Each computes in f32 and rounds
//! to the storage dtype (f32, f16 or bf16) exactly where PyTorch's chain of separate ops rounds
//! in that dtype, so a fused call gives what the unfused ops give up to f32 evaluation order.
//!
//! Every function returns `Ok(None)` where it does not apply (not CUDA, a dtype or shape the
//! kernels do not take, a GPU the build's kernel image does not serve: compute capability below
//! 8.0 or no entry for it, with a note once); the caller then
//! runs its tensor ops. **Status: compiled in CI, never run on a GPU yet**; the unit tests run the
//! kernels' source on the CPU under a CUDA emulator (`cuda_plan/emulated_layers.rs`), and the GPU
//! kit's `layers` stage (`examples/layers_check.rs`) checks each against an f64 CPU reference.
//!
//! **Switch** ([`layers_enabled`]): `UNET_ATTENTION_CUDA_LAYERS=on` turns the kernels on and with
//! them the native half-precision products of `ops::matmul`, `Projection` and the convolutions;
//! `off` keeps every function returning `None` and the half products computed on f32 copies, as
//! on the CPU (the path the committed bundles have passed on an H100); `auto` (the default, also
//! when unset or blank) is [`AUTO_PICKS_CUDA_LAYERS`]. Another value is an error from every call.

use super::layers_launch::{self as launch, EpilogueOp, GatedOp, GroupNormOp, LayerNormOp};
use candle_core::{DType, Device, Result, Tensor};
use std::sync::OnceLock;

/// The swish that follows a fused GroupNorm, computed in f32 from the norm's output rounded to
/// the storage dtype (a separate op reads the rounded tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormAct {
    /// `F.silu(y)` / `nn.SiLU`: `y / (1 + exp(−y))`, rounded once.
    Silu,
    /// ldm's `y * torch.sigmoid(y)`: the sigmoid rounded to the storage dtype, then the
    /// product rounded (two half ops).
    TimesSigmoid,
}

/// The activation of the gate half in [`gated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAct {
    /// `F.gelu(gate)` (approximate="none"): `g · 0.5 · (1 + erf(g / √2))`, diffusers' `GEGLU`.
    Gelu,
    /// `F.silu(gate)`, diffusers' `SwiGLU`.
    Silu,
}

/// Which dimension an [`epilogue`] bias runs along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BiasAxis {
    /// The last dimension (`nn.Linear` on tokens `(.., C)`).
    Last,
    /// Dimension 1 (a 1×1 convolution on `(B, C, ...)`).
    Channels,
}

/// Whether this build carries the layer kernels (always, under the `cuda` feature: a fat binary
/// of SASS and PTX, `build.rs`; whether a GPU runs it is [`layers_image`]'s question).
pub fn layers_built() -> bool {
    !launch::LAYERS.bytes.is_empty()
}

/// What the GPU of `dev` runs of the layer kernels' image, in words: `sm_90 machine code`,
/// `compute_80 PTX compiled by the driver` or `fallback: <why>`.
pub fn layers_image(dev: &candle_core::cuda::CudaDevice) -> Result<String> {
    super::module::describe_selection(dev, &launch::LAYERS)
}

/// What `UNET_ATTENTION_CUDA_LAYERS=auto` (the default) means: `false` until the GPU kit's
/// `layers` and `conv` stages and its `check` with `UNET_ATTENTION_CUDA_LAYERS=on` have passed on
/// a GPU (none of this has run on one yet): flip it then, as [`super::AUTO_PICKS_FUSED`].
pub const AUTO_PICKS_CUDA_LAYERS: bool = false;

/// Whether the fused layers and the native half products are on (`UNET_ATTENTION_CUDA_LAYERS`,
/// read once; see the module docs).
pub fn layers_enabled() -> Result<bool> {
    static SETTING: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    let choices = [("auto", AUTO_PICKS_CUDA_LAYERS), ("on", true), ("off", false)];
    SETTING
        .get_or_init(|| crate::cpu::setting::choice("UNET_ATTENTION_CUDA_LAYERS", &choices))
        .clone()
        .map_err(candle_core::Error::msg)
}

/// The CUDA device of `x` when the kernels can run on it with `x`'s dtype.
fn usable_device(x: &Tensor) -> Result<bool> {
    let Device::Cuda(dev) = x.device() else {
        return Ok(false);
    };
    if !layers_enabled()? {
        return Ok(false);
    }
    if launch::suffix(x.dtype()).is_none() || x.elem_count() == 0 {
        return Ok(false);
    }
    launch::usable(dev)
}

/// Whether an in-kernel `int` index up to `n` (and a thread's step past it) cannot overflow.
fn fits_i32(n: usize) -> bool {
    n < 1 << 30
}

/// `t` on `x`'s device in `dtype` with `elems` elements, contiguous; `None` otherwise.
fn operand(t: &Tensor, x: &Tensor, dtype: DType, elems: usize) -> Result<Option<Tensor>> {
    if !t.device().same_device(x.device()) || t.dtype() != dtype || t.elem_count() != elems {
        return Ok(None);
    }
    Ok(Some(t.contiguous()?))
}

/// `nn.GroupNorm(groups, C, eps)` over `x` `(B, C, *spatial)` with f32 `weight` and `bias`
/// `(C,)` (this crate's [`GroupNorm`](crate::layers::GroupNorm) holds them in f32 for half
/// runs, as guided-diffusion's `convert_to_fp16` does), optionally after `x + add[:, :, None,
/// None]` (`add` `(B, C)` in `x`'s dtype, the sum rounded as PyTorch's separate add rounds it:
/// a resnet's `h + temb` before `norm2`) and followed by `act`.
///
/// Matches PyTorch's CUDA `GroupNorm` in f32: per-(batch, group) mean and biased variance in f32
/// (two passes per chunk of up to a few thousand elements, chunks combined by Chan's formula),
/// `rstd = 1/sqrt(var + eps)`, `y = x·a + b` with `a = rstd·γ`, `b = β − mean·a`, rounded once;
/// then the activation in f32 from the rounded `y` and rounded again.
pub fn group_norm(
    x: &Tensor,
    add: Option<&Tensor>,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    act: Option<NormAct>,
) -> Result<Option<Tensor>> {
    if !usable_device(x)? || x.rank() < 2 || groups == 0 {
        return Ok(None);
    }
    let (b, c) = (x.dim(0)?, x.dim(1)?);
    let spatial: usize = x.dims()[2..].iter().product();
    let group_len = c / groups * spatial;
    let ok = c.is_multiple_of(groups)
        && b * groups <= 65_535
        && fits_i32(b * c)
        && fits_i32(spatial)
        && fits_i32(group_len)
        && fits_i32(group_len.div_ceil(2048));
    if !ok {
        return Ok(None);
    }
    let (Some(gamma), Some(beta)) = (operand(weight, x, DType::F32, c)?, operand(bias, x, DType::F32, c)?) else {
        return Ok(None);
    };
    let add = match add {
        None => None,
        Some(a) if a.dims() != [b, c] => return Ok(None),
        Some(a) => match operand(a, x, x.dtype(), b * c)? {
            Some(a) => Some(a),
            None => return Ok(None),
        },
    };
    let op = GroupNormOp {
        add,
        gamma,
        beta,
        groups,
        eps: eps as f32,
        act: match act {
            None => 0,
            Some(NormAct::Silu) => 1,
            Some(NormAct::TimesSigmoid) => 2,
        },
    };
    Ok(Some(x.contiguous()?.apply_op1_no_bwd(&op)?))
}

/// `nn.LayerNorm(n, eps)` over the last dimension of `x` `(.., n)`, with `affine` `(weight,
/// bias)` `(n,)` in f32 or without one. Matches PyTorch's CUDA `LayerNorm`: per-row mean and
/// biased variance in f32 (two passes here, Welford's there), `(x − mean)·rstd·γ + β` in f32,
/// rounded once to `x`'s dtype. One kernel where Candle's ops take ten passes over the tokens.
pub fn layer_norm(x: &Tensor, affine: Option<(&Tensor, &Tensor)>, eps: f64) -> Result<Option<Tensor>> {
    if !usable_device(x)? || x.rank() == 0 {
        return Ok(None);
    }
    let n = x.dims()[x.rank() - 1];
    if n == 0 || !fits_i32(n) {
        return Ok(None);
    }
    let affine = match affine {
        None => None,
        Some((w, b)) => match (operand(w, x, DType::F32, n)?, operand(b, x, DType::F32, n)?) {
            (Some(w), Some(b)) => Some((w, b)),
            _ => return Ok(None),
        },
    };
    let op = LayerNormOp {
        affine,
        eps: eps as f32,
    };
    Ok(Some(x.contiguous()?.apply_op1_no_bwd(&op)?))
}

/// `hidden * act(gate)` for `hidden, gate = h.chunk(2, dim=-1)` (diffusers' `GEGLU`/`SwiGLU`
/// after their projection): `act(gate)` in f32 from the stored gate, rounded, then the product
/// rounded (PyTorch's two half ops). `h` `(.., 2n)` → `(.., n)`.
pub fn gated(h: &Tensor, act: GateAct) -> Result<Option<Tensor>> {
    if !usable_device(h)? || h.rank() == 0 {
        return Ok(None);
    }
    let n2 = h.dims()[h.rank() - 1];
    if n2 == 0 || !n2.is_multiple_of(2) || !fits_i32(n2) {
        return Ok(None);
    }
    let op = GatedOp {
        act: match act {
            GateAct::Gelu => 0,
            GateAct::Silu => 1,
        },
    };
    Ok(Some(h.contiguous()?.apply_op1_no_bwd(&op)?))
}

/// `((h + bias) + residual) / div` with every part optional, each step rounded to `h`'s dtype as
/// PyTorch's separate ops round in half precision (`div` is a true division by the f32 value,
/// as [`crate::ops::div`]). `bias` `(C,)` in `h`'s dtype along `axis`; `residual` `h`'s shape
/// and dtype. `None` where nothing is to be done, or where the kernel does not apply.
pub fn epilogue(
    h: &Tensor,
    bias: Option<(&Tensor, BiasAxis)>,
    residual: Option<&Tensor>,
    div: Option<f64>,
) -> Result<Option<Tensor>> {
    let div = div.filter(|&d| d != 1.0);
    if !usable_device(h)? || (bias.is_none() && residual.is_none() && div.is_none()) {
        return Ok(None);
    }
    let dims = h.dims();
    let last = dims[dims.len() - 1];
    let (bias, cols, bias_on_rows) = match bias {
        None => (None, last, false),
        Some((t, axis)) => {
            let (len, cols, on_rows) = match axis {
                BiasAxis::Last => (last, last, false),
                BiasAxis::Channels if h.rank() >= 2 => (dims[1], dims[2..].iter().product(), true),
                BiasAxis::Channels => return Ok(None),
            };
            match operand(t, h, h.dtype(), len)? {
                Some(t) => (Some(t), cols, on_rows),
                None => return Ok(None),
            }
        }
    };
    if cols == 0 || !fits_i32(cols) {
        return Ok(None);
    }
    let residual = match residual {
        None => None,
        Some(r) if r.dims() != dims => return Ok(None),
        Some(r) => match operand(r, h, h.dtype(), h.elem_count())? {
            Some(r) => Some(r),
            None => return Ok(None),
        },
    };
    let op = EpilogueOp {
        bias,
        cols,
        bias_on_rows,
        residual,
        div: div.map(|d| d as f32),
    };
    Ok(Some(h.contiguous()?.apply_op1_no_bwd(&op)?))
}

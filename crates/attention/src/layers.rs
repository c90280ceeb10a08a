//! Layers shared by the blocks: projections that load `nn.Linear` or 1×1 conv weights, and the
//! norms the PyTorch blocks use (GroupNorm, lucidrains' RMSNorm, BatchNorm2d in eval mode).

use crate::cpu::contiguous;
use crate::cpu_kernels::{ConvExtras, PackedConv, PackedLinear, Swish};
use crate::ops::{is_half, mul, upcast};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder};

/// A learned projection `y = W·x + b` whose weight may be stored as an `nn.Linear` `(out, in)`,
/// a `Conv1d` with kernel 1 `(out, in, 1)` or a `Conv2d` 1×1 `(out, in, 1, 1)`. An f32 weight on
/// a CPU with AVX2+FMA or AVX-512 is packed once, here, for the CPU GEMM
/// ([`crate::cpu_kernels::PackedLinear`]; the unpacked copy is dropped); everything else runs
/// Candle's ops.
#[derive(Debug, Clone)]
pub struct Projection {
    /// The weight `(out, in)`, where it is not packed.
    weight: Option<Tensor>,
    packed: Option<PackedLinear>,
    bias: Option<Tensor>,
    out_dim: usize,
}

/// `<vb>.weight` of a projection in any of its stored layouts, `(out, in)`, `(out, in, 1, 1)` or
/// `(out, in, 1)`, as `(out, in)`. Each layout is asked for by its shape, so a backend that knows
/// a tensor's shape before reading it (unet-parity's checkpoints) refuses a wrong one without
/// reading its data; Candle's backends report the mismatch as `UnexpectedShape` too.
fn load_weight(vb: &VarBuilder, block: &'static str, in_dim: usize, out_dim: usize) -> Result<Tensor> {
    let mut found = None;
    // `vb.dtype()`: a `vb.to_dtype(..)` is honoured.
    for shape in [
        vec![out_dim, in_dim],
        vec![out_dim, in_dim, 1, 1],
        vec![out_dim, in_dim, 1],
    ] {
        match vb.get_with_hints_dtype(shape, "weight", candle_nn::Init::Const(0.), vb.dtype()) {
            Ok(weight) => return Ok(weight.reshape((out_dim, in_dim))?),
            Err(e) => match unexpected_shape(&e) {
                Some(got) => found = Some(got.dims().to_vec()),
                None => return Err(e.into()),
            },
        }
    }
    Err(Error::WeightShape {
        block,
        name: format!("{}.weight", vb.prefix()),
        expected: format!("({out_dim}, {in_dim}) or ({out_dim}, {in_dim}, 1[, 1])"),
        found: found.unwrap_or_default(),
    })
}

/// The shape found, when `e` is (or wraps) Candle's shape-mismatch error.
pub(crate) fn unexpected_shape(e: &candle_core::Error) -> Option<&candle_core::Shape> {
    use candle_core::Error as E;
    match e {
        E::UnexpectedShape { got, .. } => Some(got),
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => {
            unexpected_shape(inner)
        }
        _ => None,
    }
}

impl Projection {
    /// Load `<vb>.weight` (and `<vb>.bias` when `bias`) mapping `in_dim` to `out_dim` features.
    pub fn load(vb: VarBuilder, block: &'static str, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        Self::load_packed(vb, block, (in_dim, out_dim), bias, false)
    }

    /// [`Self::load`] for a GEGLU projection (`out_dim` = `2·n`, `[hidden | gate]`): a packed
    /// weight is paired so that [`Self::forward_geglu`] applies.
    pub fn load_gated(vb: VarBuilder, block: &'static str, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        Self::load_packed(vb, block, (in_dim, out_dim), bias, true)
    }

    fn load_packed(
        vb: VarBuilder,
        block: &'static str,
        (in_dim, out_dim): (usize, usize),
        bias: bool,
        gated: bool,
    ) -> Result<Self> {
        let weight = load_weight(&vb, block, in_dim, out_dim)?;
        let bias = if bias { Some(vb.get(out_dim, "bias")?) } else { None };
        let packed = if gated {
            PackedLinear::new_gated(&weight)?
        } else {
            PackedLinear::new(&weight)?
        };
        Ok(Self {
            weight: if packed.is_some() { None } else { Some(weight) },
            packed,
            bias,
            out_dim,
        })
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// The weight `(out, in)` (unpacked again where it is packed).
    fn weight(&self) -> candle_core::Result<Tensor> {
        match (&self.weight, &self.packed) {
            (Some(w), _) => Ok(w.clone()),
            (None, Some(p)) => p.weight(),
            (None, None) => unreachable!("a Projection holds its weight one way or the other"),
        }
    }

    /// `x · Wᵀ (+ b)` on the last dimension, in the dtype of `x` (f32 or f64): the packed GEMM
    /// where it applies, else Candle's `Linear`.
    fn product(&self, x: &Tensor, with_bias: bool) -> candle_core::Result<Tensor> {
        let bias = if with_bias { self.bias.as_ref() } else { None };
        if let Some(p) = &self.packed {
            if let Some(y) = p.forward(x, bias)? {
                return Ok(y);
            }
        }
        let linear = candle_nn::Linear::new(upcast(&self.weight()?)?, bias.map(upcast).transpose()?);
        // Candle's batched matmul mishandles some transposed (B, N, C) views of (B, C, N)
        // tensors; a contiguous copy is also what the GEMM wants.
        linear.forward(&contiguous(x)?)
    }

    /// GEGLU of the projection, `hidden · gelu(gate)` in one pass from the packed GEMM (for a
    /// [`Self::load_gated`] projection on f32 CPU tokens); `None` where that does not apply.
    pub fn forward_geglu(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        match &self.packed {
            Some(p) => Ok(p.forward_geglu(x, self.bias.as_ref())?),
            None => Ok(None),
        }
    }

    /// Apply to the last dimension, like `nn.Linear`: `(.., in)` → `(.., out)`.
    ///
    /// f16/bf16: product and bias in f32, rounded once, as PyTorch's `addmm` does (Candle's
    /// half-precision `Linear` rounds the product and then the sum).
    pub fn forward_tokens(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if is_half(x.dtype()) {
            return self.product(&upcast(x)?, true)?.to_dtype(x.dtype());
        }
        self.product(x, true)
    }

    /// `nn.Linear` on an input PyTorch holds as a non-contiguous view (a `transpose`d image, a
    /// `batch_first` query): there `F.linear` runs `matmul` and then adds the bias, so in
    /// f16/bf16 the product and the sum are each rounded (two roundings; on a contiguous input
    /// it is one fused `addmm`, [`Self::forward_tokens`]). Same values as
    /// [`Self::forward_tokens`] in f32/f64.
    pub fn forward_tokens_strided(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if !is_half(x.dtype()) {
            return self.forward_tokens(x);
        }
        let product = self.product(&upcast(x)?, false)?.to_dtype(x.dtype())?;
        match &self.bias {
            Some(bias) => product.broadcast_add(&bias.to_dtype(x.dtype())?),
            None => Ok(product),
        }
    }

    /// Apply to dimension 1, like a 1×1 conv: `(B, in, ...)` → `(B, out, ...)`; f16/bf16 in f32
    /// and rounded once, as PyTorch's convolution does.
    pub fn forward_channels(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dims = x.dims().to_vec();
        let (b, c) = (dims[0], dims[1]);
        let n: usize = dims[2..].iter().product();
        let mut out = dims;
        out[1] = self.out_dim;
        let x32 = upcast(x)?.reshape((b, c, n))?;
        if let Some(p) = &self.packed {
            // The GEMM runs on token rows: (B, in, N) → (B, N, in) and back, fast copies.
            if let Some(y) = p.forward(&contiguous(&x32.transpose(1, 2)?)?, self.bias.as_ref())? {
                return contiguous(&y.transpose(1, 2)?)?.reshape(out)?.to_dtype(x.dtype());
            }
        }
        let y = upcast(&self.weight()?)?.broadcast_matmul(&x32)?;
        let y = match &self.bias {
            Some(bias) => y.broadcast_add(&upcast(bias)?.reshape((self.out_dim, 1))?)?,
            None => y,
        };
        y.reshape(out)?.to_dtype(x.dtype())
    }
}

/// The bias-free fused `to_qkv` 1×1 conv of lucidrains' blocks and their derivatives
/// (Annotated Diffusion, ldm `LinearAttention`): `3·heads·dim_head` output channels laid out
/// `[Q | K | V]`, each split into heads `(h c)`.
#[derive(Debug, Clone)]
pub struct FusedQkvConv {
    proj: Projection,
    heads: usize,
}

impl FusedQkvConv {
    /// Load `<vb>.weight` of shape `(3·heads·dim_head, dim, 1, 1)`.
    pub fn load(vb: VarBuilder, block: &'static str, dim: usize, heads: usize, dim_head: usize) -> Result<Self> {
        if heads == 0 || dim_head == 0 {
            return Err(Error::config(
                block,
                format!("heads ({heads}) and dim_head ({dim_head}) must be positive"),
            ));
        }
        Ok(Self {
            proj: Projection::load(vb, block, dim, 3 * heads * dim_head, false)?,
            heads,
        })
    }

    /// `(B, dim, H, W)` → q, k, v, each `(B, heads, dim_head, H·W)` (channels first).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<[Tensor; 3]> {
        crate::heads::chunk_qkv_channels(&self.proj.forward_channels(x)?, self.heads)
    }
}

/// `nn.GroupNorm(num_groups, channels, eps, affine=True)` over dimension 1 of `(B, C, ...)`
/// (see [`GroupNorm`]).
pub fn group_norm(vb: VarBuilder, block: &'static str, groups: usize, channels: usize, eps: f64) -> Result<GroupNorm> {
    GroupNorm::load(vb, block, groups, channels, eps)
}

/// `nn.LayerNorm(dim, eps, elementwise_affine)` over the last dimension: two-pass mean and
/// biased variance, then the affine, all in at least f32 (as PyTorch's CPU kernel), cast back.
/// Keys `weight`, `bias` when `affine`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    pub fn load(vb: VarBuilder, dim: usize, eps: f64, affine: bool) -> Result<Self> {
        let (weight, bias) = if affine {
            (Some(vb.get(dim, "weight")?), Some(vb.get(dim, "bias")?))
        } else {
            (None, None)
        };
        Ok(Self { weight, bias, eps })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dtype = x.dtype();
        let compute = crate::ops::compute_dtype(dtype);
        let x = x.to_dtype(compute)?;
        let centered = x.broadcast_sub(&x.mean_keepdim(candle_core::D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        let mut y = centered.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        if let (Some(w), Some(b)) = (&self.weight, &self.bias) {
            y = y
                .broadcast_mul(&w.to_dtype(compute)?)?
                .broadcast_add(&b.to_dtype(compute)?)?;
        }
        y.to_dtype(dtype)
    }
}

/// lucidrains' 2.x `RMSNorm`: `F.normalize(x, dim=1) * g * sqrt(C)`; key `g` `(1, C, 1, 1)`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    g: Tensor,
    scale: f64,
}

impl RmsNorm {
    pub fn load(vb: VarBuilder, channels: usize) -> Result<Self> {
        Ok(Self {
            g: vb.get((1, channels, 1, 1), "g")?,
            scale: (channels as f64).sqrt(),
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // F.normalize: x / max(||x||_2 over dim 1, 1e-12), the norm accumulated in at least f32
        // and rounded to x's dtype before the division (as PyTorch does); then `* g`, `* scale`.
        let up = upcast(x)?;
        let squares = match crate::cpu_kernels::channel_sum_squares(&up)? {
            Some(s) => s,
            None => up.sqr()?.sum_keepdim(1)?,
        };
        let norm = squares.sqrt()?.clamp(1e-12, f64::INFINITY)?.to_dtype(x.dtype())?;
        let normalized = x.broadcast_div(&norm)?;
        mul(&normalized.broadcast_mul(&self.g)?, self.scale)
    }
}

/// `nn.BatchNorm2d(C)` in eval mode: running statistics, affine. Keys `weight`, `bias`,
/// `running_mean`, `running_var`, `num_batches_tracked`.
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    eps: f64,
}

impl BatchNorm2d {
    pub fn load(vb: VarBuilder, channels: usize, eps: f64) -> Result<Self> {
        // `num_batches_tracked` only matters for training; it is part of the state dict, a scalar.
        if vb.contains_tensor("num_batches_tracked") {
            vb.get_with_hints_dtype((), "num_batches_tracked", candle_nn::Init::Const(0.), DType::I64)?;
        }
        let shape = (1, channels, 1, 1);
        Ok(Self {
            weight: vb.get(channels, "weight")?.reshape(shape)?,
            bias: vb.get(channels, "bias")?.reshape(shape)?,
            running_mean: vb.get(channels, "running_mean")?.reshape(shape)?,
            running_var: vb.get(channels, "running_var")?.reshape(shape)?,
            eps,
        })
    }
}

impl Module for BatchNorm2d {
    /// In at least f32 and rounded once, as PyTorch's CPU kernel computes it in half precision.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let denom = (upcast(&self.running_var)? + self.eps)?.sqrt()?;
        upcast(x)?
            .broadcast_sub(&upcast(&self.running_mean)?)?
            .broadcast_div(&denom)?
            .broadcast_mul(&upcast(&self.weight)?)?
            .broadcast_add(&upcast(&self.bias)?)?
            .to_dtype(x.dtype())
    }
}

/// `nn.GroupNorm(num_groups, channels, eps, affine=True)` as PyTorch's CPU kernel computes it in
/// every dtype: statistics, normalisation and affine in at least f32, rounded once to the input
/// dtype. That is also OpenAI's / ldm `openaimodel`'s `GroupNorm32`
/// (`super().forward(x.float()).type(x.dtype)`). f16/bf16 inputs and weights are upcast to f32;
/// f32 and f64 stay as they are (a float64 reference run keeps the whole block in float64).
/// Candle's own `GroupNorm` normalises in f32 but applies the affine in the input dtype (three
/// roundings instead of one). On the CPU the f32 computation is [`crate::cpu_kernels::group_norm`]
/// (PyTorch's per-channel scale and shift, one pass), elsewhere Candle's ops.
///
/// The weight and bias are loaded in the compute dtype of the run (f32 for f16/bf16 runs, else
/// the run's dtype), never rounded to the half type: guided-diffusion's half-precision mode
/// (`convert_to_fp16`) keeps the `GroupNorm32` parameters in f32, and a half-precision weight
/// upcasts exactly.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    groups: usize,
    channels: usize,
    eps: f64,
}

impl GroupNorm {
    /// Load `<vb>.weight` and `<vb>.bias`, both `(channels,)`.
    pub fn load(vb: VarBuilder, block: &'static str, groups: usize, channels: usize, eps: f64) -> Result<Self> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(Error::config(
                block,
                format!("{groups} norm groups do not divide {channels} channels"),
            ));
        }
        // Rounded to the block's dtype first, as PyTorch's `module.to(dtype)` rounds a wider
        // checkpoint's parameters, then held in the compute dtype. (A block that keeps its norms
        // wider, as guided-diffusion's `convert_to_fp16` does, passes a `vb` of that dtype.)
        let compute = crate::ops::compute_dtype(vb.dtype());
        Ok(Self {
            weight: vb.get(channels, "weight")?.to_dtype(compute)?,
            bias: vb.get(channels, "bias")?.to_dtype(compute)?,
            groups,
            channels,
            eps,
        })
    }

    /// `act(norm(x))`, with the norm's output recorded as the trace stage `stage`. In f32 on
    /// the CPU one pass ([`crate::cpu_kernels::group_norm_act`] with `swish`, the form `act`
    /// computes), except while a trace is recorded (the stage is the norm's own output);
    /// otherwise the norm, then `act`.
    pub fn forward_swish(
        &self,
        x: &Tensor,
        stage: &str,
        swish: Swish,
        act: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        if x.dtype() == DType::F32 && !crate::trace::enabled() {
            let xc = contiguous(x)?;
            let (w, b) = (&self.weight, &self.bias);
            if let Some(y) = crate::cpu_kernels::group_norm_act(&xc, w, b, self.groups, self.eps, Some(swish))? {
                return Ok(y);
            }
        }
        let normed = self.forward(x)?;
        crate::trace::record(stage, &normed);
        act(&normed)
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dtype = crate::ops::compute_dtype(x.dtype());
        // Any layout: the transposed token views of the diffusers blocks are copied once here.
        let xc = contiguous(&x.to_dtype(dtype)?)?;
        let (w, b) = (self.weight.to_dtype(dtype)?, self.bias.to_dtype(dtype)?);
        if let Some(y) = crate::cpu_kernels::group_norm(&xc, &w, &b, self.groups, self.eps)? {
            return y.to_dtype(x.dtype());
        }
        let norm = candle_nn::GroupNorm::new(w, b, self.channels, self.groups, self.eps)?;
        norm.forward(&xc)?.to_dtype(x.dtype())
    }
}

/// diffusers' `RMSNorm(dim, eps, elementwise_affine)` (`models/normalization.py`) over the last
/// dimension: `x · rsqrt(mean(x.float()², -1) + eps)`, then `· weight`. The mean square, `rsqrt`
/// and product are in at least f32 (f64 input stays f64, as in a float64 reference run); a
/// half-precision `weight` casts the product back to the weight's dtype before multiplying, and
/// without a weight it is cast back to the input dtype, as in PyTorch. Key `weight` `(dim,)`
/// when `affine`.
#[derive(Debug, Clone)]
pub struct LastDimRmsNorm {
    weight: Option<Tensor>,
    dim: usize,
    eps: f64,
}

impl LastDimRmsNorm {
    pub fn load(vb: VarBuilder, dim: usize, eps: f64, affine: bool) -> Result<Self> {
        let weight = if affine { Some(vb.get(dim, "weight")?) } else { None };
        Ok(Self { weight, dim, eps })
    }

    /// The normalised (last-dimension) size.
    pub fn dim(&self) -> usize {
        self.dim
    }
}

impl Module for LastDimRmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dtype = x.dtype();
        let compute = crate::ops::compute_dtype(dtype);
        let x = x.to_dtype(compute)?;
        let variance = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        let y = x.broadcast_mul(&(variance + self.eps)?.sqrt()?.recip()?)?;
        match &self.weight {
            Some(w) if matches!(w.dtype(), DType::F16 | DType::BF16) => y.to_dtype(w.dtype())?.broadcast_mul(w),
            Some(w) => y.broadcast_mul(&w.to_dtype(compute)?),
            None => y.to_dtype(dtype),
        }
    }
}

/// `F.normalize(x, p=2, dim=-1, eps)`: `x / max(‖x‖₂, eps)` over the last dimension (diffusers'
/// `LpNorm(p=2, dim=-1)`): the norm accumulated in at least f32 and rounded to `x`'s dtype,
/// then the division (rounded), as PyTorch computes it.
pub fn l2_normalize_last_dim(x: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let norm = upcast(x)?
        .sqr()?
        .sum_keepdim(candle_core::D::Minus1)?
        .sqrt()?
        .clamp(eps, f64::INFINITY)?
        .to_dtype(x.dtype())?;
    x.broadcast_div(&norm)
}

/// The source indices of PyTorch's `mode="nearest"` resampling of `input` samples to `output`:
/// `i` when the sizes match, `i >> 1` when doubling, else `min(floor(i · (in / out)), in − 1)`
/// with the scale and product in f32 (`nearest_idx` in ATen's `UpSample.h`).
pub fn nearest_source_indices(input: usize, output: usize) -> Vec<u32> {
    (0..output)
        .map(|i| {
            let src = if output == input {
                i
            } else if output == 2 * input {
                i >> 1
            } else {
                let scale = input as f32 / output as f32;
                ((i as f32 * scale).floor() as usize).min(input.saturating_sub(1))
            };
            src as u32
        })
        .collect()
}

/// `F.interpolate(x, size=(h, w), mode="nearest")` on `(B, C, H, W)`, with PyTorch's index map
/// ([`nearest_source_indices`]) for any ratio, integer or not, up or down.
pub fn interpolate_nearest2d(x: &Tensor, h: usize, w: usize) -> candle_core::Result<Tensor> {
    let (_, _, in_h, in_w) = x.dims4()?;
    let select = |x: &Tensor, dim: usize, input: usize, output: usize| -> candle_core::Result<Tensor> {
        if input == output {
            return Ok(x.clone());
        }
        let idx = Tensor::new(nearest_source_indices(input, output), x.device())?;
        x.contiguous()?.index_select(&idx, dim)
    };
    let x = select(x, 2, in_h, h)?;
    select(&x, 3, in_w, w)
}

/// diffusers' `SpatialNorm(f_channels, zq_channels)` (`attention_processor.py`, MoVQ):
/// `zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")`;
/// `GroupNorm(32, f_channels, eps=1e-6)(f) · conv_y(zq) + conv_b(zq)` with 1×1 convs (bias).
/// Keys `norm_layer.{weight,bias}`, `conv_y.{weight,bias}`, `conv_b.{weight,bias}`.
#[derive(Debug, Clone)]
pub struct SpatialNorm {
    norm_layer: GroupNorm,
    conv_y: Projection,
    conv_b: Projection,
}

impl SpatialNorm {
    pub fn load(vb: VarBuilder, block: &'static str, f_channels: usize, zq_channels: usize) -> Result<Self> {
        Ok(Self {
            norm_layer: group_norm(vb.pp("norm_layer"), block, 32, f_channels, 1e-6)?,
            conv_y: Projection::load(vb.pp("conv_y"), block, zq_channels, f_channels, true)?,
            conv_b: Projection::load(vb.pp("conv_b"), block, zq_channels, f_channels, true)?,
        })
    }

    /// `f`: `(B, f_channels, H, W)`; `zq`: `(B or 1, zq_channels, h, w)` → `(B, f_channels, H, W)`.
    pub fn forward(&self, f: &Tensor, zq: &Tensor) -> candle_core::Result<Tensor> {
        let (_, _, h, w) = f.dims4()?;
        let zq = interpolate_nearest2d(zq, h, w)?;
        let norm_f = self.norm_layer.forward(f)?;
        norm_f
            .broadcast_mul(&self.conv_y.forward_channels(&zq)?)?
            .broadcast_add(&self.conv_b.forward_channels(&zq)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::collections::HashMap;

    #[test]
    fn projection_agrees_on_transposed_views_and_conv_shaped_weights() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1., (5, 4), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., 5, &dev).unwrap();
        let ts = HashMap::from([
            ("p.weight".to_string(), w.reshape((5, 4, 1, 1)).unwrap()),
            ("p.bias".to_string(), b),
        ]);
        let vb = VarBuilder::from_tensors(ts, DType::F32, &dev);
        let p = Projection::load(vb.pp("p"), "test", 4, 5, true).unwrap();
        // (B, C, N) contiguous, viewed as (B, N, C): the layout of image tokens.
        let x = Tensor::randn(0f32, 1., (3, 4, 7), &dev).unwrap();
        let view = x.transpose(1, 2).unwrap();
        let a = p.forward_tokens(&view).unwrap();
        let c = p.forward_tokens(&view.contiguous().unwrap()).unwrap();
        let diff = (a - &c)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "{diff}");
        let by_channels = p.forward_channels(&x).unwrap().transpose(1, 2).unwrap();
        let diff = (by_channels - c)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
        let vb = VarBuilder::from_tensors(HashMap::from([("p.weight".to_string(), w)]), DType::F32, &dev);
        let err = Projection::load(vb.pp("p"), "test", 5, 4, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("p.weight") && err.contains("[5, 4]"), "{err}");
    }
}

/// `nn.Conv2d(in, out, kernel, stride=1, padding=kernel // 2)` (the 3×3 and 1×1 convs of the
/// ResNet blocks). Keys `weight (out, in, k, k)`, `bias (out,)` when `bias`. f16/bf16: computed
/// in f32 and rounded once, as PyTorch's CPU convolution accumulates. An f32 weight on a CPU
/// with AVX2+FMA or AVX-512 is packed once, here, for the CPU GEMM
/// ([`crate::cpu_kernels::PackedConv`]: no im2col matrix, the unpacked copy dropped).
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// The weight, where it is not packed.
    weight: Option<Tensor>,
    packed: Option<PackedConv>,
    bias: Option<Tensor>,
    padding: usize,
}

impl Conv2d {
    pub fn load(vb: VarBuilder, in_channels: usize, out_channels: usize, kernel: usize, bias: bool) -> Result<Self> {
        let weight = vb.get((out_channels, in_channels, kernel, kernel), "weight")?;
        let packed = PackedConv::new(&weight)?;
        Ok(Self {
            weight: if packed.is_some() { None } else { Some(weight) },
            packed,
            bias: if bias {
                Some(vb.get(out_channels, "bias")?)
            } else {
                None
            },
            padding: kernel / 2,
        })
    }

    /// `conv(x)`, then `+ channel_add[:, :, None, None]`, `residual +` and `/ div`, each as
    /// PyTorch's separate op rounds it (fused into the GEMM's write-out for f32 on the CPU).
    pub fn forward_with(&self, x: &Tensor, extras: ConvExtras) -> candle_core::Result<Tensor> {
        let div = extras.div.filter(|&d| d != 1.0);
        if let Some(p) = self.packed.as_ref().filter(|_| x.dtype() == DType::F32) {
            if let Some(y) = p.forward(x, self.bias.as_ref(), ConvExtras { div, ..extras })? {
                return Ok(y);
            }
        }
        apply_extras(self.conv(x)?, extras)
    }

    /// [`Self::forward_with`], the convolution's own output recorded as the trace stage
    /// `stage` (then nothing is fused: the stage is the output before the extras).
    pub fn forward_traced(&self, x: &Tensor, stage: &str, extras: ConvExtras) -> candle_core::Result<Tensor> {
        if !crate::trace::enabled() {
            return self.forward_with(x, extras);
        }
        let h = self.conv(x)?;
        crate::trace::record(stage, &h);
        apply_extras(h, extras)
    }

    /// The convolution alone, in at least f32, rounded once to the dtype of `x`.
    fn conv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x32 = upcast(x)?;
        if let Some(p) = &self.packed {
            if let Some(y) = p.forward(&x32, self.bias.as_ref(), ConvExtras::default())? {
                return y.to_dtype(x.dtype());
            }
        }
        let weight = match (&self.weight, &self.packed) {
            (Some(w), _) => w.clone(),
            (None, Some(p)) => p.weight()?,
            (None, None) => unreachable!("a Conv2d holds its weight one way or the other"),
        };
        let config = candle_nn::Conv2dConfig {
            padding: self.padding,
            ..Default::default()
        };
        let conv = candle_nn::Conv2d::new(upcast(&weight)?, self.bias.as_ref().map(upcast).transpose()?, config);
        conv.forward(&x32)?.to_dtype(x.dtype())
    }
}

/// `h + channel_add[:, :, None, None]`, `residual + h`, `/ div`, as separate ops.
fn apply_extras(h: Tensor, extras: ConvExtras) -> candle_core::Result<Tensor> {
    let h = match extras.channel_add {
        Some(t) => h.broadcast_add(&t.unsqueeze(2)?.unsqueeze(3)?)?,
        None => h,
    };
    let h = match extras.residual {
        Some(r) => (r + h)?,
        None => h,
    };
    match extras.div.filter(|&d| d != 1.0) {
        Some(d) => crate::ops::div(&h, d),
        None => Ok(h),
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_with(x, ConvExtras::default())
    }
}

/// The nonlinearities diffusers' `get_activation` names (`swish`/`silu`, `mish`, `gelu`,
/// `relu`), elementwise in at least f32 and rounded once, as PyTorch's CPU kernels do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    #[serde(alias = "silu")]
    Swish,
    Mish,
    Gelu,
    Relu,
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = upcast(x)?;
        let y = match self {
            Activation::Swish => candle_nn::ops::silu(&y)?,
            // x · tanh(softplus(x)), softplus = log(1 + exp(x)) (PyTorch switches to x above 20)
            Activation::Mish => {
                let softplus = y.exp()?.affine(1.0, 1.0)?.log()?;
                let big = y.ge(20.0)?;
                let softplus = big.where_cond(&y, &softplus)?;
                (&y * softplus.tanh()?)?
            }
            Activation::Gelu => y.gelu_erf()?,
            Activation::Relu => y.relu()?,
        };
        y.to_dtype(x.dtype())
    }
}

/// `x * (1 + scale) + shift` with `scale`, `shift` `(B, C)` broadcast over the spatial dims:
/// the FiLM / scale-shift conditioning of the ResNet blocks.
pub fn scale_shift(x: &Tensor, scale: &Tensor, shift: &Tensor) -> candle_core::Result<Tensor> {
    let spatial = vec![1; x.rank() - 2];
    let as_map = |t: &Tensor| -> candle_core::Result<Tensor> {
        let mut dims = t.dims()[..2].to_vec();
        dims.extend(&spatial);
        t.reshape(dims)
    };
    x.broadcast_mul(&(as_map(scale)? + 1.0)?)?
        .broadcast_add(&as_map(shift)?)
}

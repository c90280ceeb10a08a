//! The norms of the PyTorch blocks: GroupNorm, LayerNorm, lucidrains' RMSNorm, diffusers'
//! last-dimension RMSNorm, BatchNorm2d in eval mode, the L2 normalisation and diffusers'
//! `SpatialNorm`.

use super::{interpolate_nearest2d, Projection};
use crate::cpu::contiguous;
use crate::cpu_kernels::{MemoryFormat, NormForm, Swish};
use crate::ops::{mul, upcast, CastTo};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder};
use std::sync::{Arc, OnceLock};

/// `nn.GroupNorm(num_groups, channels, eps, affine=True)` over dimension 1 of `(B, C, ...)`
/// (see [`GroupNorm`]).
pub fn group_norm(vb: VarBuilder, block: &'static str, groups: usize, channels: usize, eps: f64) -> Result<GroupNorm> {
    GroupNorm::load(vb, block, groups, channels, eps)
}

/// `nn.LayerNorm(dim, eps, elementwise_affine)` over the last dimension, in at least f32, cast
/// back: on the CPU in f32 PyTorch's own kernel ([`crate::cpu_kernels::layer_norm`]: its Welford
/// moments and its `((x − mean)·rstd)·γ + β`), elsewhere (f64, other devices) a two-pass mean
/// and biased variance, then `(x − mean)/sqrt(var + eps)·γ + β`.
/// Keys `weight`, `bias` when `affine`. On CUDA with the CUDA layers on, one fused kernel of
/// the same arithmetic (`unet_attention::cuda::layer_norm` (feature `cuda`)).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
    /// The affine in f32 for the CUDA kernel, made on its first call and shared by clones.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    affine_f32: Arc<OnceLock<Option<(Tensor, Tensor)>>>,
}

impl LayerNorm {
    pub fn load(vb: VarBuilder, dim: usize, eps: f64, affine: bool) -> Result<Self> {
        crate::validate::eps("nn.LayerNorm", eps)?;
        let (weight, bias) = if affine {
            (Some(vb.get(dim, "weight")?), Some(vb.get(dim, "bias")?))
        } else {
            (None, None)
        };
        Ok(Self {
            weight,
            bias,
            eps,
            affine_f32: Arc::default(),
        })
    }

    /// The fused CUDA kernel where it applies (CUDA, the CUDA layers on, no stage trace being
    /// recorded: a trace keeps the reference path); `None` elsewhere.
    fn fused_cuda(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        if !x.device().is_cuda() || crate::trace::enabled() {
            return Ok(None);
        }
        self.fused_cuda_kernel(x)
    }

    #[cfg(feature = "cuda")]
    fn fused_cuda_kernel(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let affine = match (&self.weight, &self.bias, self.affine_f32.get()) {
            (Some(_), Some(_), Some(pair)) => pair.clone(),
            (Some(w), Some(b), None) => {
                let pair = Some((w.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?));
                self.affine_f32.get_or_init(|| pair).clone()
            }
            _ => None,
        };
        crate::cuda::layer_norm(x, affine.as_ref().map(|(w, b)| (w, b)), self.eps)
    }

    #[cfg(not(feature = "cuda"))]
    fn fused_cuda_kernel(&self, _x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(None)
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(y) = self.fused_cuda(x)? {
            return Ok(y);
        }
        let dtype = x.dtype();
        let compute = crate::ops::compute_dtype(dtype);
        let x = crate::ops::cast(x, compute)?;
        let affine = match (&self.weight, &self.bias) {
            (Some(w), Some(b)) => Some((w.to_dtype(compute)?, b.to_dtype(compute)?)),
            _ => None,
        };
        let pair = affine.as_ref().map(|(w, b)| (w, b));
        if let Some(y) = crate::cpu_kernels::layer_norm(&x, pair, self.eps, dtype)? {
            return crate::ops::cast(&y, dtype);
        }
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

impl RmsNorm {
    /// The norm, then lucidrains' `Block` tail: `x * (scale + 1) + shift` with `film`'s `(B, C)`
    /// `(scale, shift)`, and SiLU when `silu`. One pass on f32 CPU tensors (the norm's bits, the
    /// SiLU within 1 ulp: [`crate::cpu_kernels::rms_norm_act`]), else the tensor ops.
    pub fn forward_film_silu(
        &self,
        x: &Tensor,
        film: Option<(&Tensor, &Tensor)>,
        silu: bool,
    ) -> candle_core::Result<Tensor> {
        let act = silu.then_some(Swish::Silu);
        if let Some(y) = crate::cpu_kernels::rms_norm_act(x, &self.g, self.scale, film, act)? {
            return Ok(y);
        }
        let y = self.forward(x)?;
        let y = match film {
            Some((scale, shift)) => super::scale_shift(&y, scale, shift)?,
            None => y,
        };
        if silu {
            super::Activation::Swish.forward(&y)
        } else {
            Ok(y)
        }
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(y) = crate::cpu_kernels::rms_norm_act(x, &self.g, self.scale, None, None)? {
            return Ok(y);
        }
        // F.normalize: x / max(||x||_2 over dim 1, 1e-12), the norm accumulated in at least f32
        // and rounded to x's dtype before the division (as PyTorch does); then `* g`, `* scale`.
        let up = upcast(x)?;
        let squares = match crate::cpu_kernels::channel_sum_squares(&up)? {
            Some(s) => s,
            None => up.sqr()?.sum_keepdim(1)?,
        };
        let norm = squares.sqrt()?.clamp(1e-12, f64::INFINITY)?.cast_to(x.dtype())?;
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
        crate::validate::eps("nn.BatchNorm2d", eps)?;
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
            .cast_to(x.dtype())
    }
}

/// `nn.GroupNorm(num_groups, channels, eps, affine=True)` as PyTorch's CPU kernel computes it in
/// every dtype: statistics, normalisation and affine in at least f32, rounded once to the input
/// dtype. That is also OpenAI's / ldm `openaimodel`'s `GroupNorm32`
/// (`super().forward(x.float()).type(x.dtype)`). f16/bf16 inputs and weights are upcast to f32;
/// f32 and f64 stay as they are (a float64 reference run keeps the whole block in float64).
/// Candle's own `GroupNorm` normalises in f32 but applies the affine in the input dtype (three
/// roundings instead of one). On the CPU the f32 computation is [`crate::cpu_kernels::group_norm_as`]:
/// PyTorch's own CPU kernel for the input's [`MemoryFormat`] (its moments, its per-channel
/// scale and shift, one pass; the blocks pass [`MemoryFormat::ChannelsLast`] where PyTorch's
/// input is channels_last, see [`Self::forward_as`]), elsewhere Candle's ops.
///
/// The weight and bias are loaded in the compute dtype of the run (f32 for f16/bf16 runs, else
/// the run's dtype), never rounded to the half type: guided-diffusion's half-precision mode
/// (`convert_to_fp16`) keeps the `GroupNorm32` parameters in f32, and a half-precision weight
/// upcasts exactly.
///
/// **On CUDA** (f32, f16, bf16, no stage trace recorded) the norm is one fused kernel
/// (`unet_attention::cuda::group_norm` (feature `cuda`): f32 statistics per (batch, group), the affine in f32, rounded
/// once, as PyTorch's CUDA kernel), and [`Self::forward_swish`] / [`Self::forward_swish_add`]
/// fuse the swish (computed from the rounded norm, rounded again) and a resnet's pre-norm add.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    groups: usize,
    channels: usize,
    eps: f64,
    /// PyTorch's kernel sees an f32 input whatever the block's dtype (`GroupNorm32`).
    float_input: bool,
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
        crate::validate::eps(block, eps)?;
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
            float_input: false,
        })
    }

    /// OpenAI's `GroupNorm32` (`super().forward(x.float()).type(x.dtype)`): PyTorch's kernel
    /// reads an f32 input in a half-precision block (its f32 vectors, not its half ones).
    pub fn float_input(self) -> Self {
        Self {
            float_input: true,
            ..self
        }
    }

    /// How PyTorch's kernel computes this norm of `x` laid out as `format`.
    fn form(&self, x: &Tensor, format: MemoryFormat) -> NormForm {
        let input = if self.float_input { DType::F32 } else { x.dtype() };
        NormForm { format, input }
    }

    /// The norm of `x` as PyTorch computes it when its input is laid out as `format`: PyTorch's
    /// CPU GroupNorm has a kernel for contiguous and one for channels_last input, which round
    /// differently (see [`crate::cpu_kernels::group_norm_as`]). [`Module::forward`] is the
    /// contiguous one.
    pub fn forward_as(&self, x: &Tensor, format: MemoryFormat) -> candle_core::Result<Tensor> {
        if let Some(y) = self.fused_cuda(x, None, None)? {
            return Ok(y);
        }
        let dtype = crate::ops::compute_dtype(x.dtype());
        // Any layout: the transposed token views of the diffusers blocks are copied once here.
        let xc = contiguous(&crate::ops::cast(x, dtype)?)?;
        let (w, b) = (self.weight.to_dtype(dtype)?, self.bias.to_dtype(dtype)?);
        let form = self.form(x, format);
        if let Some(y) = crate::cpu_kernels::group_norm_as(&xc, (&w, &b), (self.groups, self.eps), form, None)? {
            return y.cast_to(x.dtype());
        }
        let norm = candle_nn::GroupNorm::new(w, b, self.channels, self.groups, self.eps)?;
        norm.forward(&xc)?.cast_to(x.dtype())
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
        self.forward_swish_as(x, MemoryFormat::Contiguous, stage, swish, act)
    }

    /// [`Self::forward_swish`] of an input PyTorch lays out as `format` ([`Self::forward_as`]).
    pub fn forward_swish_as(
        &self,
        x: &Tensor,
        format: MemoryFormat,
        stage: &str,
        swish: Swish,
        act: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        if let Some(y) = self.fused_cuda(x, None, Some(swish))? {
            return Ok(y);
        }
        if x.dtype() == DType::F32 && !crate::trace::enabled() {
            let xc = contiguous(x)?;
            let (w, b) = (&self.weight, &self.bias);
            let (form, groups) = (self.form(x, format), (self.groups, self.eps));
            if let Some(y) = crate::cpu_kernels::group_norm_as(&xc, (w, b), groups, form, Some(swish))? {
                return Ok(y);
            }
        }
        let normed = self.forward_as(x, format)?;
        crate::trace::record(stage, &normed);
        act(&normed)
    }
}

impl GroupNorm {
    /// `act(norm(x + add[:, :, None, None]))` (`add` `(B, C)`, the sum rounded to `x`'s dtype as
    /// PyTorch's separate add rounds it: a resnet's `h + temb` before `norm2`), the norm recorded
    /// as the trace stage `stage` (the sum is not recorded). One fused kernel on CUDA (see the
    /// type's docs); elsewhere the add (`broadcast_add` in `x`'s dtype), then
    /// [`Self::forward_swish`].
    pub fn forward_swish_add(
        &self,
        x: &Tensor,
        add: &Tensor,
        stage: &str,
        swish: Swish,
        act: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        self.forward_swish_add_as(x, add, MemoryFormat::Contiguous, stage, swish, act)
    }

    /// [`Self::forward_swish_add`] of an input PyTorch lays out as `format`.
    pub fn forward_swish_add_as(
        &self,
        x: &Tensor,
        add: &Tensor,
        format: MemoryFormat,
        stage: &str,
        swish: Swish,
        act: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        if let Some(y) = self.fused_cuda(x, Some(add), Some(swish))? {
            return Ok(y);
        }
        let mut shape = add.dims().to_vec();
        shape.resize(x.rank(), 1);
        let sum = x.broadcast_add(&add.reshape(shape)?)?;
        self.forward_swish_as(&sum, format, stage, swish, act)
    }

    /// Whether a resnet should hand its `h + add[:, :, None, None]` to
    /// [`Self::forward_swish_add`] rather than add it in the convolution before the norm: `x`
    /// (the convolution's input, of the output's dtype and device) on a CUDA device in a build
    /// with the `cuda` feature, `add` `(B, C)` of `x`'s dtype, no trace recorded (the trace
    /// records the convolution's output with the add).
    pub fn fuses_pre_add(x: &Tensor, add: &Tensor) -> bool {
        cfg!(feature = "cuda")
            && x.device().is_cuda()
            && add.rank() == 2
            && add.dtype() == x.dtype()
            && !crate::trace::enabled()
    }

    /// The fused CUDA kernel where it applies (a CUDA tensor of f32, f16 or bf16, f32 norm
    /// parameters, no trace recorded), else `None`.
    fn fused_cuda(
        &self,
        x: &Tensor,
        add: Option<&Tensor>,
        swish: Option<Swish>,
    ) -> candle_core::Result<Option<Tensor>> {
        if !x.device().is_cuda() || crate::trace::enabled() {
            return Ok(None);
        }
        self.fused_kernel(x, add, swish)
    }

    #[cfg(feature = "cuda")]
    fn fused_kernel(
        &self,
        x: &Tensor,
        add: Option<&Tensor>,
        swish: Option<Swish>,
    ) -> candle_core::Result<Option<Tensor>> {
        use crate::cuda::NormAct;
        let act = swish.map(|s| match s {
            Swish::Silu => NormAct::Silu,
            Swish::TimesSigmoid => NormAct::TimesSigmoid,
        });
        let (w, b) = (&self.weight, &self.bias);
        crate::cuda::group_norm(x, add, w, b, self.groups, self.eps, act)
    }

    #[cfg(not(feature = "cuda"))]
    fn fused_kernel(&self, _: &Tensor, _: Option<&Tensor>, _: Option<Swish>) -> candle_core::Result<Option<Tensor>> {
        Ok(None)
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_as(x, MemoryFormat::Contiguous)
    }
}

/// diffusers' `RMSNorm(dim, eps, elementwise_affine)` (`models/normalization.py`) over the last
/// dimension: `x · rsqrt(mean(x.float()², -1) + eps)`, then `· weight`. The mean square, `rsqrt`
/// and product are in at least f32 (f64 input stays f64, as in the exporters' float64 twins, or
/// takes the float32 mean square and `rsqrt` where the run keeps the published casts); a
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
        crate::validate::eps("RMSNorm", eps)?;
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
        // variance = x.to(float32).pow(2).mean(-1): float64 unless the run keeps that cast
        let x_var = crate::ops::published_float(&x)?;
        let variance = x_var.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        let rstd = (variance + self.eps)?.sqrt()?.recip()?.to_dtype(compute)?;
        let y = x.broadcast_mul(&rstd)?;
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
        .cast_to(x.dtype())?;
    x.broadcast_div(&norm)
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
        self.forward_as(f, zq, MemoryFormat::Contiguous)
    }

    /// [`Self::forward`] of an `f` PyTorch lays out as `format` (its GroupNorm's kernel).
    pub fn forward_as(&self, f: &Tensor, zq: &Tensor, format: MemoryFormat) -> candle_core::Result<Tensor> {
        let (_, _, h, w) = f.dims4()?;
        let zq = interpolate_nearest2d(zq, h, w)?;
        let norm_f = self.norm_layer.forward_as(f, format)?;
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

    /// A norm's eps that is not a finite number > 0 is a config error, whatever the route in.
    #[test]
    fn eps_must_be_finite_and_positive() {
        let dev = Device::Cpu;
        let ts = HashMap::from([
            ("n.weight".to_string(), Tensor::ones(64, DType::F32, &dev).unwrap()),
            ("n.bias".to_string(), Tensor::zeros(64, DType::F32, &dev).unwrap()),
        ]);
        let vb = VarBuilder::from_tensors(ts, DType::F32, &dev);
        for eps in [-1.0, 0.0, f64::NAN, f64::INFINITY] {
            let e = group_norm(vb.pp("n"), "test", 32, 64, eps).unwrap_err().to_string();
            assert!(e.contains("eps must be a finite number > 0"), "{e}");
            assert!(LayerNorm::load(vb.pp("n"), 64, eps, true).is_err(), "{eps}");
            assert!(LastDimRmsNorm::load(vb.pp("n"), 64, eps, true).is_err(), "{eps}");
        }
        assert!(group_norm(vb.pp("n"), "test", 32, 64, 1e-6).is_ok());
    }

    /// Off CUDA the pre-add form is the add (in the input's dtype) and then the norm and swish,
    /// and no block is told to move its add into the norm.
    #[test]
    fn pre_add_is_the_add_then_the_norm_off_cuda() {
        let dev = Device::Cpu;
        let ts = HashMap::from([
            ("n.weight".to_string(), Tensor::randn(1f32, 0.2, 64, &dev).unwrap()),
            ("n.bias".to_string(), Tensor::randn(0f32, 0.2, 64, &dev).unwrap()),
        ]);
        let vb = VarBuilder::from_tensors(ts, DType::F16, &dev);
        let norm = group_norm(vb.pp("n"), "test", 32, 64, 1e-6).unwrap();
        let x = Tensor::randn(0f32, 1., (2, 64, 5, 3), &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let add = Tensor::randn(0f32, 1., (2, 64), &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert!(!GroupNorm::fuses_pre_add(&x, &add));
        let act = |y: &Tensor| crate::layers::Activation::Swish.forward(y);
        let fused = norm.forward_swish_add(&x, &add, "norm2", Swish::Silu, act).unwrap();
        let sum = x.broadcast_add(&add.reshape((2, 64, 1, 1)).unwrap()).unwrap();
        let plain = norm.forward_swish(&sum, "norm2", Swish::Silu, act).unwrap();
        assert_eq!(crate::test_support::max_diff(&fused, &plain), 0.0);
        assert!(!crate::ops::native_half(&x));
    }
}

//! The spatio-temporal ResNet of Stable Video Diffusion, diffusers 0.42.1 (`models/resnet.py`):
//! [`AlphaBlender`], `TemporalResnetBlock` and [`SpatioTemporalResBlock`], the ResNet of
//! `UNetSpatioTemporalConditionModel` (`UNetMidBlockSpatioTemporal`) and of
//! `AutoencoderKLTemporalDecoder`'s decoder (`MidBlockTemporalDecoder`).
//!
//! ```text
//! SpatioTemporalResBlock.forward(h, temb, image_only_indicator):   F = image_only_indicator.shape[-1]
//!   h = spatial_res_block(h, temb)                                  # ResnetBlock2D on (B·F, C, H, W)
//!   mix = h.reshape(B, F, C, H, W).permute(0, 2, 1, 3, 4)           # (B, C, F, H, W)
//!   t = temporal_res_block(mix, temb.reshape(B, F, -1))             # Conv3d (3, 1, 1) ResNet over frames
//!   return time_mixer(mix, t, image_only_indicator).permute(0, 2, 1, 3, 4).reshape(B·F, C, H, W)
//! TemporalResnetBlock.forward(x, temb):  h = conv1(silu(norm1(x)))            # GroupNorm(32), Conv3d (3, 1, 1)
//!   h = h + time_emb_proj(silu(temb))[:, :, :, None, None].permute(0, 2, 1, 3, 4)
//!   return x + conv2(silu(norm2(h)))
//! AlphaBlender.forward(x_spatial, x_temporal, image_only_indicator):
//!   alpha = mix_factor ["fixed"] | sigmoid(mix_factor) ["learned"]
//!         | where(image_only_indicator.bool(), 1, sigmoid(mix_factor)) ["learned_with_images"], per (batch, frame)
//!   alpha = 1 - alpha if switch_spatial_to_temporal_mix;  return alpha·x_spatial + (1 − alpha)·x_temporal
//! ```
//!
//! In f16/bf16 every step rounds where PyTorch's CPU kernels round: the sigmoid in the
//! parameter's dtype, `1 − alpha`, each product and the sum.

use crate::cpu_kernels::{MemoryFormat, Swish};
use crate::diffusers::resnet::{ResnetBlock2D, ResnetBlock2DConfig};
use crate::diffusers::transformers::temporal::FrameConv;
use crate::layers::{group_norm, Activation, GroupNorm, Projection};
use crate::ops::upcast;
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;

/// `AlphaBlender(merge_strategy=...)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeStrategy {
    /// `alpha = mix_factor` (a buffer).
    Fixed,
    /// `alpha = sigmoid(mix_factor)`.
    Learned,
    /// `alpha = 1` for the frames `image_only_indicator` marks as images, else
    /// `sigmoid(mix_factor)`.
    LearnedWithImages,
}

/// `diffusers.models.resnet.AlphaBlender`: key `mix_factor` `(1,)`.
#[derive(Debug, Clone)]
pub struct AlphaBlender {
    mix_factor: Tensor,
    strategy: MergeStrategy,
    switch_spatial_to_temporal_mix: bool,
}

/// `f(x)` computed in at least f32 and rounded to `x`'s dtype once, as PyTorch's CPU
/// elementwise kernels do.
fn rounded(dtype: DType, f: impl FnOnce() -> candle_core::Result<Tensor>) -> candle_core::Result<Tensor> {
    f()?.to_dtype(dtype)
}

impl AlphaBlender {
    pub const BLOCK: &'static str = "diffusers.AlphaBlender";

    pub fn new(vb: VarBuilder, strategy: MergeStrategy, switch_spatial_to_temporal_mix: bool) -> Result<Self> {
        Ok(Self {
            mix_factor: vb.get(1, "mix_factor")?,
            strategy,
            switch_spatial_to_temporal_mix,
        })
    }

    /// `alpha` in the dtype of `like`, shaped to broadcast against it: `(1,)` for the fixed and
    /// learned strategies; per (batch, frame) `(B, 1, F, 1, 1)` for a rank-5 `like`, `(B·F, 1, 1)`
    /// for rank 3.
    fn alpha(&self, image_only_indicator: Option<&Tensor>, like: &Tensor) -> Result<Tensor> {
        let dtype = like.dtype();
        let param = self.mix_factor.dtype();
        let sigmoid = || rounded(param, || candle_nn::ops::sigmoid(&upcast(&self.mix_factor)?));
        let alpha = match self.strategy {
            MergeStrategy::Fixed => self.mix_factor.to_dtype(dtype)?,
            MergeStrategy::Learned => sigmoid()?.to_dtype(dtype)?,
            MergeStrategy::LearnedWithImages => {
                let ioi = image_only_indicator.ok_or_else(|| {
                    Error::input(
                        Self::BLOCK,
                        "image_only_indicator",
                        "required by merge_strategy \"learned_with_images\"",
                    )
                })?;
                let (b, f) = ioi.dims2()?;
                // torch.where(bool, torch.ones(1, 1) (float32), sigmoid(mix_factor)): the result in
                // the promotion of float32 and the parameter's dtype (float32 in a half run,
                // float64 in a float64 one)
                let promoted = if param == DType::F64 { DType::F64 } else { DType::F32 };
                let images = ioi.to_dtype(DType::F32)?.ne(0f64)?;
                let sig = sigmoid()?.to_dtype(promoted)?.broadcast_as((b, f))?;
                let ones = Tensor::ones((b, f), promoted, ioi.device())?;
                let alpha = images.where_cond(&ones, &sig)?.to_dtype(dtype)?;
                match like.rank() {
                    5 => alpha.reshape((b, 1, f, 1, 1))?,
                    3 => alpha.reshape((b * f, 1, 1))?,
                    r => {
                        return Err(Error::input(
                            Self::BLOCK,
                            "x_spatial",
                            format!("expected rank 3 or 5, found rank {r}"),
                        ))
                    }
                }
            }
        };
        let alpha = alpha.to_device(like.device())?;
        if self.switch_spatial_to_temporal_mix {
            Ok(rounded(dtype, || upcast(&alpha)?.affine(-1.0, 1.0))?)
        } else {
            Ok(alpha)
        }
    }

    /// `forward(x_spatial, x_temporal, image_only_indicator=None)`: `alpha·x_spatial + (1 −
    /// alpha)·x_temporal`, each product and the sum rounded to the input dtype.
    pub fn forward(
        &self,
        x_spatial: &Tensor,
        x_temporal: &Tensor,
        image_only_indicator: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x_spatial", x_spatial, &[])?;
        crate::validate::input(Self::BLOCK, "x_temporal", x_temporal, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "image_only_indicator", image_only_indicator)?;
        let dtype = x_spatial.dtype();
        let alpha = self.alpha(image_only_indicator, x_spatial)?;
        let rest = rounded(dtype, || upcast(&alpha)?.affine(-1.0, 1.0))?;
        let a = rounded(dtype, || upcast(&alpha)?.broadcast_mul(&upcast(x_spatial)?))?;
        let b = rounded(dtype, || upcast(&rest)?.broadcast_mul(&upcast(x_temporal)?))?;
        Ok(rounded(dtype, || upcast(&a)? + upcast(&b)?)?)
    }
}

/// `diffusers.models.resnet.TemporalResnetBlock(in_channels, out_channels, temb_channels, eps)`
/// with `in_channels == out_channels` (the only form `SpatioTemporalResBlock` builds): keys
/// `norm1`, `conv1`, `time_emb_proj`, `norm2`, `conv2`.
#[derive(Debug, Clone)]
struct TemporalResnetBlock {
    norm1: GroupNorm,
    conv1: FrameConv,
    time_emb_proj: Option<Projection>,
    norm2: GroupNorm,
    conv2: FrameConv,
}

impl TemporalResnetBlock {
    const BLOCK: &'static str = "diffusers.TemporalResnetBlock";

    fn new(vb: VarBuilder, channels: usize, temb_channels: Option<usize>, eps: f64) -> Result<Self> {
        let block = Self::BLOCK;
        let time_emb_proj = temb_channels
            .map(|t| Projection::load(vb.pp("time_emb_proj"), block, t, channels, true))
            .transpose()?;
        Ok(Self {
            norm1: group_norm(vb.pp("norm1"), block, 32, channels, eps)?,
            conv1: FrameConv::load(vb.pp("conv1"), channels, channels)?,
            time_emb_proj,
            norm2: group_norm(vb.pp("norm2"), block, 32, channels, eps)?,
            conv2: FrameConv::load(vb.pp("conv2"), channels, channels)?,
        })
    }

    /// `x` `(B, C, F, H, W)` laid out in PyTorch as `format` (its `norm1`'s kernel; `conv1`'s
    /// output is contiguous again), `temb` `(B, F, temb_channels)`.
    fn forward(&self, x: &Tensor, temb: Option<&Tensor>, format: MemoryFormat) -> Result<Tensor> {
        let silu = |y: &Tensor| Activation::Swish.forward(y);
        let h = self.norm1.forward_swish_as(x, format, "norm1", Swish::Silu, silu)?;
        let mut h = self.conv1.forward(&h)?;
        trace::record("conv1", &h);
        if let (Some(proj), Some(temb)) = (&self.time_emb_proj, temb) {
            let t = proj.forward_tokens(&silu(temb)?)?;
            trace::record("temb", &t);
            let (b, f, c) = t.dims3()?;
            let t = t.permute((0, 2, 1))?.reshape((b, c, f, 1, 1))?;
            h = h.broadcast_add(&t)?;
        }
        let h = self.norm2.forward_swish(&h, "norm2", Swish::Silu, silu)?;
        let h = self.conv2.forward(&h)?;
        trace::record("conv2", &h);
        let out = crate::ops::add(x, &h)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// How a `SpatioTemporalResBlock` is built: `SpatioTemporalResBlock(in_channels, out_channels,
/// temb_channels, eps, temporal_eps, merge_factor, merge_strategy,
/// switch_spatial_to_temporal_mix)` (`merge_factor` is only `mix_factor`'s initial value: the
/// weights carry it).
#[derive(Debug, Clone)]
pub struct SpatioTemporalResBlockSpec {
    pub in_channels: usize,
    pub out_channels: usize,
    pub temb_channels: Option<usize>,
    pub eps: f64,
    pub temporal_eps: f64,
    pub merge_strategy: MergeStrategy,
    pub switch_spatial_to_temporal_mix: bool,
}

/// `diffusers.models.resnet.SpatioTemporalResBlock`: keys `spatial_res_block` (a
/// `ResnetBlock2D` with 32 groups), `temporal_res_block`, `time_mixer.mix_factor`.
#[derive(Debug, Clone)]
pub struct SpatioTemporalResBlock {
    spatial_res_block: ResnetBlock2D,
    temporal_res_block: TemporalResnetBlock,
    time_mixer: AlphaBlender,
}

/// `num_frames = image_only_indicator.shape[-1]`, checked against the batch of `hidden_states`
/// `(B·F, ...)`: `(B, F)`.
pub(crate) fn frames_of(
    block: &'static str,
    image_only_indicator: &Tensor,
    batch_frames: usize,
) -> Result<(usize, usize)> {
    let dims = image_only_indicator.dims();
    match dims {
        [b, f] if *f > 0 && b * f == batch_frames => Ok((*b, *f)),
        _ => Err(Error::input(
            block,
            "image_only_indicator",
            format!(
                "expected (batch, num_frames) with batch·num_frames = the hidden_states batch {batch_frames}, found {dims:?}"
            ),
        )),
    }
}

impl SpatioTemporalResBlock {
    pub const BLOCK: &'static str = "diffusers.SpatioTemporalResBlock";

    pub fn new(vb: VarBuilder, spec: &SpatioTemporalResBlockSpec) -> Result<Self> {
        let (c_in, c) = (spec.in_channels, spec.out_channels);
        // ResnetBlock2D(in_channels, out_channels, temb_channels, eps), the rest at its defaults.
        let spatial = ResnetBlock2DConfig {
            out_channels: Some(c),
            temb_channels: spec.temb_channels,
            eps: spec.eps,
            ..ResnetBlock2DConfig::new(c_in)
        };
        Ok(Self {
            spatial_res_block: ResnetBlock2D::new(vb.pp("spatial_res_block"), &spatial)?,
            temporal_res_block: TemporalResnetBlock::new(
                vb.pp("temporal_res_block"),
                c,
                spec.temb_channels,
                spec.temporal_eps,
            )?,
            time_mixer: AlphaBlender::new(
                vb.pp("time_mixer"),
                spec.merge_strategy,
                spec.switch_spatial_to_temporal_mix,
            )?,
        })
    }

    /// `forward(hidden_states, temb=None, image_only_indicator)`: `hidden_states` `(B·F, C, H, W)`,
    /// `temb` `(B·F, temb_channels)`, `image_only_indicator` `(B, F)` (its last dim is the frame
    /// count, as in diffusers).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        image_only_indicator: &Tensor,
    ) -> Result<Tensor> {
        self.forward_as(hidden_states, temb, image_only_indicator, MemoryFormat::Contiguous)
    }

    /// [`Self::forward`] of an input PyTorch lays out as `format`: the spatial resnet's norms
    /// take that layout's kernel, and a channels_last input with 2 or more frames reaches
    /// `temporal_res_block.norm1` as `channels_last_3d` (the frames permuted out of the batch of
    /// an NHWC tensor), its channels_last kernel; with one frame that view's strides are not
    /// taken for channels_last_3d, and PyTorch copies it contiguous.
    pub fn forward_as(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        image_only_indicator: &Tensor,
        format: MemoryFormat,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::input(Self::BLOCK, "image_only_indicator", image_only_indicator, &[])?;
        let block = Self::BLOCK;
        let h = trace::scope("spatial_res_block", || {
            self.spatial_res_block.forward_as(hidden_states, temb, format)
        })?;
        let (bf, c, hh, ww) = h.dims4()?;
        let (b, f) = frames_of(block, image_only_indicator, bf)?;
        let mix = h.reshape((b, f, c, hh, ww))?.permute((0, 2, 1, 3, 4))?.contiguous()?;
        let temb = temb.map(|t| t.reshape((b, f, ()))).transpose()?;
        let temporal = match format {
            MemoryFormat::ChannelsLast if f >= 2 => MemoryFormat::ChannelsLast,
            _ => MemoryFormat::Contiguous,
        };
        let t = trace::scope("temporal_res_block", || {
            self.temporal_res_block.forward(&mix, temb.as_ref(), temporal)
        })?;
        let out = trace::scope("time_mixer", || -> Result<Tensor> {
            let out = self.time_mixer.forward(&mix, &t, Some(image_only_indicator))?;
            trace::record("output", &out);
            Ok(out)
        })?;
        let out = out.permute((0, 2, 1, 3, 4))?.reshape((bf, c, hh, ww))?;
        trace::record("output", &out);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::max_diff;
    use candle_core::Device;
    use std::collections::HashMap;

    fn blender(m: f32, strategy: MergeStrategy, switch: bool) -> AlphaBlender {
        let t = HashMap::from([("mix_factor".to_string(), Tensor::new(&[m], &Device::Cpu).unwrap())]);
        AlphaBlender::new(VarBuilder::from_tensors(t, DType::F32, &Device::Cpu), strategy, switch).unwrap()
    }

    /// `alpha·x_spatial + (1 − alpha)·x_temporal` for each merge strategy; with
    /// `learned_with_images` a frame marked as an image takes the spatial path exactly.
    #[test]
    fn svd_alpha_blender_strategies() {
        let dev = Device::Cpu;
        let (m, sig) = (0.7f32, 1.0 / (1.0 + (-0.7f32).exp()));
        let xs = Tensor::randn(0f32, 1., (1, 4, 2, 3, 2), &dev).unwrap();
        let xt = Tensor::randn(0f32, 1., (1, 4, 2, 3, 2), &dev).unwrap();
        let mix = |a: f32| ((&xs * a as f64).unwrap() + (&xt * (1.0 - a) as f64).unwrap()).unwrap();
        let ioi = Tensor::new(&[[0f32, 1.]], &dev).unwrap();
        let y = blender(m, MergeStrategy::LearnedWithImages, false)
            .forward(&xs, &xt, Some(&ioi))
            .unwrap();
        let frame = |t: &Tensor, f: usize| t.narrow(2, f, 1).unwrap();
        assert_eq!(max_diff(&frame(&y, 1), &frame(&xs, 1)), 0.0);
        assert!(max_diff(&frame(&y, 0), &frame(&mix(sig), 0)) < 1e-6);
        let y = blender(m, MergeStrategy::Learned, true)
            .forward(&xs, &xt, None)
            .unwrap();
        assert!(max_diff(&y, &mix(1.0 - sig)) < 1e-6);
        let y = blender(m, MergeStrategy::Fixed, false).forward(&xs, &xt, None).unwrap();
        assert!(max_diff(&y, &mix(m)) < 1e-6);
        let e = blender(m, MergeStrategy::LearnedWithImages, false)
            .forward(&xs, &xt, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("image_only_indicator"), "{e}");
    }
}

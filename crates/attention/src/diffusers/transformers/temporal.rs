//! The temporal layers of diffusers' video U-Nets (`UNet3DConditionModel`, `I2VGenXLUNet`),
//! diffusers 0.42.1:
//!
//! * [`TemporalConvLayer`] (`models/resnet.py`): four `GroupNorm → SiLU → (Dropout) → Conv3d`
//!   stacks with `(3, 1, 1)` kernels (a convolution over the frame axis only) and the identity
//!   added back. The last conv is zero-initialised by its constructor (the layer starts as the
//!   identity); trained checkpoints carry real weights.
//! * [`TransformerTemporalModel`] (`models/transformers/transformer_temporal.py`): GroupNorm over
//!   `(B, C, F, H, W)`, `proj_in` Linear, `BasicTransformerBlock`s over the frames of each pixel
//!   (`(B·H·W, F, C)` tokens), `proj_out` Linear, the residual.
//!
//! Both take `hidden_states` `(B·F, C, H, W)` with the frames of a video consecutive in the batch
//! (`num_frames` = F), as the video U-Nets pass them.
//!
//! ```text
//! TemporalConvLayer.forward(h, num_frames): h = h[None].reshape(-1, F, C, H, W).permute(0, 2, 1, 3, 4)
//!   identity = h; h = conv4(conv3(conv2(conv1(h))))   convN = (GroupNorm(groups, C, eps=1e-5), SiLU, [Dropout], Conv3d)
//!   return (identity + h).permute(0, 2, 1, 3, 4).reshape(B·F, C, H, W)
//! TransformerTemporalModel.forward(h, encoder_hidden_states=None, num_frames):
//!   x = norm(h.reshape(B, F, C, H, W).permute(0, 2, 1, 3, 4)).permute(0, 3, 4, 2, 1).reshape(B·H·W, F, C)
//!   x = proj_out(blocks(proj_in(x), encoder_hidden_states)).reshape(B, H, W, F, C).permute(0, 3, 4, 1, 2)
//!   return x.reshape(B·F, C, H, W) + h
//! ```

use crate::config::defaults;
use crate::cpu_kernels::Swish;
use crate::diffusers::feed_forward::ActivationFn;
use crate::diffusers::transformers::transformer::{BasicTransformerBlockConfig, TransformerBlock};
use crate::layers::{cuda_conv_layer, group_norm, Activation, Copies, GroupNorm, Projection};
use crate::ops::upcast;
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `hidden_states` `(B·F, C, H, W)` split into `(B, F)`: an error where `num_frames` is zero or
/// does not divide the batch (PyTorch's reshape fails there too).
pub(crate) fn split_frames(
    block: &'static str,
    x: &Tensor,
    channels: usize,
    num_frames: usize,
) -> Result<(usize, usize, usize, usize)> {
    let dims = x.dims();
    if dims.len() != 4 || dims[1] != channels {
        return Err(Error::input(
            block,
            "hidden_states",
            format!("expected (batch·num_frames, {channels}, H, W), found {dims:?}"),
        ));
    }
    if num_frames == 0 || !dims[0].is_multiple_of(num_frames) {
        return Err(Error::input(
            block,
            "num_frames",
            format!(
                "num_frames {num_frames} does not divide the hidden_states batch {} (the video U-Nets pass \
                 (batch·num_frames, C, H, W), the frames of a video consecutive)",
                dims[0]
            ),
        ));
    }
    Ok((dims[0] / num_frames, dims[2], dims[3], dims[0]))
}

/// `nn.Conv3d(in, out, (3, 1, 1), padding=(1, 0, 0))`: a convolution over the frame axis,
/// computed as a `(3, 1)` Conv2d on `(B, C, F, H·W)` with the frames zero-padded; f16/bf16 in
/// f32 and rounded once. On CUDA the layers' convolution (`crate::layers::cuda_conv_layer`: in
/// the input's dtype with the CUDA layers on, the bias added after, as PyTorch's cuDNN path).
#[derive(Debug, Clone)]
pub(crate) struct FrameConv {
    /// `(out, in, 3, 1)`.
    weight: Tensor,
    bias: Tensor,
    /// Weight and bias in the input's dtype where they were loaded in another (CUDA only).
    copies: Copies,
}

impl FrameConv {
    pub(crate) fn load(vb: VarBuilder, in_dim: usize, out_dim: usize) -> Result<Self> {
        let weight = vb.get((out_dim, in_dim, 3, 1, 1), "weight")?;
        Ok(Self {
            weight: weight.reshape((out_dim, in_dim, 3, 1))?,
            bias: vb.get(out_dim, "bias")?,
            copies: Copies::default(),
        })
    }

    /// `x` `(B, C, F, H, W)` → `(B, out, F, H, W)`.
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input("diffusers.TemporalConvLayer", "x", x, &[])?;
        let (b, c, f, h, w) = x.dims5()?;
        if x.device().is_cuda() {
            let x4 = x.reshape((b, c, f, h * w))?;
            let weight = || Ok(self.weight.clone());
            if let Some(y) = cuda_conv_layer(&x4, weight, Some(&self.bias), [1, 0], &self.copies)? {
                return y.reshape((b, y.dim(1)?, f, h, w));
            }
        }
        let x32 = upcast(x)?.reshape((b, c, f, h * w))?.pad_with_zeros(2, 1, 1)?;
        let weight = self.weight.to_dtype(x32.dtype())?;
        let y = x32.conv2d(&weight, 0, 1, 1, 1)?;
        let bias = self.bias.to_dtype(x32.dtype())?.reshape((1, (), 1, 1))?;
        let y = y.broadcast_add(&bias)?;
        y.reshape((b, y.dim(1)?, f, h, w))?.to_dtype(x.dtype())
    }
}

/// Keyword arguments of `TemporalConvLayer(in_dim, out_dim=None, dropout=0.0, norm_num_groups=32)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TemporalConvLayerConfig {
    pub in_dim: usize,
    /// `None`: `in_dim`. diffusers' `conv3`/`conv4` norms are `GroupNorm(out_dim)` on `in_dim`
    /// channels, so only `out_dim == in_dim` runs.
    #[serde(default)]
    pub out_dim: Option<usize>,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "defaults::usize::<32>")]
    pub norm_num_groups: usize,
}

/// `diffusers.models.resnet.TemporalConvLayer`. Keys `conv1.0` (GroupNorm), `conv1.2` (Conv3d),
/// `conv{2,3,4}.0` (GroupNorm), `conv{2,3,4}.3` (Conv3d; index 2 is the Dropout).
#[derive(Debug, Clone)]
pub struct TemporalConvLayer {
    stacks: Vec<(GroupNorm, FrameConv)>,
    channels: usize,
}

impl TemporalConvLayer {
    pub const BLOCK: &'static str = "diffusers.TemporalConvLayer";

    pub fn new(vb: VarBuilder, cfg: &TemporalConvLayerConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c, out) = (cfg.in_dim, cfg.out_dim.unwrap_or(cfg.in_dim));
        if out != c {
            return Err(Error::unsupported(
                block,
                format!(
                    "out_dim {out} != in_dim {c}: diffusers' conv3 / conv4 norm GroupNorm(out_dim) runs on in_dim \
                     channels, which PyTorch refuses"
                ),
            ));
        }
        let stacks = (1..=4)
            .map(|i| {
                let vb = vb.pp(format!("conv{i}"));
                let conv_index = if i == 1 { 2 } else { 3 };
                Ok((
                    group_norm(vb.pp(0), block, cfg.norm_num_groups, c, 1e-5)?,
                    FrameConv::load(vb.pp(conv_index), c, c)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { stacks, channels: c })
    }

    /// `forward(hidden_states, num_frames=1)` on `(B·F, C, H, W)`. Stages `norm1`..`norm4` and
    /// `conv1`..`conv4` are `(B, C, F, H, W)`, as PyTorch holds them.
    pub fn forward(&self, hidden_states: &Tensor, num_frames: usize) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        let (b, h, w, bf) = split_frames(Self::BLOCK, hidden_states, self.channels, num_frames)?;
        let c = self.channels;
        let identity = hidden_states
            .reshape((b, num_frames, c, h, w))?
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?;
        let mut x = identity.clone();
        for (i, (norm, conv)) in self.stacks.iter().enumerate() {
            let act = norm.forward_swish(&x, &format!("norm{}", i + 1), Swish::Silu, |y| {
                Activation::Swish.forward(y)
            })?;
            x = conv.forward(&act)?;
            trace::record(&format!("conv{}", i + 1), &x);
        }
        let out = crate::ops::add(&identity, &x)?
            .permute((0, 2, 1, 3, 4))?
            .reshape((bf, c, h, w))?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// Keyword arguments of `TransformerTemporalModel(num_attention_heads=16, attention_head_dim=88,
/// in_channels=None, out_channels=None, num_layers=1, dropout=0.0, norm_num_groups=32,
/// cross_attention_dim=None, attention_bias=False, sample_size=None, activation_fn="geglu",
/// norm_elementwise_affine=True, double_self_attention=True, positional_embeddings=None,
/// num_positional_embeddings=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerTemporalModelConfig {
    #[serde(default = "defaults::usize::<16>")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::usize::<88>")]
    pub attention_head_dim: usize,
    /// Required in practice (diffusers builds `GroupNorm(num_channels=in_channels)`).
    #[serde(default)]
    pub in_channels: Option<usize>,
    /// Stored by diffusers but not used: `proj_out` maps back to `in_channels`.
    #[serde(default)]
    pub out_channels: Option<usize>,
    #[serde(default = "defaults::usize::<1>")]
    pub num_layers: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "defaults::usize::<32>")]
    pub norm_num_groups: usize,
    #[serde(default)]
    pub cross_attention_dim: Option<usize>,
    #[serde(default)]
    pub attention_bias: bool,
    /// Not used.
    #[serde(default)]
    pub sample_size: Option<usize>,
    #[serde(default)]
    pub activation_fn: ActivationFn,
    #[serde(default = "defaults::yes")]
    pub norm_elementwise_affine: bool,
    #[serde(default = "defaults::yes")]
    pub double_self_attention: bool,
    #[serde(default)]
    pub positional_embeddings: Option<String>,
    #[serde(default)]
    pub num_positional_embeddings: Option<usize>,
}

impl Default for TransformerTemporalModelConfig {
    /// `TransformerTemporalModel()`: every argument at its diffusers default (16 heads of 88, one
    /// layer, 32 groups, `geglu`, `double_self_attention`); set `in_channels`.
    fn default() -> Self {
        Self {
            num_attention_heads: defaults::usize::<16>(),
            attention_head_dim: defaults::usize::<88>(),
            in_channels: None,
            out_channels: None,
            num_layers: defaults::usize::<1>(),
            dropout: 0.0,
            norm_num_groups: defaults::usize::<32>(),
            cross_attention_dim: None,
            attention_bias: false,
            sample_size: None,
            activation_fn: ActivationFn::default(),
            norm_elementwise_affine: defaults::yes(),
            double_self_attention: defaults::yes(),
            positional_embeddings: None,
            num_positional_embeddings: None,
        }
    }
}

/// `diffusers.models.transformers.transformer_temporal.TransformerTemporalModel`. Keys `norm`
/// (GroupNorm, eps 1e-6), `proj_in`, `transformer_blocks.<i>` (`BasicTransformerBlock`s of width
/// `num_attention_heads · attention_head_dim`), `proj_out`.
#[derive(Debug, Clone)]
pub struct TransformerTemporalModel {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<TransformerBlock>,
    proj_out: Projection,
    channels: usize,
}

impl TransformerTemporalModel {
    pub const BLOCK: &'static str = "diffusers.TransformerTemporalModel";

    pub fn new(vb: VarBuilder, cfg: &TransformerTemporalModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg
            .in_channels
            .ok_or_else(|| Error::config(block, "in_channels is required (GroupNorm(num_channels=in_channels))"))?;
        let inner = cfg.num_attention_heads * cfg.attention_head_dim;
        // BasicTransformerBlock(inner_dim, num_attention_heads, attention_head_dim, dropout,
        //   cross_attention_dim, activation_fn, attention_bias, double_self_attention,
        //   norm_elementwise_affine, positional_embeddings, num_positional_embeddings)
        let block_cfg = BasicTransformerBlockConfig {
            dropout: cfg.dropout,
            cross_attention_dim: cfg.cross_attention_dim,
            activation_fn: cfg.activation_fn,
            attention_bias: cfg.attention_bias,
            double_self_attention: cfg.double_self_attention,
            norm_elementwise_affine: cfg.norm_elementwise_affine,
            positional_embeddings: cfg.positional_embeddings.clone(),
            num_positional_embeddings: cfg.num_positional_embeddings,
            ..BasicTransformerBlockConfig::new(inner, cfg.num_attention_heads, cfg.attention_head_dim)
        };
        let spec = block_cfg.spec(block)?;
        let blocks = (0..cfg.num_layers)
            .map(|i| TransformerBlock::load(vb.pp("transformer_blocks").pp(i), block, &spec))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            norm: group_norm(vb.pp("norm"), block, cfg.norm_num_groups, c, 1e-6)?,
            proj_in: Projection::load(vb.pp("proj_in"), block, c, inner, true)?,
            blocks,
            proj_out: Projection::load(vb.pp("proj_out"), block, inner, c, true)?,
            channels: c,
        })
    }

    /// `forward(hidden_states, encoder_hidden_states=None, num_frames=1)` on `(B·F, C, H, W)`.
    /// Stage `norm` is `(B, C, F, H, W)`; `proj_in`, the blocks and `proj_out` are
    /// `(B·H·W, F, inner)` tokens.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        num_frames: usize,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        let (b, h, w, bf) = split_frames(Self::BLOCK, hidden_states, self.channels, num_frames)?;
        let (c, f) = (self.channels, num_frames);
        let video = hidden_states.reshape((b, f, c, h, w))?.permute((0, 2, 1, 3, 4))?;
        let normed = self.norm.forward(&video)?;
        trace::record("norm", &normed);
        let tokens = normed.permute((0, 3, 4, 2, 1))?.reshape((b * h * w, f, c))?;
        // PyTorch's reshape is a copy (contiguous: one rounding in F.linear) unless the batch is
        // 1, where it is a strided view (product and bias rounded apart in f16/bf16).
        let mut x = if b == 1 && c > 1 && f * h * w > 1 {
            self.proj_in.forward_tokens_strided(&tokens)?
        } else {
            self.proj_in.forward_tokens(&tokens)?
        };
        trace::record("proj_in", &x);
        for (i, block) in self.blocks.iter().enumerate() {
            x = trace::scope_at("transformer_blocks", i, || {
                block.forward(&x, encoder_hidden_states, None, None)
            })?;
        }
        let x = self.proj_out.forward_tokens(&x)?;
        trace::record("proj_out", &x);
        let x = x
            .reshape((b, h, w, f, c))?
            .permute((0, 3, 4, 1, 2))?
            .reshape((bf, c, h, w))?;
        let out = crate::ops::add(&x, hidden_states)?;
        trace::record("output", &out);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use std::collections::HashMap;

    /// diffusers' constructor zeroes conv4: the layer is then the identity, at any num_frames
    /// that divides the batch; one that does not is an error naming `num_frames`.
    #[test]
    fn zero_last_conv_is_the_identity_and_num_frames_must_divide_the_batch() {
        let dev = Device::Cpu;
        let (c, groups) = (8, 2);
        let mut t = HashMap::new();
        for i in 1..=4 {
            let conv = if i == 1 { 2 } else { 3 };
            t.insert(format!("conv{i}.0.weight"), Tensor::ones(c, DType::F32, &dev).unwrap());
            t.insert(format!("conv{i}.0.bias"), Tensor::zeros(c, DType::F32, &dev).unwrap());
            let w = if i == 4 {
                Tensor::zeros((c, c, 3, 1, 1), DType::F32, &dev).unwrap()
            } else {
                Tensor::randn(0f32, 0.3, (c, c, 3, 1, 1), &dev).unwrap()
            };
            t.insert(format!("conv{i}.{conv}.weight"), w);
            t.insert(
                format!("conv{i}.{conv}.bias"),
                Tensor::zeros(c, DType::F32, &dev).unwrap(),
            );
        }
        let vb = VarBuilder::from_tensors(t, DType::F32, &dev);
        let cfg = TemporalConvLayerConfig {
            in_dim: c,
            out_dim: None,
            dropout: 0.1,
            norm_num_groups: groups,
        };
        let layer = TemporalConvLayer::new(vb, &cfg).unwrap();
        let x = Tensor::randn(0f32, 1.0, (6, c, 3, 2), &dev).unwrap();
        for frames in [1, 2, 3, 6] {
            let y = layer.forward(&x, frames).unwrap();
            let d = (y - &x)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(d, 0.0, "num_frames {frames}");
        }
        for frames in [0, 4] {
            let e = layer.forward(&x, frames).unwrap_err().to_string();
            assert!(e.contains("num_frames"), "{e}");
        }
    }
}

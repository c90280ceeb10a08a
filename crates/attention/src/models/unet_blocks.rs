//! The down and up blocks of diffusers 0.42.1 `UNet2DConditionModel` and `UNet2DModel`
//! (`models/unets/unet_2d_blocks.py`), and their resamplers (`models/downsampling.py`
//! `Downsample2D`, `models/upsampling.py` `Upsample2D`):
//!
//! ```text
//! CrossAttnDownBlock2D / AttnDownBlock2D / DownBlock2D (no attentions):
//!   for i: h = resnets[i](h, temb); h = attentions[i](h[, context]); states += (h,)
//!   if downsamplers: h = downsamplers[0].conv(h)      # 3x3, stride 2, padding=downsample_padding
//!                    states += (h,)
//! CrossAttnUpBlock2D / AttnUpBlock2D / UpBlock2D (no attentions):
//!   for i: h = cat([h, res.pop()], dim=1); h = resnets[i](h, temb); h = attentions[i](h[, context])
//!   if upsamplers: h = upsamplers[0].conv(interpolate(h, scale_factor=2 or size, "nearest"))
//! ```
//!
//! The cross-attention blocks' attentions are `Transformer2DModel`s; `AttnDownBlock2D` /
//! `AttnUpBlock2D` (`UNet2DModel`'s) have an `Attention` over the image after each resnet (group
//! norm, residual, `upcast_softmax`, the deprecated attention block's weights).
//!
//! Each layer runs in the trace scope of its PyTorch module path (`resnets.0`, `attentions.1`,
//! `downsamplers.0`), recording its output there, so a module-path bundle's stages line up.

use super::unet_2d_condition_config::BlockArgs;
use crate::diffusers::model_config::{mid_blocks, ModelClass};
use crate::diffusers::resnet::{ResnetBlock2D, ResnetBlock2DConfig};
use crate::diffusers::transformers::transformer::{Transformer2DModel, Transformer2DModelConfig};
use crate::diffusers::unets::mid_block::LayersPerBlock;
use crate::diffusers::{Attention, AttentionConfig};
use crate::layers::{interpolate_nearest2d, Conv2d};
use crate::ops::upcast;
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::{Module, VarBuilder};

/// What every layer of a block gets: the time embedding, and for cross-attention the context.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub temb: &'a Tensor,
    pub encoder_hidden_states: Option<&'a Tensor>,
    pub attention_mask: Option<&'a Tensor>,
    pub encoder_attention_mask: Option<&'a Tensor>,
}

/// What a block is built with (the model's shared kwargs).
#[derive(Debug, Clone)]
pub struct BlockKwargs {
    /// The resnets' config, `in_channels` / `out_channels` set per resnet.
    pub resnet: ResnetBlock2DConfig,
    /// The transformers' shared kwargs (heads, widths and depth set per block).
    pub transformer: Transformer2DModelConfig,
    /// `downsample_padding`.
    pub downsample_padding: usize,
}

/// `Downsample2D(channels, use_conv=True, padding=p, name="op")`: `conv` (3×3, stride 2); with
/// `padding=0`, the input padded by one on the right and bottom first (the VAE's).
#[derive(Debug, Clone)]
pub struct Downsample2D {
    weight: Tensor,
    bias: Tensor,
    padding: usize,
}

impl Downsample2D {
    pub fn new(vb: VarBuilder, channels: usize, out_channels: usize, padding: usize) -> Result<Self> {
        Self::at(vb.pp("conv"), channels, out_channels, padding)
    }

    /// The strided convolution with its weights at `vb` itself (`ControlNetConditioningEmbedding`'s
    /// `blocks.1`, a bare `nn.Conv2d(..., stride=2)`).
    pub fn at(vb: VarBuilder, channels: usize, out_channels: usize, padding: usize) -> Result<Self> {
        Ok(Self {
            weight: vb.get((out_channels, channels, 3, 3), "weight")?,
            bias: vb.get(out_channels, "bias")?,
            padding,
        })
    }

    /// The height (or width) out of a `Downsample2D` with `padding` for `size` in (a 3 × 3 conv
    /// of stride 2, after a (0, 1) pad when `padding` is 0); `None` when `size` is too small for
    /// the kernel (PyTorch raises).
    pub fn output_size(size: usize, padding: usize) -> Option<usize> {
        let padded = size + 2 * padding + usize::from(padding == 0);
        padded.checked_sub(3).map(|n| n / 2 + 1)
    }

    /// The smallest height (or width) that goes through `n` downsamplers with `padding`: with a
    /// padding, any (a size of 1 stays 1); without, each halves it and needs 2, so 2^n.
    pub fn min_input(n: usize, padding: usize) -> usize {
        match padding {
            0 => u32::try_from(n)
                .ok()
                .and_then(|n| 1usize.checked_shl(n))
                .unwrap_or(usize::MAX),
            _ => 1,
        }
    }

    /// The strided convolution in at least f32 and rounded once, as PyTorch's CPU convolution.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        if Self::output_size(h, self.padding).is_none() || Self::output_size(w, self.padding).is_none() {
            let need = Self::min_input(1, self.padding);
            return Err(Error::input(
                "diffusers.Downsample2D",
                "hidden_states",
                format!(
                    "a 3 × 3 convolution of stride 2 (padding {}) needs H and W ≥ {need}, found {:?}",
                    self.padding,
                    x.dims()
                ),
            ));
        }
        let mut h = upcast(x)?;
        if self.padding == 0 {
            h = h.pad_with_zeros(2, 0, 1)?.pad_with_zeros(3, 0, 1)?;
        }
        let cfg = candle_nn::Conv2dConfig {
            padding: self.padding,
            stride: 2,
            ..Default::default()
        };
        let conv = candle_nn::Conv2d::new(upcast(&self.weight)?, Some(upcast(&self.bias)?), cfg);
        Ok(conv.forward(&h)?.to_dtype(x.dtype())?)
    }
}

/// `Upsample2D(channels, use_conv=True)`: nearest ×2 (or to `output_size`), then `conv` (3×3).
#[derive(Debug, Clone)]
pub struct Upsample2D {
    conv: Conv2d,
}

impl Upsample2D {
    pub fn new(vb: VarBuilder, channels: usize, out_channels: usize) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::load(vb.pp("conv"), channels, out_channels, 3, true)?,
        })
    }

    /// `conv(interpolate(x, scale_factor=2.0 or size=output_size, mode="nearest"))`.
    pub fn forward(&self, x: &Tensor, output_size: Option<(usize, usize)>) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let (oh, ow) = output_size.unwrap_or((2 * h, 2 * w));
        let up = interpolate_nearest2d(x, oh, ow)?;
        Ok(self.conv.forward_traced(&up, "conv", Default::default())?)
    }
}

/// The depth of layer `i`'s transformer from the block's `transformer_layers_per_block` (one
/// count, or one per layer: a list shorter than `layers` is an error).
fn depth(block: &'static str, t: &LayersPerBlock, layers: usize, i: usize) -> Result<usize> {
    match t {
        LayersPerBlock::One(n) => Ok(*n),
        LayersPerBlock::PerLayer(list) if list.len() >= layers => Ok(list[i]),
        LayersPerBlock::PerLayer(list) => Err(Error::config(
            block,
            format!(
                "transformer_layers_per_block lists {} depths for {layers} layers",
                list.len()
            ),
        )),
    }
}

/// The `Transformer2DModel(heads, out // heads, in_channels=out, num_layers=depth, ...)` of a
/// cross-attention block.
fn transformer_config(
    block: &'static str,
    kw: &BlockKwargs,
    args: &BlockArgs,
    channels: usize,
    depth: usize,
) -> Result<Transformer2DModelConfig> {
    let head_dim = crate::config::check_divides(block, channels, args.heads)?;
    Ok(Transformer2DModelConfig {
        num_attention_heads: args.heads,
        attention_head_dim: head_dim,
        in_channels: Some(channels),
        num_layers: depth,
        cross_attention_dim: Some(args.cross_attention_dim),
        only_cross_attention: args.only_cross_attention,
        ..kw.transformer.clone()
    })
}

fn resnet(kw: &BlockKwargs, in_channels: usize, out_channels: usize) -> ResnetBlock2DConfig {
    ResnetBlock2DConfig {
        in_channels,
        out_channels: Some(out_channels),
        ..kw.resnet.clone()
    }
}

/// Run the layer `name.i` in its trace scope and record its output under its module path
/// (`resnets.0`), as a module-path bundle names a submodule's output.
pub(crate) fn layer(name: &str, i: usize, f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let y = trace::scope_at(name, i, f)?;
    if trace::enabled() {
        trace::record(&format!("{name}.{i}"), &y);
    }
    Ok(y)
}

/// The attention after a resnet: a cross-attention block's `Transformer2DModel`, or an
/// `AttnDownBlock2D` / `AttnUpBlock2D`'s `Attention` over the image.
#[derive(Debug, Clone)]
enum BlockAttention {
    Transformer(Box<Transformer2DModel>),
    Image(Box<Attention>),
}

/// Run the attention (if any) on `h` as `attentions.i`.
fn attend(attn: Option<&BlockAttention>, i: usize, h: Tensor, ctx: &Context) -> Result<Tensor> {
    let Some(attn) = attn else { return Ok(h) };
    layer("attentions", i, || match attn {
        BlockAttention::Transformer(t) => t.forward(
            &h,
            ctx.encoder_hidden_states,
            ctx.attention_mask,
            ctx.encoder_attention_mask,
        ),
        BlockAttention::Image(a) => a.forward(&h, None, None),
    })
}

/// `AttnDownBlock2D` / `AttnUpBlock2D`'s `Attention(channels, heads=channels // head_dim,
/// dim_head=head_dim, eps, norm_num_groups=groups, residual_connection=True, bias=True,
/// upcast_softmax=True, _from_deprecated_attn_block=True)`.
pub fn image_attention_config(
    block: &'static str,
    channels: usize,
    head_dim: usize,
    groups: usize,
    eps: f64,
) -> Result<AttentionConfig> {
    let heads = crate::config::check_divides(block, channels, head_dim)?;
    crate::config::from_json(
        Attention::BLOCK,
        &serde_json::json!({
            "query_dim": channels, "heads": heads, "dim_head": head_dim, "eps": eps,
            "norm_num_groups": groups, "residual_connection": true, "bias": true,
            "upcast_softmax": true, "_from_deprecated_attn_block": true,
        }),
    )
}

/// The attentions of an unconditional block: one `Attention` (of `cfg`) after each of `layers`
/// resnets, or none.
fn image_attentions(vb: &VarBuilder, cfg: Option<&AttentionConfig>, layers: usize) -> Result<Vec<BlockAttention>> {
    let Some(cfg) = cfg else { return Ok(vec![]) };
    (0..layers)
        .map(|i| {
            let a = Attention::new(vb.pp("attentions").pp(i), cfg)?;
            Ok(BlockAttention::Image(Box::new(a)))
        })
        .collect()
}

/// A U-Net's mid block, built from the kwargs `diffusers::model_config` derives from the same
/// config (so the model and `unet-parity detect` agree on it): `None` where the config has none.
pub(crate) fn mid_block<C: serde::Serialize, K: serde::de::DeserializeOwned, M>(
    vb: &VarBuilder,
    (model, class): (&'static str, ModelClass),
    cfg: &C,
    mid: &'static str,
    new: impl FnOnce(VarBuilder, &K) -> Result<M>,
) -> Result<Option<M>> {
    let json = serde_json::to_value(cfg).map_err(|e| Error::config(model, e.to_string()))?;
    let Some(spec) = mid_blocks(&json, Some(class), false)?.into_iter().next() else {
        return Ok(None);
    };
    let kwargs: K = crate::config::from_json(mid, &spec.config)?;
    Ok(Some(new(vb.pp(spec.prefix), &kwargs)?))
}

/// Run `resnets.i` on `h`.
fn run_resnet(r: &ResnetBlock2D, i: usize, h: &Tensor, temb: &Tensor) -> Result<Tensor> {
    layer("resnets", i, || r.forward(h, Some(temb)))
}

/// `CrossAttnDownBlock2D` or `AttnDownBlock2D` (with attentions) or `DownBlock2D` (without).
#[derive(Debug, Clone)]
pub struct DownBlock {
    resnets: Vec<ResnetBlock2D>,
    attentions: Vec<BlockAttention>,
    downsampler: Option<Downsample2D>,
}

impl DownBlock {
    pub const CROSS_ATTN: &'static str = "CrossAttnDownBlock2D";
    pub const PLAIN: &'static str = "DownBlock2D";

    /// The block `kind` (`CrossAttnDownBlock2D` or `DownBlock2D`) from `in_channels` to
    /// `out_channels`, with `args.layers` resnets.
    pub fn new(
        vb: VarBuilder,
        kind: &str,
        (in_channels, out_channels): (usize, usize),
        args: &BlockArgs,
        kw: &BlockKwargs,
        add_downsample: bool,
    ) -> Result<Self> {
        const BLOCK: &str = "diffusers.CrossAttnDownBlock2D";
        let cross = kind == Self::CROSS_ATTN;
        let (mut resnets, mut attentions) = (vec![], vec![]);
        for i in 0..args.layers {
            let c_in = if i == 0 { in_channels } else { out_channels };
            resnets.push(ResnetBlock2D::new(
                vb.pp("resnets").pp(i),
                &resnet(kw, c_in, out_channels),
            )?);
            if cross {
                let cfg = transformer_config(
                    BLOCK,
                    kw,
                    args,
                    out_channels,
                    depth(BLOCK, &args.transformer_layers, args.layers, i)?,
                )?;
                let t = Transformer2DModel::new(vb.pp("attentions").pp(i), &cfg)?;
                attentions.push(BlockAttention::Transformer(Box::new(t)));
            }
        }
        let downsampler = if add_downsample {
            let vb = vb.pp("downsamplers").pp(0);
            Some(Downsample2D::new(
                vb,
                out_channels,
                out_channels,
                kw.downsample_padding,
            )?)
        } else {
            None
        };
        Ok(Self {
            resnets,
            attentions,
            downsampler,
        })
    }

    /// `UNet2DModel`'s `AttnDownBlock2D` (`attention`: its `Attention` kwargs,
    /// [`image_attention_config`]) or `DownBlock2D` (`None`): `layers` resnets of `resnet`
    /// (channels set here), then a `Downsample2D` with `downsample_padding` unless `None`.
    pub fn unconditional(
        vb: VarBuilder,
        (in_channels, out_channels): (usize, usize),
        layers: usize,
        resnet: &ResnetBlock2DConfig,
        attention: Option<&AttentionConfig>,
        downsample_padding: Option<usize>,
    ) -> Result<Self> {
        let resnets = (0..layers)
            .map(|i| {
                let cfg = ResnetBlock2DConfig {
                    in_channels: if i == 0 { in_channels } else { out_channels },
                    out_channels: Some(out_channels),
                    ..resnet.clone()
                };
                ResnetBlock2D::new(vb.pp("resnets").pp(i), &cfg)
            })
            .collect::<Result<_>>()?;
        let downsampler = downsample_padding
            .map(|p| Downsample2D::new(vb.pp("downsamplers").pp(0), out_channels, out_channels, p))
            .transpose()?;
        Ok(Self {
            resnets,
            attentions: image_attentions(&vb, attention, layers)?,
            downsampler,
        })
    }

    /// `(hidden_states, output_states)`.
    pub fn forward(&self, hidden_states: &Tensor, ctx: &Context) -> Result<(Tensor, Vec<Tensor>)> {
        let mut h = hidden_states.clone();
        let mut states = Vec::with_capacity(self.resnets.len() + 1);
        for (i, r) in self.resnets.iter().enumerate() {
            h = run_resnet(r, i, &h, ctx.temb)?;
            h = attend(self.attentions.get(i), i, h, ctx)?;
            states.push(h.clone());
        }
        if let Some(d) = &self.downsampler {
            h = layer("downsamplers", 0, || d.forward(&h))?;
            states.push(h.clone());
        }
        Ok((h, states))
    }
}

/// `CrossAttnUpBlock2D` or `AttnUpBlock2D` (with attentions) or `UpBlock2D` (without).
#[derive(Debug, Clone)]
pub struct UpBlock {
    resnets: Vec<ResnetBlock2D>,
    attentions: Vec<BlockAttention>,
    upsampler: Option<Upsample2D>,
}

/// The channels of an up block: its `in_channels`, `out_channels` and `prev_output_channel`.
#[derive(Debug, Clone, Copy)]
pub struct UpChannels {
    pub in_channels: usize,
    pub out_channels: usize,
    pub prev_output_channel: usize,
}

impl UpChannels {
    /// Resnet `i`'s input channels (of `layers`): the hidden state (`prev_output_channel` for
    /// the first, `out_channels` after) concatenated with its skip (`in_channels` for the last,
    /// `out_channels` before).
    fn resnet_in(&self, i: usize, layers: usize) -> usize {
        let hidden = if i == 0 {
            self.prev_output_channel
        } else {
            self.out_channels
        };
        let skip = if i + 1 == layers {
            self.in_channels
        } else {
            self.out_channels
        };
        hidden + skip
    }
}

impl UpBlock {
    pub const CROSS_ATTN: &'static str = "CrossAttnUpBlock2D";
    pub const PLAIN: &'static str = "UpBlock2D";

    pub fn new(
        vb: VarBuilder,
        kind: &str,
        ch: UpChannels,
        args: &BlockArgs,
        kw: &BlockKwargs,
        add_upsample: bool,
    ) -> Result<Self> {
        const BLOCK: &str = "diffusers.CrossAttnUpBlock2D";
        let cross = kind == Self::CROSS_ATTN;
        let (mut resnets, mut attentions) = (vec![], vec![]);
        for i in 0..args.layers {
            let cfg = resnet(kw, ch.resnet_in(i, args.layers), ch.out_channels);
            resnets.push(ResnetBlock2D::new(vb.pp("resnets").pp(i), &cfg)?);
            if cross {
                let cfg = transformer_config(
                    BLOCK,
                    kw,
                    args,
                    ch.out_channels,
                    depth(BLOCK, &args.transformer_layers, args.layers, i)?,
                )?;
                let t = Transformer2DModel::new(vb.pp("attentions").pp(i), &cfg)?;
                attentions.push(BlockAttention::Transformer(Box::new(t)));
            }
        }
        let upsampler = if add_upsample {
            Some(Upsample2D::new(
                vb.pp("upsamplers").pp(0),
                ch.out_channels,
                ch.out_channels,
            )?)
        } else {
            None
        };
        Ok(Self {
            resnets,
            attentions,
            upsampler,
        })
    }

    /// `UNet2DModel`'s `AttnUpBlock2D` (`attention`: its `Attention` kwargs) or `UpBlock2D`
    /// (`None`): `layers` resnets of `resnet` (channels set here: the first takes
    /// `prev_output_channel`, the last skip `in_channels`), then an `Upsample2D` when `add_upsample`.
    pub fn unconditional(
        vb: VarBuilder,
        ch: UpChannels,
        layers: usize,
        resnet: &ResnetBlock2DConfig,
        attention: Option<&AttentionConfig>,
        add_upsample: bool,
    ) -> Result<Self> {
        let resnets = (0..layers)
            .map(|i| {
                let cfg = ResnetBlock2DConfig {
                    in_channels: ch.resnet_in(i, layers),
                    out_channels: Some(ch.out_channels),
                    ..resnet.clone()
                };
                ResnetBlock2D::new(vb.pp("resnets").pp(i), &cfg)
            })
            .collect::<Result<_>>()?;
        let upsampler = add_upsample
            .then(|| Upsample2D::new(vb.pp("upsamplers").pp(0), ch.out_channels, ch.out_channels))
            .transpose()?;
        Ok(Self {
            resnets,
            attentions: image_attentions(&vb, attention, layers)?,
            upsampler,
        })
    }

    /// How many skip connections the block takes (`len(resnets)`).
    pub fn skips(&self) -> usize {
        self.resnets.len()
    }

    /// `forward(hidden_states, res_hidden_states_tuple, ...)`: `res` in the order the down
    /// blocks produced them (the last is taken first).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        res: &[Tensor],
        ctx: &Context,
        upsample_size: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let mut h = hidden_states.clone();
        for (i, (r, skip)) in self.resnets.iter().zip(res.iter().rev()).enumerate() {
            h = Tensor::cat(&[&h, skip], 1)?;
            h = run_resnet(r, i, &h, ctx.temb)?;
            h = attend(self.attentions.get(i), i, h, ctx)?;
        }
        if let Some(u) = &self.upsampler {
            h = layer("upsamplers", 0, || u.forward(&h, upsample_size))?;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::Downsample2D;

    /// `min_input` is the smallest size `output_size` takes through `n` downsamplers (checked by
    /// trying every size), and stays a number for any `n`.
    #[test]
    fn the_smallest_input_goes_through_every_downsampler() {
        for padding in 0..3 {
            for n in 0..6 {
                let through = |s: usize| {
                    (0..n)
                        .try_fold(s, |h, _| Downsample2D::output_size(h, padding))
                        .is_some()
                };
                let smallest = (1..=64).find(|&s| through(s)).unwrap();
                assert_eq!(Downsample2D::min_input(n, padding), smallest, "n {n} padding {padding}");
            }
        }
        assert_eq!(Downsample2D::min_input(1 << 20, 0), usize::MAX);
        assert_eq!(Downsample2D::output_size(1, 0), None);
        assert_eq!(Downsample2D::output_size(3, 0), Some(1));
    }
}

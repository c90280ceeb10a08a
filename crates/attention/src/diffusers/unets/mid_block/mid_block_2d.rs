//! diffusers 0.42.1 `UNetMidBlock2D` (`models/unets/unet_2d_blocks.py`): the mid block of
//! `UNet2DModel` and of `AutoencoderKL`'s encoder and decoder, resnets interleaved with
//! self-attention [`Attention`] blocks.

use super::{mid_block_config, MidStack, TimeScaleShift};
use crate::config::defaults;
use crate::cpu_kernels::MemoryFormat;
use crate::diffusers::attention::{Attention, AttentionConfig};
use crate::diffusers::resnet::ResnetBlock2D;
use crate::diffusers::resnet_cond_norm::{ResnetBlockCondNorm2D, ResnetBlockCondNorm2DConfig};
use crate::trace;
use crate::{config, Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use std::cell::Cell;

mid_block_config! {
    /// Keyword arguments of `UNetMidBlock2D(in_channels, temb_channels, dropout=0.0, num_layers=1,
    /// resnet_eps=1e-6, resnet_time_scale_shift="default", resnet_act_fn="swish", resnet_groups=32,
    /// attn_groups=None, resnet_pre_norm=True, add_attention=True, attention_head_dim=1,
    /// output_scale_factor=1.0)`.
    pub struct UNetMidBlock2DConfig {
        [
            /// Channels in and out (`block_out_channels[-1]` of the model).
            pub in_channels: usize,
            /// `null` for the VAE (no time embedding).
            pub temb_channels: Option<usize>,
        ]
        /// Attention + resnet pairs after the first resnet.
        #[serde(default = "defaults::usize::<1>")]
        pub num_layers: usize = defaults::usize::<1>(),
        /// `null`: `resnet_groups` (with the default time norm; no norm otherwise).
        #[serde(default)]
        pub attn_groups: Option<usize> = None,
        /// False: resnets only (no attention between them).
        #[serde(default = "defaults::yes")]
        pub add_attention: bool = defaults::yes(),
        /// `null`: one head of `in_channels` (diffusers warns).
        #[serde(default = "defaults::some::<1>")]
        pub attention_head_dim: Option<usize> = defaults::some::<1>(),
    }
    with [resnet]
}

/// A `UNetMidBlock2D` resnet: `ResnetBlock2D`, or `ResnetBlockCondNorm2D` with
/// `resnet_time_scale_shift="spatial"` (the MoVQ decoder).
// A block holds a handful of these: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum MidResnet {
    Plain(ResnetBlock2D),
    Spatial(ResnetBlockCondNorm2D),
}

impl MidResnet {
    fn forward(&self, x: &Tensor, temb: Option<&Tensor>, format: MemoryFormat) -> Result<Tensor> {
        match self {
            MidResnet::Plain(r) => r.forward_as(x, temb, format),
            MidResnet::Spatial(r) => r.forward_as(x, temb, format),
        }
    }
}

/// `diffusers.models.unets.unet_2d_blocks.UNetMidBlock2D`. With `resnet_time_scale_shift="spatial"`
/// its resnets are `ResnetBlockCondNorm2D`s and its attentions carry a `spatial_norm`; `temb` is
/// then the quantized latent `zq` `(B, temb_channels, h, w)`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock2D {
    layers: MidStack<MidResnet, Option<Attention>>,
}

impl UNetMidBlock2D {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock2D";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock2DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg.in_channels;
        let kwargs = cfg.resnet_kwargs();
        let spatial = cfg.resnet_time_scale_shift == TimeScaleShift::Spatial;
        let groups = kwargs.groups(c);
        let head_dim = cfg.attention_head_dim.unwrap_or(c);
        let heads = config::check_divides(block, c, head_dim)?;
        let make_resnet: Box<dyn Fn(VarBuilder) -> Result<MidResnet>> = if spatial {
            let zq = cfg.temb_channels.ok_or_else(|| {
                Error::config(
                    block,
                    "resnet_time_scale_shift \"spatial\" needs temb_channels (the zq channels)",
                )
            })?;
            let resnet = ResnetBlockCondNorm2DConfig {
                in_channels: c,
                out_channels: c,
                temb_channels: zq,
                non_linearity: cfg.resnet_act_fn,
                output_scale_factor: cfg.output_scale_factor,
            };
            Box::new(move |vb| Ok(MidResnet::Spatial(ResnetBlockCondNorm2D::new(vb, &resnet)?)))
        } else {
            let resnet = kwargs.resnet(block, (c, c), cfg.temb_channels, (groups, None))?;
            Box::new(move |vb| Ok(MidResnet::Plain(ResnetBlock2D::new(vb, &resnet)?)))
        };
        let default_norm = cfg.resnet_time_scale_shift == TimeScaleShift::Default;
        let attn = AttentionConfig {
            heads,
            dim_head: head_dim,
            rescale_output_factor: cfg.output_scale_factor,
            eps: cfg.resnet_eps,
            norm_num_groups: cfg.attn_groups.or(default_norm.then_some(groups)),
            spatial_norm_dim: if spatial { cfg.temb_channels } else { None },
            residual_connection: true,
            bias: true,
            upcast_softmax: true,
            _from_deprecated_attn_block: true,
            ..AttentionConfig::new(c)
        };

        let vb_res = vb.pp("resnets");
        let vb_attn = vb.pp("attentions");
        let mut resnets = vec![make_resnet(vb_res.pp(0))?];
        let mut attentions = vec![];
        for i in 0..cfg.num_layers {
            attentions.push(if cfg.add_attention {
                Some(Attention::new(vb_attn.pp(i), &attn)?)
            } else {
                None
            });
            resnets.push(make_resnet(vb_res.pp(i + 1))?);
        }
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
        })
    }

    /// `forward(hidden_states, temb=None)`: `(B, in_channels, H, W)`, `temb` `(B, temb_channels)`
    /// (the zq map `(B, temb_channels, h, w)` with `"spatial"`).
    pub fn forward(&self, hidden_states: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.forward_as(hidden_states, temb, MemoryFormat::Contiguous)?.0)
    }

    /// [`Self::forward`] of an input PyTorch lays out as `format`, with the layout of the
    /// output: after an attention PyTorch's tensor is channels_last
    /// ([`MemoryFormat::of_attention_output`]), and the resnets after it take the channels_last
    /// GroupNorm kernel (`resnets.1+`, as the AutoencoderKL's encoder and decoder run them).
    pub fn forward_as(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        format: MemoryFormat,
    ) -> Result<(Tensor, MemoryFormat)> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let layout = Cell::new(format);
        let h = self.layers.forward(
            hidden_states,
            |resnet, h| resnet.forward(h, temb, layout.get()),
            |attn, h| match attn {
                Some(attn) => {
                    layout.set(MemoryFormat::of_attention_output(h.dims()));
                    attn.forward_with_temb(h, None, None, temb)
                }
                // `add_attention=False`: nothing runs, nothing is recorded under `attentions.i`.
                None => Ok(h.clone()),
            },
        )?;
        trace::record("output", &h);
        Ok((h, layout.get()))
    }
}

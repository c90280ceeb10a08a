//! diffusers 0.42.1 `UNetMidBlock2D` (`models/unets/unet_2d_blocks.py`): the mid block of
//! `UNet2DModel` and of `AutoencoderKL`'s encoder and decoder, resnets interleaved with
//! self-attention [`Attention`] blocks.

use super::{default_shift, from_required, groups_32, one, resnet_config, time_norm};
use crate::diffusers::attention::{Attention, AttentionConfig};
use crate::diffusers::resnet::{eps_1e6, one_f, swish, ResnetBlock2D};
use crate::diffusers::resnet_cond_norm::{ResnetBlockCondNorm2D, ResnetBlockCondNorm2DConfig};
use crate::layers::Activation;
use crate::trace;
use crate::{config, Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `UNetMidBlock2D(in_channels, temb_channels, dropout=0.0, num_layers=1,
/// resnet_eps=1e-6, resnet_time_scale_shift="default", resnet_act_fn="swish", resnet_groups=32,
/// attn_groups=None, resnet_pre_norm=True, add_attention=True, attention_head_dim=1,
/// output_scale_factor=1.0)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNetMidBlock2DConfig {
    /// Channels in and out (`block_out_channels[-1]` of the model).
    pub in_channels: usize,
    /// `null` for the VAE (no time embedding).
    pub temb_channels: Option<usize>,
    /// Dropout probability of the resnets (inactive in inference; kept for the kwargs).
    #[serde(default)]
    pub dropout: f64,
    /// Attention + resnet pairs after the first resnet.
    #[serde(default = "one")]
    pub num_layers: usize,
    /// GroupNorm eps of the resnets: the model's `norm_eps` (SD U-Nets 1e-5; VAEs 1e-6, the class default).
    #[serde(default = "eps_1e6")]
    pub resnet_eps: f64,
    /// How `temb` enters the resnets: `default` (added), `scale_shift` (FiLM), `spatial` (MoVQ's decoder).
    #[serde(default = "default_shift")]
    pub resnet_time_scale_shift: String,
    /// The resnets' activation (`swish` = `silu`, `mish`, `gelu`).
    #[serde(default = "swish")]
    pub resnet_act_fn: Activation,
    /// `null`: `min(in_channels // 4, 32)`.
    #[serde(default = "groups_32")]
    pub resnet_groups: Option<usize>,
    /// `null`: `resnet_groups` (with the default time norm; no norm otherwise).
    #[serde(default)]
    pub attn_groups: Option<usize>,
    /// Always true in diffusers' resnets (kept for the kwargs).
    #[serde(default = "config::yes")]
    pub resnet_pre_norm: bool,
    /// False: resnets only (no attention between them).
    #[serde(default = "config::yes")]
    pub add_attention: bool,
    /// `null`: one head of `in_channels` (diffusers warns).
    #[serde(default = "one_opt")]
    pub attention_head_dim: Option<usize>,
    /// Each resnet's output is divided by this (`mid_block_scale_factor`).
    #[serde(default = "one_f")]
    pub output_scale_factor: f64,
}

fn one_opt() -> Option<usize> {
    Some(1)
}

impl UNetMidBlock2DConfig {
    /// `UNetMidBlock2D(in_channels, temb_channels)` with diffusers' defaults for the rest
    /// (`temb_channels` `None` for the VAE's); change fields after (`attention_head_dim`, ...).
    pub fn new(in_channels: usize, temb_channels: Option<usize>) -> Self {
        from_required(in_channels, temb_channels)
    }
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
    fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        match self {
            MidResnet::Plain(r) => r.forward(x, temb),
            MidResnet::Spatial(r) => r.forward(x, temb),
        }
    }
}

/// `diffusers.models.unets.unet_2d_blocks.UNetMidBlock2D`. With `resnet_time_scale_shift="spatial"`
/// its resnets are `ResnetBlockCondNorm2D`s and its attentions carry a `spatial_norm`; `temb` is
/// then the quantized latent `zq` `(B, temb_channels, h, w)`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock2D {
    resnets: Vec<MidResnet>,
    attentions: Vec<Option<Attention>>,
}

impl UNetMidBlock2D {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock2D";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock2DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg.in_channels;
        let spatial = cfg.resnet_time_scale_shift == "spatial";
        let groups = cfg.resnet_groups.unwrap_or((c / 4).min(32));
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
            let norm = time_norm(block, &cfg.resnet_time_scale_shift)?;
            let resnet = resnet_config(
                c,
                c,
                groups,
                None,
                cfg.temb_channels,
                cfg.resnet_eps,
                cfg.resnet_act_fn,
                norm,
                cfg.dropout,
                cfg.output_scale_factor,
                cfg.resnet_pre_norm,
            );
            Box::new(move |vb| Ok(MidResnet::Plain(ResnetBlock2D::new(vb, &resnet)?)))
        };
        let default_norm = cfg.resnet_time_scale_shift == "default";
        let mut attn = AttentionConfig::new(c);
        attn.heads = heads;
        attn.dim_head = head_dim;
        attn.rescale_output_factor = cfg.output_scale_factor;
        attn.eps = cfg.resnet_eps;
        attn.norm_num_groups = cfg.attn_groups.or(default_norm.then_some(groups));
        attn.spatial_norm_dim = if spatial { cfg.temb_channels } else { None };
        attn.residual_connection = true;
        attn.bias = true;
        attn.upcast_softmax = true;
        attn._from_deprecated_attn_block = true;

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
        Ok(Self { resnets, attentions })
    }

    /// `forward(hidden_states, temb=None)`: `(B, in_channels, H, W)`, `temb` `(B, temb_channels)`
    /// (the zq map `(B, temb_channels, h, w)` with `"spatial"`).
    pub fn forward(&self, hidden_states: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let mut h = trace::scope("resnets.0", || self.resnets[0].forward(hidden_states, temb))?;
        for (i, (attn, resnet)) in self.attentions.iter().zip(&self.resnets[1..]).enumerate() {
            if let Some(attn) = attn {
                h = trace::scope_at("attentions", i, || attn.forward_with_temb(&h, None, None, temb))?;
            }
            h = trace::scope_at("resnets", i + 1, || resnet.forward(&h, temb))?;
        }
        trace::record("output", &h);
        Ok(h)
    }
}

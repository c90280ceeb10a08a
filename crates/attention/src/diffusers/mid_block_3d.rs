//! diffusers' `UNetMidBlock3DCrossAttn` (`models/unets/unet_3d_blocks.py`, 0.42.1): the mid
//! block of the video U-Nets `UNet3DConditionModel` (ModelScope text-to-video, Zeroscope) and
//! `I2VGenXLUNet`. Each `ResnetBlock2D` is followed by a [`TemporalConvLayer`] and each
//! `Transformer2DModel` by a [`TransformerTemporalModel`]; `hidden_states` is
//! `(batch·num_frames, C, H, W)`.
//!
//! ```text
//! forward(h, temb, encoder_hidden_states, attention_mask, num_frames, cross_attention_kwargs):
//!   h = temp_convs[0](resnets[0](h, temb), num_frames)
//!   for attn, temp_attn, resnet, temp_conv in zip(attentions, temp_attentions, resnets[1:], temp_convs[1:]):
//!     h = attn(h, encoder_hidden_states)            # Transformer2DModel, no mask
//!     h = temp_attn(h, num_frames)                  # TransformerTemporalModel, no context
//!     h = temp_conv(resnet(h, temb), num_frames)
//! ```
//!
//! As in diffusers: `attention_mask` is taken and not used; `cross_attention_kwargs` only reach
//! the attention processors, and with the default ones nothing in them changes the output (the
//! deprecated `scale` is ignored), so this forward does not take them; `dual_cross_attention` is
//! taken and not used. The constructor's `num_attention_heads` is the per-head *width*
//! (`Transformer2DModel(in_channels // num_attention_heads, num_attention_heads, ...)`, the same
//! for the temporal transformers): ModelScope's `attention_head_dim: 64` gives 20 heads of 64 at
//! 1280 channels. The temporal convs have `dropout=0.1` (identity in eval) and the temporal
//! transformers never upcast their attention.

use crate::diffusers::mid_block::{default_shift, from_required, groups_32, one, resnet_config, time_norm};
use crate::diffusers::resnet::{eps_1e6, one_f, swish, ResnetBlock2D};
use crate::diffusers::temporal::{
    TemporalConvLayer, TemporalConvLayerConfig, TransformerTemporalModel, TransformerTemporalModelConfig,
};
use crate::diffusers::transformer::{Transformer2DModel, Transformer2DModelConfig};
use crate::layers::Activation;
use crate::trace;
use crate::{config, Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

fn cross_1280() -> usize {
    1280
}

/// Keyword arguments of `UNetMidBlock3DCrossAttn(in_channels, temb_channels, dropout=0.0,
/// num_layers=1, resnet_eps=1e-6, resnet_time_scale_shift="default", resnet_act_fn="swish",
/// resnet_groups=32, resnet_pre_norm=True, num_attention_heads=1, output_scale_factor=1.0,
/// cross_attention_dim=1280, dual_cross_attention=False, use_linear_projection=True,
/// upcast_attention=False)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNetMidBlock3DCrossAttnConfig {
    pub in_channels: usize,
    pub temb_channels: Option<usize>,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "one")]
    pub num_layers: usize,
    #[serde(default = "eps_1e6")]
    pub resnet_eps: f64,
    #[serde(default = "default_shift")]
    pub resnet_time_scale_shift: String,
    #[serde(default = "swish")]
    pub resnet_act_fn: Activation,
    /// `null`: `min(in_channels // 4, 32)` (for the temporal layers and transformers too).
    #[serde(default = "groups_32")]
    pub resnet_groups: Option<usize>,
    #[serde(default = "config::yes")]
    pub resnet_pre_norm: bool,
    /// The per-head width (see the module docs): `in_channels // num_attention_heads` heads.
    #[serde(default = "one")]
    pub num_attention_heads: usize,
    #[serde(default = "one_f")]
    pub output_scale_factor: f64,
    #[serde(default = "cross_1280")]
    pub cross_attention_dim: usize,
    /// Taken and not used by diffusers.
    #[serde(default)]
    pub dual_cross_attention: bool,
    #[serde(default = "config::yes")]
    pub use_linear_projection: bool,
    /// The spatial transformers' only (diffusers does not pass it to the temporal ones).
    #[serde(default)]
    pub upcast_attention: bool,
}

impl UNetMidBlock3DCrossAttnConfig {
    /// `UNetMidBlock3DCrossAttn(in_channels, temb_channels)` with diffusers' defaults for the
    /// rest; change fields after (`num_attention_heads`, `cross_attention_dim`, ...).
    pub fn new(in_channels: usize, temb_channels: Option<usize>) -> Self {
        from_required(in_channels, temb_channels)
    }
}

/// `diffusers.models.unets.unet_3d_blocks.UNetMidBlock3DCrossAttn`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock3DCrossAttn {
    resnets: Vec<ResnetBlock2D>,
    temp_convs: Vec<TemporalConvLayer>,
    attentions: Vec<Transformer2DModel>,
    temp_attentions: Vec<TransformerTemporalModel>,
}

impl UNetMidBlock3DCrossAttn {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock3DCrossAttn";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock3DCrossAttnConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let norm = time_norm(block, &cfg.resnet_time_scale_shift)?;
        let c = cfg.in_channels;
        let groups = cfg.resnet_groups.unwrap_or((c / 4).min(32));
        let head_dim = cfg.num_attention_heads;
        let heads = c.checked_div(head_dim).unwrap_or(0);
        if heads == 0 {
            return Err(Error::config(
                block,
                format!("num_attention_heads {head_dim} (the per-head width) gives in_channels // it = 0 heads at {c} channels"),
            ));
        }
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
        let temp_conv = TemporalConvLayerConfig {
            in_dim: c,
            out_dim: Some(c),
            dropout: 0.1,
            norm_num_groups: groups,
        };
        let spatial: Transformer2DModelConfig = config::from_json(
            block,
            &serde_json::json!({
                "num_attention_heads": heads,
                "attention_head_dim": head_dim,
                "in_channels": c,
                "num_layers": 1,
                "cross_attention_dim": cfg.cross_attention_dim,
                "norm_num_groups": groups,
                "use_linear_projection": cfg.use_linear_projection,
                "upcast_attention": cfg.upcast_attention,
            }),
        )?;
        let temporal: TransformerTemporalModelConfig = config::from_json(
            block,
            &serde_json::json!({
                "num_attention_heads": heads,
                "attention_head_dim": head_dim,
                "in_channels": c,
                "num_layers": 1,
                "cross_attention_dim": cfg.cross_attention_dim,
                "norm_num_groups": groups,
            }),
        )?;
        let (vb_res, vb_tc) = (vb.pp("resnets"), vb.pp("temp_convs"));
        let mut resnets = vec![ResnetBlock2D::new(vb_res.pp(0), &resnet)?];
        let mut temp_convs = vec![TemporalConvLayer::new(vb_tc.pp(0), &temp_conv)?];
        let (mut attentions, mut temp_attentions) = (vec![], vec![]);
        for i in 0..cfg.num_layers {
            attentions.push(Transformer2DModel::new(vb.pp("attentions").pp(i), &spatial)?);
            temp_attentions.push(TransformerTemporalModel::new(
                vb.pp("temp_attentions").pp(i),
                &temporal,
            )?);
            resnets.push(ResnetBlock2D::new(vb_res.pp(i + 1), &resnet)?);
            temp_convs.push(TemporalConvLayer::new(vb_tc.pp(i + 1), &temp_conv)?);
        }
        Ok(Self {
            resnets,
            temp_convs,
            attentions,
            temp_attentions,
        })
    }

    /// `forward(hidden_states, temb=None, encoder_hidden_states=None, attention_mask=None,
    /// num_frames=1)`: `hidden_states` `(B·F, C, H, W)`, `temb` `(B·F, temb_channels)` and
    /// `encoder_hidden_states` `(B·F, S, cross_attention_dim)` (the U-Net repeats them per
    /// frame). `attention_mask` is not used, as in diffusers.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        num_frames: usize,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        let _unused_as_in_diffusers = attention_mask;
        let mut h = trace::scope("resnets.0", || self.resnets[0].forward(hidden_states, temb))?;
        h = trace::scope("temp_convs.0", || self.temp_convs[0].forward(&h, num_frames))?;
        let layers = self.attentions.iter().zip(&self.temp_attentions);
        let rest = self.resnets[1..].iter().zip(&self.temp_convs[1..]);
        for (i, ((attn, temp_attn), (resnet, temp_conv))) in layers.zip(rest).enumerate() {
            h = trace::scope_at("attentions", i, || attn.forward(&h, encoder_hidden_states, None, None))?;
            h = trace::scope_at("temp_attentions", i, || temp_attn.forward(&h, None, num_frames))?;
            h = trace::scope_at("resnets", i + 1, || resnet.forward(&h, temb))?;
            h = trace::scope_at("temp_convs", i + 1, || temp_conv.forward(&h, num_frames))?;
        }
        trace::record("output", &h);
        Ok(h)
    }
}

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

use crate::config::defaults;
use crate::diffusers::resnet::ResnetBlock2D;
use crate::diffusers::transformers::temporal::{
    TemporalConvLayer, TemporalConvLayerConfig, TransformerTemporalModel, TransformerTemporalModelConfig,
};
use crate::diffusers::transformers::transformer::{Transformer2DModel, Transformer2DModelConfig};
use crate::diffusers::unets::mid_block::{mid_block_config, MidStack, Step};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

mid_block_config! {
    /// Keyword arguments of `UNetMidBlock3DCrossAttn(in_channels, temb_channels, dropout=0.0,
    /// num_layers=1, resnet_eps=1e-6, resnet_time_scale_shift="default", resnet_act_fn="swish",
    /// resnet_groups=32, resnet_pre_norm=True, num_attention_heads=1, output_scale_factor=1.0,
    /// cross_attention_dim=1280, dual_cross_attention=False, use_linear_projection=True,
    /// upcast_attention=False)`. Its transformer kwargs are its own (not the shared
    /// [`TransformerKwargs`](crate::diffusers::unets::mid_block::TransformerKwargs)): `num_attention_heads`
    /// is the per-head width and `use_linear_projection` defaults to true. `resnet_groups` `null`
    /// is `min(in_channels // 4, 32)` for the temporal layers and transformers too.
    pub struct UNetMidBlock3DCrossAttnConfig {
        [
            pub in_channels: usize,
            pub temb_channels: Option<usize>,
        ]
        #[serde(default = "defaults::usize::<1>")]
        pub num_layers: usize = defaults::usize::<1>(),
        /// The per-head width (see the module docs): `in_channels // num_attention_heads` heads.
        #[serde(default = "defaults::usize::<1>")]
        pub num_attention_heads: usize = defaults::usize::<1>(),
        #[serde(default = "defaults::usize::<1280>")]
        pub cross_attention_dim: usize = defaults::usize::<1280>(),
        /// Taken and not used by diffusers.
        #[serde(default)]
        pub dual_cross_attention: bool = false,
        #[serde(default = "defaults::yes")]
        pub use_linear_projection: bool = defaults::yes(),
        /// The spatial transformers' only (diffusers does not pass it to the temporal ones).
        #[serde(default)]
        pub upcast_attention: bool = false,
    }
    with [resnet]
}

/// `diffusers.models.unets.unet_3d_blocks.UNetMidBlock3DCrossAttn`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock3DCrossAttn {
    layers: MidStack<ResnetBlock2D, Transformer2DModel>,
    /// After `resnets.i`.
    temp_convs: Vec<TemporalConvLayer>,
    /// After `attentions.i`.
    temp_attentions: Vec<TransformerTemporalModel>,
}

impl UNetMidBlock3DCrossAttn {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock3DCrossAttn";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock3DCrossAttnConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let kwargs = cfg.resnet_kwargs();
        let c = cfg.in_channels;
        let groups = kwargs.groups(c);
        let resnet = kwargs.resnet(block, (c, c), cfg.temb_channels, (groups, None))?;
        let head_dim = cfg.num_attention_heads;
        let heads = c.checked_div(head_dim).unwrap_or(0);
        if heads == 0 {
            return Err(Error::config(
                block,
                format!("num_attention_heads {head_dim} (the per-head width) gives in_channels // it = 0 heads at {c} channels"),
            ));
        }
        let temp_conv = TemporalConvLayerConfig {
            in_dim: c,
            out_dim: Some(c),
            dropout: 0.1,
            norm_num_groups: groups,
        };
        let spatial = Transformer2DModelConfig {
            num_attention_heads: heads,
            attention_head_dim: head_dim,
            in_channels: Some(c),
            num_layers: 1,
            cross_attention_dim: Some(cfg.cross_attention_dim),
            norm_num_groups: groups,
            use_linear_projection: cfg.use_linear_projection,
            upcast_attention: cfg.upcast_attention,
            ..Transformer2DModelConfig::default()
        };
        let temporal = TransformerTemporalModelConfig {
            num_attention_heads: heads,
            attention_head_dim: head_dim,
            in_channels: Some(c),
            num_layers: 1,
            cross_attention_dim: Some(cfg.cross_attention_dim),
            norm_num_groups: groups,
            ..TransformerTemporalModelConfig::default()
        };
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
            layers: MidStack::new(resnets, attentions),
            temp_convs,
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
        let h = self.layers.forward_then(
            hidden_states,
            |resnet, h| resnet.forward(h, temb),
            |attn, h| attn.forward(h, encoder_hidden_states, None, None),
            |step, h| match step {
                Step::Resnet(i) => trace::scope_at("temp_convs", i, || self.temp_convs[i].forward(&h, num_frames)),
                Step::Attention(i) => trace::scope_at("temp_attentions", i, || {
                    self.temp_attentions[i].forward(&h, None, num_frames)
                }),
            },
        )?;
        trace::record("output", &h);
        Ok(h)
    }
}

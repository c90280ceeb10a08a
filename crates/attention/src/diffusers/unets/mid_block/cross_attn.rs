//! diffusers 0.42.1 `UNetMidBlock2DCrossAttn` (`models/unets/unet_2d_blocks.py`): the mid block
//! of `UNet2DConditionModel` (SD 1.x, 2.x, XL), resnets interleaved with
//! [`Transformer2DModel`]s, or [`DualTransformer2DModel`]s with `dual_cross_attention=True`.

use super::{mid_block_config, LayersPerBlock, MidStack};
use crate::config::defaults;
use crate::diffusers::resnet::ResnetBlock2D;
use crate::diffusers::transformers::dual_transformer::{
    dual_inputs, DualMix, DualTransformer2DModel, DualTransformer2DModelConfig,
};
use crate::diffusers::transformers::transformer::Transformer2DModel;
use crate::trace;
use crate::{config, Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

mid_block_config! {
    /// Keyword arguments of `UNetMidBlock2DCrossAttn(in_channels, temb_channels, out_channels=None,
    /// dropout=0.0, num_layers=1, transformer_layers_per_block=1, resnet_eps=1e-6,
    /// resnet_time_scale_shift="default", resnet_act_fn="swish", resnet_groups=32,
    /// resnet_groups_out=None, resnet_pre_norm=True, num_attention_heads=1, output_scale_factor=1.0,
    /// cross_attention_dim=1280, dual_cross_attention=False, use_linear_projection=False,
    /// upcast_attention=False, attention_type="default")`.
    pub struct UNetMidBlock2DCrossAttnConfig {
        [
            /// Channels in and out (`block_out_channels[-1]` of the model).
            pub in_channels: usize,
            /// Width of the time embedding; `null` when the block takes none.
            pub temb_channels: Option<usize>,
        ]
        /// Output channels (`null`: `in_channels`).
        #[serde(default)]
        pub out_channels: Option<usize> = None,
        /// Attention + resnet pairs after the first resnet.
        #[serde(default = "defaults::usize::<1>")]
        pub num_layers: usize = defaults::usize::<1>(),
        /// Groups of the resnets' second norm (`null`: `resnet_groups`).
        #[serde(default)]
        pub resnet_groups_out: Option<usize> = None,
        /// Not a constructor argument: with `dual_cross_attention`, the `mix_ratio` attribute of
        /// every `DualTransformer2DModel` (absent: diffusers' 0.5). See [`DualMix`].
        #[serde(default)]
        pub mix_ratio: Option<f64> = None,
        /// Not a constructor argument: with `dual_cross_attention`, the `condition_lengths` attribute
        /// (absent: `[77, 257]`).
        #[serde(default)]
        pub condition_lengths: Option<[usize; 2]> = None,
        /// Not a constructor argument: with `dual_cross_attention`, the
        /// `transformer_index_for_condition` attribute (absent: `[1, 0]`).
        #[serde(default)]
        pub transformer_index_for_condition: Option<[usize; 2]> = None,
    }
    with [resnet, transformer]
}

impl UNetMidBlock2DCrossAttnConfig {
    /// `transformer_layers_per_block` as one count per layer.
    fn layers(&self) -> Result<Vec<usize>> {
        match &self.transformer_layers_per_block {
            LayersPerBlock::One(n) => Ok(vec![*n; self.num_layers]),
            LayersPerBlock::PerLayer(list) if list.len() >= self.num_layers => Ok(list.clone()),
            LayersPerBlock::PerLayer(list) => Err(Error::config(
                UNetMidBlock2DCrossAttn::BLOCK,
                format!(
                    "transformer_layers_per_block lists {} counts for num_layers {}",
                    list.len(),
                    self.num_layers
                ),
            )),
        }
    }

    /// With `dual_cross_attention`, `DualTransformer2DModel(num_attention_heads, out_channels //
    /// num_attention_heads, in_channels=out_channels, num_layers=1, cross_attention_dim,
    /// norm_num_groups=resnet_groups)` with the [`DualMix`] of [`Self::dual_mix`] (checked here
    /// for every config, so attributes without `dual_cross_attention` are an error).
    pub fn dual_transformer(&self) -> Result<DualTransformer2DModelConfig> {
        let block = UNetMidBlock2DCrossAttn::BLOCK;
        let mix = self.dual_mix()?;
        let out = self.out_channels.unwrap_or(self.in_channels);
        Ok(DualTransformer2DModelConfig {
            num_attention_heads: self.num_attention_heads,
            attention_head_dim: config::check_divides(block, out, self.num_attention_heads)?,
            in_channels: Some(out),
            num_layers: 1,
            cross_attention_dim: Some(self.cross_attention_dim),
            norm_num_groups: self.resnet_kwargs().groups(self.in_channels),
            mix_ratio: mix.mix_ratio,
            condition_lengths: mix.condition_lengths,
            transformer_index_for_condition: mix.transformer_index_for_condition,
            ..DualTransformer2DModelConfig::default()
        })
    }

    /// The [`DualMix`] the optional attribute keys give (diffusers' defaults for absent ones);
    /// an error when a key is given without `dual_cross_attention`.
    pub fn dual_mix(&self) -> Result<DualMix> {
        let given = self.mix_ratio.is_some()
            || self.condition_lengths.is_some()
            || self.transformer_index_for_condition.is_some();
        if given && !self.dual_cross_attention {
            return Err(Error::config(
                UNetMidBlock2DCrossAttn::BLOCK,
                "mix_ratio / condition_lengths / transformer_index_for_condition are DualTransformer2DModel \
                 attributes: they need dual_cross_attention true",
            ));
        }
        let d = DualMix::default();
        Ok(DualMix {
            mix_ratio: self.mix_ratio.unwrap_or(d.mix_ratio),
            condition_lengths: self.condition_lengths.unwrap_or(d.condition_lengths),
            transformer_index_for_condition: self
                .transformer_index_for_condition
                .unwrap_or(d.transformer_index_for_condition),
        })
    }
}

/// A `UNetMidBlock2DCrossAttn` attention: `Transformer2DModel`, or `DualTransformer2DModel` with
/// `dual_cross_attention`.
// A block holds a handful of these: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum CrossAttention {
    Single(Transformer2DModel),
    Dual(DualTransformer2DModel),
}

/// `diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DCrossAttn`.
///
/// With `dual_cross_attention` (Versatile Diffusion) each attention is a
/// [`DualTransformer2DModel`] built as diffusers builds it: `num_layers=1` (not
/// `transformer_layers_per_block`), `norm_num_groups=resnet_groups` (not `resnet_groups_out`) and
/// no `use_linear_projection`, `upcast_attention` or `attention_type` (diffusers does not pass
/// them); its [`DualMix`] comes from the config's optional keys or [`Self::set_transformer_params`].
#[derive(Debug, Clone)]
pub struct UNetMidBlock2DCrossAttn {
    layers: MidStack<ResnetBlock2D, CrossAttention>,
    /// `(cross_attention_dim, transformer width)` when they differ: `encoder_hidden_states` is
    /// then required (without it diffusers' `attn2` projects the hidden states as its context,
    /// which only works when the two widths agree).
    needs_context: Option<(usize, usize)>,
}

impl UNetMidBlock2DCrossAttn {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock2DCrossAttn";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock2DCrossAttnConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let dual = cfg.dual_transformer()?;
        let (resnet, transformer) = (cfg.resnet_kwargs(), cfg.transformer_kwargs());
        let (c, out) = (cfg.in_channels, cfg.out_channels.unwrap_or(cfg.in_channels));
        let groups = resnet.groups(c);
        let groups_out = cfg.resnet_groups_out.unwrap_or(groups);
        let first = resnet.resnet(block, (c, out), cfg.temb_channels, (groups, Some(groups_out)))?;
        let rest = resnet.resnet(block, (out, out), cfg.temb_channels, (groups_out, None))?;
        let head_dim = config::check_divides(block, out, cfg.num_attention_heads)?;
        let layers = cfg.layers()?;
        let vb_res = vb.pp("resnets");
        let vb_attn = vb.pp("attentions");
        let mut resnets = vec![ResnetBlock2D::new(vb_res.pp(0), &first)?];
        let mut attentions = vec![];
        for (i, &n) in layers.iter().take(cfg.num_layers).enumerate() {
            attentions.push(if cfg.dual_cross_attention {
                CrossAttention::Dual(DualTransformer2DModel::new(vb_attn.pp(i), &dual)?)
            } else {
                let single = transformer.transformer((out, head_dim), n, groups_out);
                CrossAttention::Single(Transformer2DModel::new(vb_attn.pp(i), &single)?)
            });
            resnets.push(ResnetBlock2D::new(vb_res.pp(i + 1), &rest)?);
        }
        let width = cfg.out_channels.unwrap_or(cfg.in_channels);
        let needs_context = (cfg.cross_attention_dim != width).then_some((cfg.cross_attention_dim, width));
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
            needs_context,
        })
    }

    /// Whether the attentions are `DualTransformer2DModel`s.
    pub fn is_dual(&self) -> bool {
        matches!(self.layers.attentions().first(), Some(CrossAttention::Dual(_)))
    }

    /// Versatile Diffusion's `_convert_to_dual_attention`: each `Transformer2DModel` of this
    /// (image U-Net's, not dual) block becomes a `DualTransformer2DModel` with it as
    /// `transformers.0` and `text[i]` (the text U-Net's mid-block transformer at
    /// `attentions.i`) as `transformers.1`; the transformers keep their own configs, as the
    /// pipeline keeps the modules.
    pub fn into_dual(self, text: Vec<Transformer2DModel>, mix: DualMix) -> Result<Self> {
        if text.len() != self.layers.attentions().len() || self.is_dual() {
            return Err(Error::config(
                Self::BLOCK,
                format!(
                    "into_dual takes a block without dual_cross_attention and one text transformer per \
                     attention ({} given for {})",
                    text.len(),
                    self.layers.attentions().len()
                ),
            ));
        }
        let (resnets, singles) = self.layers.into_parts();
        let mut attentions = Vec::with_capacity(text.len());
        for (a, t) in singles.into_iter().zip(text) {
            let CrossAttention::Single(image) = a else {
                unreachable!("checked: not dual")
            };
            attentions.push(CrossAttention::Dual(DualTransformer2DModel::from_transformers(
                [image, t],
                mix,
            )?));
        }
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
            needs_context: self.needs_context,
        })
    }

    /// Versatile Diffusion's `set_transformer_params`: set `mix` on every
    /// `DualTransformer2DModel`; an error without `dual_cross_attention`.
    pub fn set_transformer_params(&mut self, mix: DualMix) -> Result<()> {
        if !self.is_dual() {
            return Err(Error::config(
                Self::BLOCK,
                "set_transformer_params needs dual_cross_attention (DualTransformer2DModel attentions)",
            ));
        }
        for a in self.layers.attentions_mut() {
            if let CrossAttention::Dual(d) = a {
                d.set_mix(mix)?;
            }
        }
        Ok(())
    }

    /// `forward(hidden_states, temb=None, encoder_hidden_states=None, attention_mask=None,
    /// encoder_attention_mask=None)`; masks as [`Transformer2DModel::forward`] takes them.
    ///
    /// With `dual_cross_attention`: `encoder_hidden_states` (both conditions concatenated) is
    /// required and `attention_mask` ignored, as [`DualTransformer2DModel::forward`] does; an
    /// `encoder_attention_mask` is an error: diffusers 0.42.1 passes it to
    /// `DualTransformer2DModel.forward`, which has no such parameter (a `TypeError` on every
    /// call, `None` included: diffusers issue #13651); here `None` runs, as the mask-less call.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", encoder_attention_mask)?;
        if let (None, Some((context, width)), false) = (encoder_hidden_states, self.needs_context, self.is_dual()) {
            return Err(Error::input(
                Self::BLOCK,
                "encoder_hidden_states",
                format!(
                    "required: the cross-attention projects a context {context} wide (cross_attention_dim), e.g. \
                     the text encoder's output (B, tokens, {context}); without one diffusers projects the \
                     {width}-wide hidden states instead and fails"
                ),
            ));
        }
        let h = self.layers.forward(
            hidden_states,
            |resnet, h| resnet.forward(h, temb),
            |attn, h| match attn {
                CrossAttention::Single(t) => {
                    t.forward(h, encoder_hidden_states, attention_mask, encoder_attention_mask)
                }
                CrossAttention::Dual(d) => {
                    let context = dual_inputs(Self::BLOCK, encoder_hidden_states, encoder_attention_mask)?;
                    d.forward(h, context, attention_mask)
                }
            },
        )?;
        trace::record("output", &h);
        Ok(h)
    }
}

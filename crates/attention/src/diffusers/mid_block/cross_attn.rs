//! diffusers 0.42.1 `UNetMidBlock2DCrossAttn` (`models/unets/unet_2d_blocks.py`): the mid block
//! of `UNet2DConditionModel` (SD 1.x, 2.x, XL), resnets interleaved with
//! [`Transformer2DModel`]s, or [`DualTransformer2DModel`]s with `dual_cross_attention=True`.

use super::{default_shift, from_required, groups_32, one, resnet_config, time_norm};
use crate::diffusers::dual_transformer::{dual_inputs, DualMix, DualTransformer2DModel, DualTransformer2DModelConfig};
use crate::diffusers::resnet::{eps_1e6, one_f, swish, ResnetBlock2D};
use crate::diffusers::transformer::{Transformer2DModel, Transformer2DModelConfig};
use crate::layers::Activation;
use crate::trace;
use crate::{config, Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `transformer_layers_per_block`: one count for every layer, or one per layer.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum LayersPerBlock {
    One(usize),
    PerLayer(Vec<usize>),
}

impl Default for LayersPerBlock {
    fn default() -> Self {
        LayersPerBlock::One(1)
    }
}

fn cross_1280() -> usize {
    1280
}

/// Keyword arguments of `UNetMidBlock2DCrossAttn(in_channels, temb_channels, out_channels=None,
/// dropout=0.0, num_layers=1, transformer_layers_per_block=1, resnet_eps=1e-6,
/// resnet_time_scale_shift="default", resnet_act_fn="swish", resnet_groups=32,
/// resnet_groups_out=None, resnet_pre_norm=True, num_attention_heads=1, output_scale_factor=1.0,
/// cross_attention_dim=1280, dual_cross_attention=False, use_linear_projection=False,
/// upcast_attention=False, attention_type="default")`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNetMidBlock2DCrossAttnConfig {
    /// Channels in and out (`block_out_channels[-1]` of the model).
    pub in_channels: usize,
    /// Width of the time embedding; `null` when the block takes none.
    pub temb_channels: Option<usize>,
    /// Output channels (`null`: `in_channels`).
    #[serde(default)]
    pub out_channels: Option<usize>,
    /// Dropout probability of the resnets (inactive in inference; kept for the kwargs).
    #[serde(default)]
    pub dropout: f64,
    /// Attention + resnet pairs after the first resnet.
    #[serde(default = "one")]
    pub num_layers: usize,
    /// Transformer blocks per `Transformer2DModel` (SDXL: 10 at the mid block).
    #[serde(default)]
    pub transformer_layers_per_block: LayersPerBlock,
    /// GroupNorm eps of the resnets: the model's `norm_eps` (SD U-Nets 1e-5; VAEs 1e-6, the class default).
    #[serde(default = "eps_1e6")]
    pub resnet_eps: f64,
    /// How `temb` enters the resnets: `default` (added), `scale_shift` (FiLM), `spatial` (MoVQ's decoder).
    #[serde(default = "default_shift")]
    pub resnet_time_scale_shift: String,
    /// The resnets' activation (`swish` = `silu`, `mish`, `gelu`).
    #[serde(default = "swish")]
    pub resnet_act_fn: Activation,
    /// GroupNorm groups of the resnets (and transformers); `null`: `min(in_channels // 4, 32)`.
    #[serde(default = "groups_32")]
    pub resnet_groups: Option<usize>,
    /// Groups of the resnets' second norm (`null`: `resnet_groups`).
    #[serde(default)]
    pub resnet_groups_out: Option<usize>,
    /// Always true in diffusers' resnets (kept for the kwargs).
    #[serde(default = "config::yes")]
    pub resnet_pre_norm: bool,
    /// Attention heads of each transformer (head width `in_channels / num_attention_heads`; SD's `attention_head_dim: 8` means 8 heads).
    #[serde(default = "one")]
    pub num_attention_heads: usize,
    /// Each resnet's output is divided by this (`mid_block_scale_factor`).
    #[serde(default = "one_f")]
    pub output_scale_factor: f64,
    /// Width of `encoder_hidden_states` (CLIP ViT-L: 768, SD 2.x: 1024, SDXL: 2048).
    #[serde(default = "cross_1280")]
    pub cross_attention_dim: usize,
    /// Versatile Diffusion's two transformers per layer (`DualTransformer2DModel`).
    #[serde(default)]
    pub dual_cross_attention: bool,
    /// Linear `proj_in`/`proj_out` (SD 2.x, XL) instead of 1×1 convolutions (SD 1.x).
    #[serde(default)]
    pub use_linear_projection: bool,
    /// Attention scores in f32 in half-precision runs (SD 2.1).
    #[serde(default)]
    pub upcast_attention: bool,
    /// `default` only (`gated` adapters are not supported).
    #[serde(default = "default_shift")]
    pub attention_type: String,
    /// Not a constructor argument: with `dual_cross_attention`, the `mix_ratio` attribute of
    /// every `DualTransformer2DModel` (absent: diffusers' 0.5). See [`DualMix`].
    #[serde(default)]
    pub mix_ratio: Option<f64>,
    /// Not a constructor argument: with `dual_cross_attention`, the `condition_lengths` attribute
    /// (absent: `[77, 257]`).
    #[serde(default)]
    pub condition_lengths: Option<[usize; 2]>,
    /// Not a constructor argument: with `dual_cross_attention`, the
    /// `transformer_index_for_condition` attribute (absent: `[1, 0]`).
    #[serde(default)]
    pub transformer_index_for_condition: Option<[usize; 2]>,
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
        let groups = self.resnet_groups.unwrap_or((self.in_channels / 4).min(32));
        config::from_json(
            block,
            &serde_json::json!({
                "num_attention_heads": self.num_attention_heads,
                "attention_head_dim": config::check_divides(block, out, self.num_attention_heads)?,
                "in_channels": out,
                "num_layers": 1,
                "cross_attention_dim": self.cross_attention_dim,
                "norm_num_groups": groups,
                "mix_ratio": mix.mix_ratio,
                "condition_lengths": mix.condition_lengths,
                "transformer_index_for_condition": mix.transformer_index_for_condition,
            }),
        )
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

    /// `UNetMidBlock2DCrossAttn(in_channels, temb_channels)` with diffusers' defaults for the
    /// rest; change fields after (`num_attention_heads`, `cross_attention_dim`, ...).
    pub fn new(in_channels: usize, temb_channels: Option<usize>) -> Self {
        from_required(in_channels, temb_channels)
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
    resnets: Vec<ResnetBlock2D>,
    attentions: Vec<CrossAttention>,
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
        let norm = time_norm(block, &cfg.resnet_time_scale_shift)?;
        let (c, out) = (cfg.in_channels, cfg.out_channels.unwrap_or(cfg.in_channels));
        let groups = cfg.resnet_groups.unwrap_or((c / 4).min(32));
        let groups_out = cfg.resnet_groups_out.unwrap_or(groups);
        let head_dim = config::check_divides(block, out, cfg.num_attention_heads)?;
        let layers = cfg.layers()?;
        let resnet = |in_channels: usize, groups: usize, groups_out: Option<usize>| {
            resnet_config(
                in_channels,
                out,
                groups,
                groups_out,
                cfg.temb_channels,
                cfg.resnet_eps,
                cfg.resnet_act_fn,
                norm,
                cfg.dropout,
                cfg.output_scale_factor,
                cfg.resnet_pre_norm,
            )
        };
        let transformer = |num_layers: usize| -> Result<Transformer2DModelConfig> {
            config::from_json(
                block,
                &serde_json::json!({
                    "num_attention_heads": cfg.num_attention_heads,
                    "attention_head_dim": head_dim,
                    "in_channels": out,
                    "num_layers": num_layers,
                    "cross_attention_dim": cfg.cross_attention_dim,
                    "norm_num_groups": groups_out,
                    "use_linear_projection": cfg.use_linear_projection,
                    "upcast_attention": cfg.upcast_attention,
                    "attention_type": cfg.attention_type,
                }),
            )
        };
        let vb_res = vb.pp("resnets");
        let vb_attn = vb.pp("attentions");
        let mut resnets = vec![ResnetBlock2D::new(vb_res.pp(0), &resnet(c, groups, Some(groups_out)))?];
        let mut attentions = vec![];
        for (i, &n) in layers.iter().take(cfg.num_layers).enumerate() {
            attentions.push(if cfg.dual_cross_attention {
                CrossAttention::Dual(DualTransformer2DModel::new(vb_attn.pp(i), &dual)?)
            } else {
                CrossAttention::Single(Transformer2DModel::new(vb_attn.pp(i), &transformer(n)?)?)
            });
            resnets.push(ResnetBlock2D::new(vb_res.pp(i + 1), &resnet(out, groups_out, None))?);
        }
        let width = cfg.out_channels.unwrap_or(cfg.in_channels);
        let needs_context = (cfg.cross_attention_dim != width).then_some((cfg.cross_attention_dim, width));
        Ok(Self {
            resnets,
            attentions,
            needs_context,
        })
    }

    /// Whether the attentions are `DualTransformer2DModel`s.
    pub fn is_dual(&self) -> bool {
        matches!(self.attentions.first(), Some(CrossAttention::Dual(_)))
    }

    /// Versatile Diffusion's `_convert_to_dual_attention`: each `Transformer2DModel` of this
    /// (image U-Net's, not dual) block becomes a `DualTransformer2DModel` with it as
    /// `transformers.0` and `text[i]` (the text U-Net's mid-block transformer at
    /// `attentions.i`) as `transformers.1`; the transformers keep their own configs, as the
    /// pipeline keeps the modules.
    pub fn into_dual(self, text: Vec<Transformer2DModel>, mix: DualMix) -> Result<Self> {
        if text.len() != self.attentions.len() || self.is_dual() {
            return Err(Error::config(
                Self::BLOCK,
                format!(
                    "into_dual takes a block without dual_cross_attention and one text transformer per \
                     attention ({} given for {})",
                    text.len(),
                    self.attentions.len()
                ),
            ));
        }
        let mut attentions = Vec::with_capacity(text.len());
        for (a, t) in self.attentions.into_iter().zip(text) {
            let CrossAttention::Single(image) = a else {
                unreachable!("checked: not dual")
            };
            attentions.push(CrossAttention::Dual(DualTransformer2DModel::from_transformers(
                [image, t],
                mix,
            )?));
        }
        Ok(Self {
            resnets: self.resnets,
            attentions,
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
        for a in &mut self.attentions {
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
        let mut h = trace::scope("resnets.0", || self.resnets[0].forward(hidden_states, temb))?;
        for (i, (attn, resnet)) in self.attentions.iter().zip(&self.resnets[1..]).enumerate() {
            h = trace::scope_at("attentions", i, || match attn {
                CrossAttention::Single(t) => {
                    t.forward(&h, encoder_hidden_states, attention_mask, encoder_attention_mask)
                }
                CrossAttention::Dual(d) => {
                    let context = dual_inputs(Self::BLOCK, encoder_hidden_states, encoder_attention_mask)?;
                    d.forward(&h, context, attention_mask)
                }
            })?;
            h = trace::scope_at("resnets", i + 1, || resnet.forward(&h, temb))?;
        }
        trace::record("output", &h);
        Ok(h)
    }
}

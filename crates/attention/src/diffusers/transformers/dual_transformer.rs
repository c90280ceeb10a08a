//! Versatile Diffusion's dual transformer, diffusers 0.42.1
//! `models/transformers/dual_transformer_2d.py` `DualTransformer2DModel`: two
//! [`Transformer2DModel`]s (`transformers.0`, `transformers.1`, built with the same kwargs) run on
//! the same input, each on its own slice of the context, their residual updates mixed:
//!
//! ```text
//! for i in 0, 1:  condition = encoder_hidden_states[:, start_i : start_i + condition_lengths[i]]
//!                 encoded_i = transformers[transformer_index_for_condition[i]](x, condition) - x
//! output = encoded_0 * mix_ratio + encoded_1 * (1 - mix_ratio) + x
//! ```
//!
//! `mix_ratio` (0.5), `condition_lengths` ([77, 257]) and `transformer_index_for_condition`
//! ([1, 0]) are not constructor arguments: they are attributes Versatile Diffusion's pipelines set
//! on every `DualTransformer2DModel` of the U-Net before running it
//! (`VersatileDiffusionDualGuidedPipeline.set_transformer_params(mix_ratio, condition_types)`:
//! `mix_ratio = text_to_image_strength`, a `"text"` condition 77 tokens for `transformers.1`, an
//! `"image"` one 257 tokens for `transformers.0`). Here they are [`DualMix`], taken from optional
//! extra config keys (diffusers' defaults when absent) or set on the built block.
//!
//! What the forward does with its other arguments, as diffusers does: `attention_mask` is ignored
//! ("not used yet": neither transformer gets it), the slices are Python slices (clamped to the
//! context: a context shorter than the two lengths gives a shorter or empty second slice, tokens
//! past them are ignored; an empty slice, on which PyTorch would attend to no keys, is an error
//! here), `return_dict` only changes the Python return type.

use crate::config::defaults;
use crate::diffusers::feed_forward::ActivationFn;
use crate::diffusers::transformers::transformer::{Transformer2DModel, Transformer2DModelConfig};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// The attributes a pipeline sets on a `DualTransformer2DModel` (not constructor arguments);
/// [`Default`] is what the constructor leaves: `0.5`, `[77, 257]`, `[1, 0]`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DualMix {
    /// The weight of the first condition's update (`1 - mix_ratio` for the second's);
    /// Versatile Diffusion's `text_to_image_strength`.
    #[serde(default = "defaults::half")]
    pub mix_ratio: f64,
    /// Token counts of the two conditions, in the order they are concatenated in
    /// `encoder_hidden_states` (Versatile Diffusion: text 77, image 257).
    #[serde(default = "defaults::pair::<77, 257>")]
    pub condition_lengths: [usize; 2],
    /// Which transformer (0 or 1) encodes each condition (`[1, 0]`: `transformers.1` the first
    /// condition, `transformers.0` the second).
    #[serde(default = "defaults::pair::<1, 0>")]
    pub transformer_index_for_condition: [usize; 2],
}

impl Default for DualMix {
    fn default() -> Self {
        Self {
            mix_ratio: defaults::half(),
            condition_lengths: defaults::pair::<77, 257>(),
            transformer_index_for_condition: defaults::pair::<1, 0>(),
        }
    }
}

impl DualMix {
    /// Indices must name one of the two transformers (Python would also take -1 and -2; give
    /// 1 and 0 instead), `mix_ratio` must be finite.
    pub fn check(&self, block: &'static str) -> Result<()> {
        if let Some(i) = self.transformer_index_for_condition.iter().find(|&&i| i > 1) {
            return Err(Error::config(
                block,
                format!("transformer_index_for_condition entry {i}: there are two transformers (0 and 1)"),
            ));
        }
        if !self.mix_ratio.is_finite() {
            return Err(Error::config(
                block,
                format!("mix_ratio {} is not finite", self.mix_ratio),
            ));
        }
        Ok(())
    }
}

/// Keyword arguments of `DualTransformer2DModel.__init__` (0.42.1: `num_attention_heads=16,
/// attention_head_dim=88, in_channels=None, num_layers=1, dropout=0.0, norm_num_groups=32,
/// cross_attention_dim=None, attention_bias=False, sample_size=None, num_vector_embeds=None,
/// activation_fn="geglu", num_embeds_ada_norm=None`), passed as they are to both
/// `Transformer2DModel`s, plus the [`DualMix`] attributes as optional extra keys (`mix_ratio`,
/// `condition_lengths`, `transformer_index_for_condition`; diffusers' defaults when absent).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DualTransformer2DModelConfig {
    #[serde(default = "defaults::usize::<16>")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::usize::<88>")]
    pub attention_head_dim: usize,
    #[serde(default)]
    pub in_channels: Option<usize>,
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
    #[serde(default)]
    pub sample_size: Option<usize>,
    #[serde(default)]
    pub num_vector_embeds: Option<usize>,
    #[serde(default)]
    pub activation_fn: ActivationFn,
    #[serde(default)]
    pub num_embeds_ada_norm: Option<usize>,
    /// Not a constructor argument: the attribute (see [`DualMix::mix_ratio`]).
    #[serde(default = "defaults::half")]
    pub mix_ratio: f64,
    /// Not a constructor argument: the attribute (see [`DualMix::condition_lengths`]).
    #[serde(default = "defaults::pair::<77, 257>")]
    pub condition_lengths: [usize; 2],
    /// Not a constructor argument: the attribute (see
    /// [`DualMix::transformer_index_for_condition`]).
    #[serde(default = "defaults::pair::<1, 0>")]
    pub transformer_index_for_condition: [usize; 2],
}

impl Default for DualTransformer2DModelConfig {
    /// `DualTransformer2DModel()`: every argument at its diffusers default, the [`DualMix`]
    /// attributes at theirs.
    fn default() -> Self {
        let mix = DualMix::default();
        Self {
            num_attention_heads: defaults::usize::<16>(),
            attention_head_dim: defaults::usize::<88>(),
            in_channels: None,
            num_layers: defaults::usize::<1>(),
            dropout: 0.0,
            norm_num_groups: defaults::usize::<32>(),
            cross_attention_dim: None,
            attention_bias: false,
            sample_size: None,
            num_vector_embeds: None,
            activation_fn: ActivationFn::default(),
            num_embeds_ada_norm: None,
            mix_ratio: mix.mix_ratio,
            condition_lengths: mix.condition_lengths,
            transformer_index_for_condition: mix.transformer_index_for_condition,
        }
    }
}

impl DualTransformer2DModelConfig {
    /// The attributes the config sets.
    pub fn mix(&self) -> DualMix {
        DualMix {
            mix_ratio: self.mix_ratio,
            condition_lengths: self.condition_lengths,
            transformer_index_for_condition: self.transformer_index_for_condition,
        }
    }

    /// The `Transformer2DModel(...)` both transformers are built with.
    pub fn transformer(&self) -> Transformer2DModelConfig {
        Transformer2DModelConfig {
            num_attention_heads: self.num_attention_heads,
            attention_head_dim: self.attention_head_dim,
            in_channels: self.in_channels,
            num_layers: self.num_layers,
            dropout: self.dropout,
            norm_num_groups: self.norm_num_groups,
            cross_attention_dim: self.cross_attention_dim,
            attention_bias: self.attention_bias,
            sample_size: self.sample_size,
            num_vector_embeds: self.num_vector_embeds,
            activation_fn: self.activation_fn,
            num_embeds_ada_norm: self.num_embeds_ada_norm,
            ..Transformer2DModelConfig::default()
        }
    }
}

/// `diffusers.models.transformers.dual_transformer_2d.DualTransformer2DModel` (continuous input).
#[derive(Debug, Clone)]
pub struct DualTransformer2DModel {
    transformers: [Transformer2DModel; 2],
    mix: DualMix,
}

impl DualTransformer2DModel {
    pub const BLOCK: &'static str = "diffusers.DualTransformer2DModel";

    /// Both transformers from `vb.pp("transformers").pp(0 / 1)`.
    pub fn new(vb: VarBuilder, cfg: &DualTransformer2DModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let t = cfg.transformer();
        let vb = vb.pp("transformers");
        let transformers = [
            Transformer2DModel::new(vb.pp(0), &t)?,
            Transformer2DModel::new(vb.pp(1), &t)?,
        ];
        Self::from_transformers(transformers, cfg.mix())
    }

    /// Two transformers built elsewhere, as Versatile Diffusion's `_convert_to_dual_attention`
    /// pairs them: `[image_unet's, text_unet's]` (the `Transformer2DModel` at the same place in
    /// each U-Net).
    pub fn from_transformers(transformers: [Transformer2DModel; 2], mix: DualMix) -> Result<Self> {
        mix.check(Self::BLOCK)?;
        Ok(Self { transformers, mix })
    }

    pub fn mix(&self) -> DualMix {
        self.mix
    }

    /// Set the attributes, as a pipeline's `set_transformer_params` does.
    pub fn set_mix(&mut self, mix: DualMix) -> Result<()> {
        mix.check(Self::BLOCK)?;
        self.mix = mix;
        Ok(())
    }

    /// `forward(hidden_states, encoder_hidden_states, timestep=None, attention_mask=None,
    /// cross_attention_kwargs=None, return_dict=True)` on `(B, C, H, W)` and a context `(B, S, D)`
    /// holding both conditions; `attention_mask` is ignored, as diffusers ignores it. Stages
    /// `transformers.<i>/...` in the order the transformers run.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: &Tensor,
        _attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::input(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        let block = Self::BLOCK;
        if encoder_hidden_states.rank() != 3 {
            return Err(Error::input(
                block,
                "encoder_hidden_states",
                format!("expected (B, S, D), found {:?}", encoder_hidden_states.dims()),
            ));
        }
        let tokens = encoder_hidden_states.dim(1)?;
        let mut encoded = Vec::with_capacity(2);
        let mut start = 0usize;
        for i in 0..2 {
            // Python's slice [start : start + len], clamped to the context
            let (from, to) = (start.min(tokens), (start + self.mix.condition_lengths[i]).min(tokens));
            if from == to {
                return Err(Error::input(
                    block,
                    "encoder_hidden_states",
                    format!(
                        "{tokens} tokens leave condition {i} (tokens {start}..{}) empty; condition_lengths {:?}",
                        start + self.mix.condition_lengths[i],
                        self.mix.condition_lengths
                    ),
                ));
            }
            let condition = encoder_hidden_states.narrow(1, from, to - from)?;
            let index = self.mix.transformer_index_for_condition[i];
            let out = trace::scope_at("transformers", index, || {
                self.transformers[index].forward(hidden_states, Some(&condition), None, None)
            })?;
            encoded.push((out - hidden_states)?);
            start += self.mix.condition_lengths[i];
        }
        let m = self.mix.mix_ratio;
        let mixed = (crate::ops::mul(&encoded[0], m)? + crate::ops::mul(&encoded[1], 1.0 - m)?)?;
        let out = crate::ops::add(&mixed, hidden_states)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// The context a parent block's `DualTransformer2DModel` attention needs, and no encoder mask
/// (`DualTransformer2DModel.forward` has no such parameter).
pub(crate) fn dual_inputs<'a>(
    block: &'static str,
    context: Option<&'a Tensor>,
    encoder_attention_mask: Option<&Tensor>,
) -> Result<&'a Tensor> {
    if encoder_attention_mask.is_some() {
        return Err(Error::input(
            block,
            "encoder_attention_mask",
            "DualTransformer2DModel.forward takes no encoder_attention_mask (diffusers 0.42.1 raises TypeError)",
        ));
    }
    context.ok_or_else(|| {
        Error::input(
            block,
            "encoder_hidden_states",
            "dual_cross_attention needs encoder_hidden_states (both conditions, concatenated)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use crate::diffusers::UNetMidBlock2DCrossAttnConfig;
    use serde_json::json;

    #[test]
    fn attributes_default_as_diffusers_and_are_checked() {
        let cfg: DualTransformer2DModelConfig = from_json(DualTransformer2DModel::BLOCK, &json!({})).unwrap();
        assert_eq!(cfg.mix(), DualMix::default());
        assert_eq!(
            (cfg.num_attention_heads, cfg.attention_head_dim, cfg.norm_num_groups),
            (16, 88, 32)
        );
        let t = cfg.transformer();
        assert_eq!(t.activation_fn, ActivationFn::Geglu);
        assert!(!t.use_linear_projection);
        let mix = DualMix {
            transformer_index_for_condition: [1, 2],
            ..DualMix::default()
        };
        assert!(mix.check(DualTransformer2DModel::BLOCK).is_err());
        let e = from_json::<DualTransformer2DModelConfig>(DualTransformer2DModel::BLOCK, &json!({"bogus": 1}));
        assert!(e.is_err());
    }

    #[test]
    fn mid_block_attributes_need_dual_cross_attention() {
        let mut cfg = UNetMidBlock2DCrossAttnConfig::new(16, Some(32));
        cfg.mix_ratio = Some(0.25);
        let e = cfg.dual_mix().unwrap_err().to_string();
        assert!(e.contains("dual_cross_attention"), "{e}");
        cfg.dual_cross_attention = true;
        let mix = cfg.dual_mix().unwrap();
        assert_eq!(mix.mix_ratio, 0.25);
        assert_eq!(mix.condition_lengths, [77, 257]);
        // DualTransformer2DModel(..., num_layers=1, norm_num_groups=resnet_groups), whatever
        // transformer_layers_per_block, use_linear_projection and resnet_groups_out say.
        (cfg.num_attention_heads, cfg.resnet_groups, cfg.resnet_groups_out) = (2, Some(4), Some(8));
        cfg.use_linear_projection = true;
        cfg.transformer_layers_per_block = crate::diffusers::unets::mid_block::LayersPerBlock::One(3);
        let d = cfg.dual_transformer().unwrap();
        assert_eq!((d.num_layers, d.norm_num_groups, d.attention_head_dim), (1, 4, 8));
        assert!(!d.transformer().use_linear_projection);
    }
}

//! diffusers 0.42.1 `Transformer2DModel` (`models/transformers/transformer_2d.py`) built from its
//! own keyword arguments ([`Transformer2DModelConfig`]): the continuous-input, layer-norm
//! configuration of the U-Net bottleneck, run by the shared [`super::SpatialTransformer`].

use super::{AttentionType, BasicTransformerBlockConfig, SpatialTransformer};
use crate::config::defaults;
use crate::diffusers::feed_forward::ActivationFn;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `Transformer2DModel.__init__` (0.42.1). Only the continuous-input,
/// layer-norm configuration (the U-Net bottleneck) is implemented; the others are rejected.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Transformer2DModelConfig {
    #[serde(default = "defaults::usize::<16>")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::usize::<88>")]
    pub attention_head_dim: usize,
    #[serde(default)]
    pub in_channels: Option<usize>,
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
    /// Only used by discrete and patched inputs.
    #[serde(default)]
    pub sample_size: Option<usize>,
    #[serde(default)]
    pub num_vector_embeds: Option<usize>,
    #[serde(default)]
    pub patch_size: Option<usize>,
    #[serde(default)]
    pub activation_fn: ActivationFn,
    #[serde(default)]
    pub num_embeds_ada_norm: Option<usize>,
    #[serde(default)]
    pub use_linear_projection: bool,
    #[serde(default)]
    pub only_cross_attention: bool,
    #[serde(default)]
    pub double_self_attention: bool,
    #[serde(default)]
    pub upcast_attention: bool,
    #[serde(default = "defaults::layer_norm")]
    pub norm_type: String,
    #[serde(default = "defaults::yes")]
    pub norm_elementwise_affine: bool,
    #[serde(default = "defaults::eps_1e5")]
    pub norm_eps: f64,
    #[serde(default)]
    pub attention_type: AttentionType,
    /// Only used by patched inputs.
    #[serde(default)]
    pub caption_channels: Option<usize>,
    /// Only used by patched inputs.
    #[serde(default)]
    pub interpolation_scale: Option<f64>,
    /// Only used by `ada_norm_single`.
    #[serde(default)]
    pub use_additional_conditions: Option<bool>,
}

impl Default for Transformer2DModelConfig {
    /// `Transformer2DModel()`: every argument at its diffusers default (16 heads of 88, one
    /// layer, 32 groups, `geglu`, `layer_norm` with eps 1e-5); set `in_channels` for the
    /// continuous input the block takes.
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
            num_vector_embeds: None,
            patch_size: None,
            activation_fn: ActivationFn::default(),
            num_embeds_ada_norm: None,
            use_linear_projection: false,
            only_cross_attention: false,
            double_self_attention: false,
            upcast_attention: false,
            norm_type: defaults::layer_norm(),
            norm_elementwise_affine: defaults::yes(),
            norm_eps: defaults::eps_1e5(),
            attention_type: AttentionType::default(),
            caption_channels: None,
            interpolation_scale: None,
            use_additional_conditions: None,
        }
    }
}

/// `diffusers.models.transformers.transformer_2d.Transformer2DModel` on continuous input.
#[derive(Debug, Clone)]
pub struct Transformer2DModel(SpatialTransformer);

impl Transformer2DModel {
    pub const BLOCK: &'static str = "diffusers.Transformer2DModel";

    pub fn new(vb: VarBuilder, cfg: &Transformer2DModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let in_channels = match (cfg.in_channels, cfg.num_vector_embeds, cfg.patch_size) {
            (Some(c), None, None) => c,
            _ => {
                return Err(Error::unsupported(
                    block,
                    "only continuous input (in_channels set, no num_vector_embeds or patch_size) is implemented",
                ))
            }
        };
        let block_cfg = BasicTransformerBlockConfig {
            dim: cfg.num_attention_heads * cfg.attention_head_dim,
            num_attention_heads: cfg.num_attention_heads,
            attention_head_dim: cfg.attention_head_dim,
            dropout: cfg.dropout,
            cross_attention_dim: cfg.cross_attention_dim,
            activation_fn: cfg.activation_fn,
            num_embeds_ada_norm: cfg.num_embeds_ada_norm,
            attention_bias: cfg.attention_bias,
            only_cross_attention: cfg.only_cross_attention,
            double_self_attention: cfg.double_self_attention,
            upcast_attention: cfg.upcast_attention,
            norm_elementwise_affine: cfg.norm_elementwise_affine,
            norm_type: cfg.norm_type.clone(),
            norm_eps: cfg.norm_eps,
            final_dropout: false,
            attention_type: cfg.attention_type,
            positional_embeddings: None,
            num_positional_embeddings: None,
            ada_norm_continous_conditioning_embedding_dim: None,
            ada_norm_bias: None,
            ff_inner_dim: None,
            ff_bias: true,
            attention_out_bias: true,
        };
        let spec = block_cfg.spec(block)?;
        let specs = vec![spec; cfg.num_layers];
        let out_channels = cfg.out_channels.unwrap_or(in_channels);
        Ok(Self(
            SpatialTransformer::load(
                vb,
                block,
                cfg.norm_num_groups,
                in_channels,
                out_channels,
                cfg.use_linear_projection,
                &specs,
            )?
            .with_strided_linear_input(),
        ))
    }

    /// `forward(hidden_states, encoder_hidden_states=None, attention_mask=None,
    /// encoder_attention_mask=None)` on `(B, C, H, W)`. 2-D masks `(B, S)` (1 = keep,
    /// 0 = discard) become the bias `(1 − mask)·−10000`, as diffusers does; others pass as they are.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", encoder_attention_mask)?;
        if hidden_states.rank() != 4 {
            return Err(Error::input(
                Self::BLOCK,
                "hidden_states",
                format!("expected (B, C, H, W), found {:?}", hidden_states.dims()),
            ));
        }
        let dtype = hidden_states.dtype();
        let as_bias = |m: Option<&Tensor>| -> Result<Option<Tensor>> {
            match m {
                Some(m) if m.rank() == 2 => Ok(Some(
                    crate::ops::mul(&(1.0 - m.to_dtype(dtype)?)?, -10000.0)?.unsqueeze(1)?,
                )),
                Some(m) => Ok(Some(m.clone())),
                None => Ok(None),
            }
        };
        let attention_mask = as_bias(attention_mask)?;
        let encoder_attention_mask = as_bias(encoder_attention_mask)?;
        self.0.forward(
            hidden_states,
            encoder_hidden_states,
            attention_mask.as_ref(),
            encoder_attention_mask.as_ref(),
        )
    }
}

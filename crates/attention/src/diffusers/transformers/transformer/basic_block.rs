//! diffusers 0.42.1 `BasicTransformerBlock` (`models/attention.py`) built from its own keyword
//! arguments ([`BasicTransformerBlockConfig`]): the `norm_type="layer_norm"`,
//! `attention_type="default"` path, run by the shared [`super::TransformerBlock`].

use super::{AttentionSource, TransformerBlock, TransformerBlockSpec};
use crate::config::defaults;
use crate::diffusers::embeddings::sinusoidal_length;
use crate::diffusers::feed_forward::{ActivationFn, FeedForwardConfig};
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `BasicTransformerBlock.__init__` (0.42.1).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicTransformerBlockConfig {
    pub dim: usize,
    pub num_attention_heads: usize,
    pub attention_head_dim: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub cross_attention_dim: Option<usize>,
    #[serde(default)]
    pub activation_fn: ActivationFn,
    #[serde(default)]
    pub num_embeds_ada_norm: Option<usize>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub only_cross_attention: bool,
    #[serde(default)]
    pub double_self_attention: bool,
    #[serde(default)]
    pub upcast_attention: bool,
    #[serde(default = "defaults::yes")]
    pub norm_elementwise_affine: bool,
    #[serde(default = "defaults::layer_norm")]
    pub norm_type: String,
    #[serde(default = "defaults::eps_1e5")]
    pub norm_eps: f64,
    #[serde(default)]
    pub final_dropout: bool,
    #[serde(default)]
    pub attention_type: AttentionType,
    #[serde(default)]
    pub positional_embeddings: Option<String>,
    #[serde(default)]
    pub num_positional_embeddings: Option<usize>,
    #[serde(default)]
    pub ada_norm_continous_conditioning_embedding_dim: Option<usize>,
    #[serde(default)]
    pub ada_norm_bias: Option<usize>,
    #[serde(default)]
    pub ff_inner_dim: Option<usize>,
    #[serde(default = "defaults::yes")]
    pub ff_bias: bool,
    #[serde(default = "defaults::yes")]
    pub attention_out_bias: bool,
}

/// `attention_type` of diffusers' transformers. Only `"default"` is ported; the GLIGEN
/// variants deserialize (diffusers has them) and the constructors refuse them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum AttentionType {
    /// Self- and cross-attention only.
    #[default]
    Default,
    /// GLIGEN's gated self-attention (`GatedSelfAttentionDense`): not ported.
    Gated,
    /// GLIGEN's text-image variant: not ported.
    #[serde(rename = "gated-text-image")]
    GatedTextImage,
}

impl AttentionType {
    /// The name diffusers uses.
    pub fn as_str(self) -> &'static str {
        match self {
            AttentionType::Default => "default",
            AttentionType::Gated => "gated",
            AttentionType::GatedTextImage => "gated-text-image",
        }
    }
}

impl TryFrom<String> for AttentionType {
    type Error = String;

    fn try_from(name: String) -> std::result::Result<Self, String> {
        let all = [
            AttentionType::Default,
            AttentionType::Gated,
            AttentionType::GatedTextImage,
        ];
        all.into_iter().find(|a| a.as_str() == name).ok_or_else(|| {
            format!("unknown attention_type {name:?}; diffusers has \"default\", \"gated\" and \"gated-text-image\"")
        })
    }
}

/// Reject the options that switch to code paths not ported (AdaLayerNorm variants, GLIGEN,
/// positional embeddings).
fn check_layer_norm_path(
    block: &'static str,
    norm_type: &str,
    ada: Option<usize>,
    attention_type: AttentionType,
) -> Result<()> {
    if norm_type != "layer_norm" || ada.is_some() {
        return Err(Error::unsupported(
            block,
            format!("norm_type {norm_type:?} (with num_embeds_ada_norm {ada:?}): only \"layer_norm\" is implemented"),
        ));
    }
    if attention_type != AttentionType::Default {
        let name = attention_type.as_str();
        return Err(Error::unsupported(
            block,
            format!("attention_type {name:?}: only \"default\""),
        ));
    }
    Ok(())
}

impl BasicTransformerBlockConfig {
    /// `BasicTransformerBlock(dim, num_attention_heads, attention_head_dim)` with every other
    /// argument at its diffusers default.
    pub fn new(dim: usize, num_attention_heads: usize, attention_head_dim: usize) -> Self {
        Self {
            dim,
            num_attention_heads,
            attention_head_dim,
            dropout: 0.0,
            cross_attention_dim: None,
            activation_fn: ActivationFn::default(),
            num_embeds_ada_norm: None,
            attention_bias: false,
            only_cross_attention: false,
            double_self_attention: false,
            upcast_attention: false,
            norm_elementwise_affine: defaults::yes(),
            norm_type: defaults::layer_norm(),
            norm_eps: defaults::eps_1e5(),
            final_dropout: false,
            attention_type: AttentionType::default(),
            positional_embeddings: None,
            num_positional_embeddings: None,
            ada_norm_continous_conditioning_embedding_dim: None,
            ada_norm_bias: None,
            ff_inner_dim: None,
            ff_bias: defaults::yes(),
            attention_out_bias: defaults::yes(),
        }
    }

    /// The shared block description.
    pub fn spec(&self, block: &'static str) -> Result<TransformerBlockSpec> {
        check_layer_norm_path(block, &self.norm_type, self.num_embeds_ada_norm, self.attention_type)?;
        let pos_embed = sinusoidal_length(block, &self.positional_embeddings, self.num_positional_embeddings)?;
        let cross = self.cross_attention_dim;
        let attn1 = match (self.only_cross_attention, cross) {
            (true, Some(d)) => AttentionSource::Context(d),
            _ => AttentionSource::SelfTokens,
        };
        let attn2 = match (cross, self.double_self_attention) {
            (_, true) => Some(AttentionSource::SelfTokens),
            (Some(d), false) => Some(AttentionSource::Context(d)),
            (None, false) => None,
        };
        let mut ff = FeedForwardConfig::new(self.dim);
        ff.activation_fn = self.activation_fn;
        ff.inner_dim = self.ff_inner_dim;
        ff.bias = self.ff_bias;
        Ok(TransformerBlockSpec {
            dim: self.dim,
            heads: self.num_attention_heads,
            head_dim: self.attention_head_dim,
            attn1,
            attn2,
            attention_bias: self.attention_bias,
            attention_out_bias: self.attention_out_bias,
            upcast_attention: self.upcast_attention,
            processor: None,
            norm_eps: self.norm_eps,
            norm_elementwise_affine: self.norm_elementwise_affine,
            ff,
            ff_project_in_key: "net.0.proj",
            pos_embed,
        })
    }
}

/// `diffusers.models.attention.BasicTransformerBlock` (layer-norm path).
#[derive(Debug, Clone)]
pub struct BasicTransformerBlock(TransformerBlock);

impl BasicTransformerBlock {
    pub const BLOCK: &'static str = "diffusers.BasicTransformerBlock";

    pub fn new(vb: VarBuilder, cfg: &BasicTransformerBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Ok(Self(TransformerBlock::load(vb, Self::BLOCK, &cfg.spec(Self::BLOCK)?)?))
    }

    /// `forward(hidden_states, attention_mask=None, encoder_hidden_states=None,
    /// encoder_attention_mask=None)`; masks additive, as the processors take them.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        attention_mask: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", encoder_attention_mask)?;
        if hidden_states.rank() != 3 {
            return Err(Error::input(
                Self::BLOCK,
                "hidden_states",
                format!("expected (B, N, dim), found {:?}", hidden_states.dims()),
            ));
        }
        self.0.forward(
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            encoder_attention_mask,
        )
    }
}

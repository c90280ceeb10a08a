//! The Stable Diffusion transformer bottleneck, diffusers 0.42.1: `BasicTransformerBlock`
//! (`models/attention.py`, the `norm_type="layer_norm"` path) and `Transformer2DModel`
//! (`models/transformers/transformer_2d.py`, continuous input).
//!
//! [`TransformerBlock`] and [`SpatialTransformer`] are shared with the CompVis/Stability ldm
//! classes (`BasicTransformerBlock`, `SpatialTransformer`), which have the same state-dict names
//! and differ only in how they are configured (see [`crate::ldm::transformer`]).

use crate::diffusers::attention::{Attention, AttentionConfig, Processor};
use crate::diffusers::embeddings::{sinusoidal_length, SinusoidalPositionalEmbedding};
use crate::diffusers::feed_forward::{ActivationFn, FeedForward, FeedForwardConfig};
use crate::heads::{image_to_tokens, tokens_to_image};
use crate::layers::{group_norm, LayerNorm, Projection};
use crate::trace;
use crate::{config, Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Where a transformer block's attention layers take their keys and values from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionSource {
    /// Self-attention over the block's own tokens.
    SelfTokens,
    /// Cross-attention over a context of this width.
    Context(usize),
}

/// Everything that shapes a transformer block, whichever codebase configured it.
#[derive(Debug, Clone)]
pub struct TransformerBlockSpec {
    pub dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// `attn1`: self-attention, or cross-attention (diffusers `only_cross_attention`, ldm
    /// `disable_self_attn`).
    pub attn1: AttentionSource,
    /// `norm2`/`attn2`, absent when diffusers has neither `cross_attention_dim` nor
    /// `double_self_attention`.
    pub attn2: Option<AttentionSource>,
    pub attention_bias: bool,
    pub attention_out_bias: bool,
    pub upcast_attention: bool,
    /// The attention processor: `None` for diffusers' default (`AttnProcessor2_0`), ldm's
    /// `CrossAttention` arithmetic ([`Processor::Ldm`]) for the ldm blocks.
    pub processor: Option<Processor>,
    pub norm_eps: f64,
    pub norm_elementwise_affine: bool,
    pub ff: FeedForwardConfig,
    /// Key of the feed-forward's input projection (`net.0.proj`, or ldm's `net.0.0`).
    pub ff_project_in_key: &'static str,
    /// diffusers `positional_embeddings="sinusoidal"`: the `pos_embed.pe` table's length
    /// (`num_positional_embeddings`), added after `norm1` and `norm2`.
    pub pos_embed: Option<usize>,
}

/// `norm1 → attn1 → + x`, `norm2 → attn2 → + x`, `norm3 → ff → + x`.
#[derive(Debug, Clone)]
pub struct TransformerBlock {
    norm1: LayerNorm,
    attn1: Attention,
    attn1_cross: bool,
    attn2: Option<(LayerNorm, Attention)>,
    norm3: LayerNorm,
    ff: FeedForward,
    pos_embed: Option<SinusoidalPositionalEmbedding>,
}

fn attention(
    vb: VarBuilder,
    block: &'static str,
    spec: &TransformerBlockSpec,
    source: AttentionSource,
) -> Result<Attention> {
    // Attention(query_dim=dim, cross_attention_dim=..., heads, dim_head, dropout, bias=attention_bias,
    //           upcast_attention, out_bias=attention_out_bias)
    let cross = match source {
        AttentionSource::SelfTokens => serde_json::Value::Null,
        AttentionSource::Context(d) => d.into(),
    };
    let mut cfg: AttentionConfig = config::from_json(
        block,
        &serde_json::json!({
            "query_dim": spec.dim,
            "cross_attention_dim": cross,
            "heads": spec.heads,
            "dim_head": spec.head_dim,
            "bias": spec.attention_bias,
            "upcast_attention": spec.upcast_attention,
            "out_bias": spec.attention_out_bias,
        }),
    )?;
    cfg.processor = spec.processor;
    Attention::new(vb, &cfg)
}

impl TransformerBlock {
    pub fn load(vb: VarBuilder, block: &'static str, spec: &TransformerBlockSpec) -> Result<Self> {
        let norm = |name: &str| LayerNorm::load(vb.pp(name), spec.dim, spec.norm_eps, spec.norm_elementwise_affine);
        let attn2 = match spec.attn2 {
            Some(source) => Some((norm("norm2")?, attention(vb.pp("attn2"), block, spec, source)?)),
            None => None,
        };
        let pos_embed = SinusoidalPositionalEmbedding::load_for(vb.pp("pos_embed"), block, spec.dim, spec.pos_embed)?;
        Ok(Self {
            norm1: norm("norm1")?,
            attn1: attention(vb.pp("attn1"), block, spec, spec.attn1)?,
            attn1_cross: spec.attn1 != AttentionSource::SelfTokens,
            attn2,
            norm3: norm("norm3")?,
            ff: FeedForward::load(vb.pp("ff"), block, &spec.ff, spec.ff_project_in_key)?,
            pos_embed,
        })
    }

    /// `hidden_states` `(B, N, dim)`; `context` `(B, S, cross_dim)` for the cross-attention
    /// layers; the masks are additive (see [`Attention::forward`]).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        context: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input("diffusers.BasicTransformerBlock", "hidden_states", hidden_states, &[])?;
        crate::validate::optional("diffusers.BasicTransformerBlock", "context", context, &[])?;
        crate::validate::optional_shape("diffusers.BasicTransformerBlock", "attention_mask", attention_mask)?;
        crate::validate::optional_shape(
            "diffusers.BasicTransformerBlock",
            "encoder_attention_mask",
            encoder_attention_mask,
        )?;
        let out = self.forward_unrecorded(hidden_states, context, attention_mask, encoder_attention_mask)?;
        trace::record("output", &out);
        Ok(out)
    }

    /// [`Self::forward`] without recording its `output` stage (for a caller whose block output
    /// is this one's in another layout: `TemporalBasicTransformerBlock`).
    pub(crate) fn forward_unrecorded(
        &self,
        hidden_states: &Tensor,
        context: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let attn1_context = if self.attn1_cross { context } else { None };
        let normed = self.norm1.forward(hidden_states)?;
        trace::record("norm1", &normed);
        let normed = SinusoidalPositionalEmbedding::add(self.pos_embed.as_ref(), normed)?;
        let attn = trace::scope("attn1", || self.attn1.forward(&normed, attn1_context, attention_mask))?;
        let mut h = (attn + hidden_states)?;
        if let Some((norm2, attn2)) = &self.attn2 {
            let normed = norm2.forward(&h)?;
            trace::record("norm2", &normed);
            let normed = SinusoidalPositionalEmbedding::add(self.pos_embed.as_ref(), normed)?;
            let attn = trace::scope("attn2", || attn2.forward(&normed, context, encoder_attention_mask))?;
            h = (attn + h)?;
        }
        let normed = self.norm3.forward(&h)?;
        trace::record("norm3", &normed);
        Ok((trace::scope("ff", || self.ff.forward(&normed))? + h)?)
    }
}

/// GroupNorm → `proj_in` → tokens → transformer blocks → image → `proj_out` → `+ x`, with the
/// projections as 1×1 convs or (`linear`) as linears on the tokens.
#[derive(Debug, Clone)]
pub struct SpatialTransformer {
    norm: crate::layers::GroupNorm,
    proj_in: Projection,
    blocks: Vec<TransformerBlock>,
    proj_out: Projection,
    linear: bool,
    /// The linear `proj_in` reads a strided view (diffusers' `permute(0, 2, 3, 1).reshape(..)`;
    /// ldm makes it `.contiguous()`): in f16/bf16 PyTorch's `F.linear` then rounds the product
    /// and the bias sum separately.
    strided_linear_input: bool,
}

impl SpatialTransformer {
    /// `norm` is `GroupNorm(groups, in_channels, eps=1e-6)`; `proj_out` maps `inner` to
    /// `out_channels` (ldm SD2's swapped `Linear(in_channels, inner_dim)` has the same weight
    /// shape when `in_channels == inner`, the only case it runs in).
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        vb: VarBuilder,
        block: &'static str,
        groups: usize,
        in_channels: usize,
        out_channels: usize,
        linear: bool,
        specs: &[TransformerBlockSpec],
    ) -> Result<Self> {
        let inner = specs.first().map(|s| s.dim).unwrap_or(in_channels);
        let blocks = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| TransformerBlock::load(vb.pp("transformer_blocks").pp(i), block, spec))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            norm: group_norm(vb.pp("norm"), block, groups, in_channels, 1e-6)?,
            proj_in: Projection::load(vb.pp("proj_in"), block, in_channels, inner, true)?,
            blocks,
            proj_out: Projection::load(vb.pp("proj_out"), block, inner, out_channels, true)?,
            linear,
            strided_linear_input: false,
        })
    }

    /// Mark the linear `proj_in`'s input as the strided `(B, H·W, C)` view diffusers'
    /// `Transformer2DModel` passes (non-contiguous where `C > 1` and `H·W > 1`).
    pub fn with_strided_linear_input(mut self) -> Self {
        self.strided_linear_input = true;
        self
    }

    /// `x` `(B, C, H, W)` → `(B, out_channels, H, W)`; every block attends to `context`.
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input("diffusers.Transformer2DModel", "x", x, &[])?;
        crate::validate::optional("diffusers.Transformer2DModel", "context", context, &[])?;
        crate::validate::optional_shape("diffusers.Transformer2DModel", "attention_mask", attention_mask)?;
        crate::validate::optional_shape(
            "diffusers.Transformer2DModel",
            "encoder_attention_mask",
            encoder_attention_mask,
        )?;
        let contexts = vec![context; self.blocks.len()];
        self.run(x, &contexts, attention_mask, encoder_attention_mask)
    }

    /// Like [`Self::forward`], with block `i` attending to `contexts[i]`.
    pub fn forward_per_block(
        &self,
        x: &Tensor,
        contexts: &[&Tensor],
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input("diffusers.Transformer2DModel", "x", x, &[])?;
        for t in contexts {
            crate::validate::input("diffusers.Transformer2DModel", "contexts", t, &[])?;
        }
        crate::validate::optional_shape("diffusers.Transformer2DModel", "attention_mask", attention_mask)?;
        crate::validate::optional_shape(
            "diffusers.Transformer2DModel",
            "encoder_attention_mask",
            encoder_attention_mask,
        )?;
        if contexts.len() < self.blocks.len() {
            return Err(Error::input(
                "SpatialTransformer",
                "context",
                format!(
                    "{} contexts for {} transformer blocks",
                    contexts.len(),
                    self.blocks.len()
                ),
            ));
        }
        let contexts: Vec<Option<&Tensor>> = contexts.iter().map(|c| Some(*c)).collect();
        self.run(x, &contexts, attention_mask, encoder_attention_mask)
    }

    fn run(
        &self,
        x: &Tensor,
        contexts: &[Option<&Tensor>],
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (_, c, h, w) = x.dims4()?;
        let normed = self.norm.forward(x)?;
        trace::record("norm", &normed);
        let mut tokens = if self.linear {
            let t = if self.strided_linear_input && c > 1 && h * w > 1 {
                self.proj_in.forward_tokens_strided(&image_to_tokens(&normed)?)?
            } else {
                self.proj_in.forward_tokens(&image_to_tokens(&normed)?)?
            };
            trace::record("proj_in", &t);
            t
        } else {
            let t = self.proj_in.forward_channels(&normed)?;
            trace::record("proj_in", &t);
            image_to_tokens(&t)?
        };
        for (i, (block, context)) in self.blocks.iter().zip(contexts).enumerate() {
            tokens = trace::scope_at("transformer_blocks", i, || {
                block.forward(&tokens, *context, attention_mask, encoder_attention_mask)
            })?;
        }
        let out = if self.linear {
            let t = self.proj_out.forward_tokens(&tokens)?;
            trace::record("proj_out", &t);
            tokens_to_image(&t, h, w)?
        } else {
            let t = self.proj_out.forward_channels(&tokens_to_image(&tokens, h, w)?)?;
            trace::record("proj_out", &t);
            t
        };
        let out = (out + x)?;
        trace::record("output", &out);
        Ok(out)
    }
}

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
    #[serde(default = "geglu")]
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
    #[serde(default = "crate::config::yes")]
    pub norm_elementwise_affine: bool,
    #[serde(default = "layer_norm")]
    pub norm_type: String,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub final_dropout: bool,
    #[serde(default = "default_attention")]
    pub attention_type: String,
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
    #[serde(default = "crate::config::yes")]
    pub ff_bias: bool,
    #[serde(default = "crate::config::yes")]
    pub attention_out_bias: bool,
}

pub(super) fn geglu() -> ActivationFn {
    ActivationFn::Geglu
}
fn layer_norm() -> String {
    "layer_norm".into()
}
fn eps() -> f64 {
    1e-5
}
fn default_attention() -> String {
    "default".into()
}

/// Reject the options that switch to code paths not ported (AdaLayerNorm variants, GLIGEN,
/// positional embeddings).
fn check_layer_norm_path(block: &'static str, norm_type: &str, ada: Option<usize>, attention_type: &str) -> Result<()> {
    if norm_type != "layer_norm" || ada.is_some() {
        return Err(Error::unsupported(
            block,
            format!("norm_type {norm_type:?} (with num_embeds_ada_norm {ada:?}): only \"layer_norm\" is implemented"),
        ));
    }
    if attention_type != "default" {
        return Err(Error::unsupported(
            block,
            format!("attention_type {attention_type:?}: only \"default\""),
        ));
    }
    Ok(())
}

impl BasicTransformerBlockConfig {
    /// The shared block description.
    pub fn spec(&self, block: &'static str) -> Result<TransformerBlockSpec> {
        check_layer_norm_path(block, &self.norm_type, self.num_embeds_ada_norm, &self.attention_type)?;
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

/// Keyword arguments of `Transformer2DModel.__init__` (0.42.1). Only the continuous-input,
/// layer-norm configuration (the U-Net bottleneck) is implemented; the others are rejected.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Transformer2DModelConfig {
    #[serde(default = "sixteen")]
    pub num_attention_heads: usize,
    #[serde(default = "eighty_eight")]
    pub attention_head_dim: usize,
    #[serde(default)]
    pub in_channels: Option<usize>,
    #[serde(default)]
    pub out_channels: Option<usize>,
    #[serde(default = "one")]
    pub num_layers: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "thirty_two")]
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
    #[serde(default = "geglu")]
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
    #[serde(default = "layer_norm")]
    pub norm_type: String,
    #[serde(default = "crate::config::yes")]
    pub norm_elementwise_affine: bool,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default = "default_attention")]
    pub attention_type: String,
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

pub(super) fn sixteen() -> usize {
    16
}
pub(super) fn eighty_eight() -> usize {
    88
}
pub(super) fn one() -> usize {
    1
}
pub(super) fn thirty_two() -> usize {
    32
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
            attention_type: cfg.attention_type.clone(),
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

//! The Stable Diffusion transformer bottleneck, diffusers 0.42.1: `BasicTransformerBlock`
//! (`models/attention.py`, the `norm_type="layer_norm"` path) and `Transformer2DModel`
//! (`models/transformers/transformer_2d.py`, continuous input).
//!
//! [`TransformerBlock`] and [`SpatialTransformer`] are shared with the CompVis/Stability ldm
//! classes (`BasicTransformerBlock`, `SpatialTransformer`), which have the same state-dict names
//! and differ only in how they are configured (see [`crate::ldm::transformer`]).
//!
//! This module holds the shared blocks; `basic_block` and `transformer_2d` hold diffusers'
//! own classes configured from their keyword arguments
//! ([`BasicTransformerBlockConfig`], [`Transformer2DModelConfig`]).

mod basic_block;
mod transformer_2d;

pub use basic_block::{AttentionType, BasicTransformerBlock, BasicTransformerBlockConfig};
pub use transformer_2d::{Transformer2DModel, Transformer2DModelConfig};

use crate::diffusers::attention::{Attention, AttentionConfig, Processor};
use crate::diffusers::embeddings::SinusoidalPositionalEmbedding;
use crate::diffusers::feed_forward::{FeedForward, FeedForwardConfig};
use crate::heads::{image_to_tokens, tokens_to_image};
use crate::layers::{group_norm, LayerNorm, Projection};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

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

fn attention(vb: VarBuilder, spec: &TransformerBlockSpec, source: AttentionSource) -> Result<Attention> {
    // Attention(query_dim=dim, cross_attention_dim=..., heads, dim_head, dropout, bias=attention_bias,
    //           upcast_attention, out_bias=attention_out_bias)
    let cross_attention_dim = match source {
        AttentionSource::SelfTokens => None,
        AttentionSource::Context(d) => Some(d),
    };
    let cfg = AttentionConfig {
        cross_attention_dim,
        heads: spec.heads,
        dim_head: spec.head_dim,
        bias: spec.attention_bias,
        upcast_attention: spec.upcast_attention,
        out_bias: spec.attention_out_bias,
        processor: spec.processor,
        ..AttentionConfig::new(spec.dim)
    };
    Attention::new(vb, &cfg)
}

impl TransformerBlock {
    pub fn load(vb: VarBuilder, block: &'static str, spec: &TransformerBlockSpec) -> Result<Self> {
        let norm = |name: &str| LayerNorm::load(vb.pp(name), spec.dim, spec.norm_eps, spec.norm_elementwise_affine);
        let attn2 = match spec.attn2 {
            Some(source) => Some((norm("norm2")?, attention(vb.pp("attn2"), spec, source)?)),
            None => None,
        };
        let pos_embed = SinusoidalPositionalEmbedding::load_for(vb.pp("pos_embed"), block, spec.dim, spec.pos_embed)?;
        Ok(Self {
            norm1: norm("norm1")?,
            attn1: attention(vb.pp("attn1"), spec, spec.attn1)?,
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
        let mut h = crate::ops::add(&attn, hidden_states)?;
        if let Some((norm2, attn2)) = &self.attn2 {
            let normed = norm2.forward(&h)?;
            trace::record("norm2", &normed);
            let normed = SinusoidalPositionalEmbedding::add(self.pos_embed.as_ref(), normed)?;
            let attn = trace::scope("attn2", || attn2.forward(&normed, context, encoder_attention_mask))?;
            h = crate::ops::add(&attn, &h)?;
        }
        let normed = self.norm3.forward(&h)?;
        trace::record("norm3", &normed);
        Ok(crate::ops::add(&trace::scope("ff", || self.ff.forward(&normed))?, &h)?)
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

    /// `proj_out`, the image reshape and `+ x` on CUDA in half precision: the linear
    /// `proj_out` natively with its bias inside the GEMM's sum ([`Projection::linear_native`],
    /// PyTorch's `addmm` on the contiguous tokens), the 1×1 conv natively
    /// ([`Projection::product_channels_native`]) with its bias added after, as cuDNN's
    /// convolution and PyTorch's separate add; then bias and residual in one epilogue kernel
    /// (`unet_attention::cuda::epilogue` (feature `cuda`), each add rounded as PyTorch's
    /// separate ops). `None` off that path (not CUDA, not half, a trace recorded).
    #[cfg(feature = "cuda")]
    fn proj_out_fused(&self, tokens: &Tensor, x: &Tensor, (h, w): (usize, usize)) -> Result<Option<Tensor>> {
        let (y, bias) = if self.linear {
            let Some(y) = self.proj_out.linear_native(tokens)? else {
                return Ok(None);
            };
            (tokens_to_image(&y, h, w)?, None)
        } else {
            let image = tokens_to_image(tokens, h, w)?;
            let Some(pair) = self.proj_out.product_channels_native(&image)? else {
                return Ok(None);
            };
            pair
        };
        let channels = crate::cuda::BiasAxis::Channels;
        if let Some(out) = crate::cuda::epilogue(&y, bias.as_ref().map(|b| (b, channels)), Some(x), None)? {
            return Ok(Some(out));
        }
        let y = match &bias {
            Some(b) => y.broadcast_add(&b.reshape((b.elem_count(), 1, 1))?)?,
            None => y,
        };
        Ok(Some(crate::ops::add(&y, &x)?))
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
        #[cfg(feature = "cuda")]
        if let Some(out) = self.proj_out_fused(&tokens, x, (h, w))? {
            return Ok(out);
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
        let out = crate::ops::add(&out, x)?;
        trace::record("output", &out);
        Ok(out)
    }
}

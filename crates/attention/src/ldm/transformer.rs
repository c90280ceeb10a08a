//! The Stable Diffusion transformer bottleneck as CompVis/Stability wrote it
//! (`ldm/modules/attention.py`): `CrossAttention`, `BasicTransformerBlock`, `SpatialTransformer`,
//! in the SD 1.x form (CompVis latent-diffusion a506df5 = stable-diffusion 21f890f) and the SD 2.x
//! form (Stability-AI/stablediffusion cf1d67a: `disable_self_attn`, `use_linear`, `context_dim`
//! per depth).
//!
//! The state-dict names are diffusers' (`to_q`, `to_out.0`, `ff.net.0.proj`, `norm1..3`,
//! `proj_in`/`proj_out`), and so is the math in float32: these blocks are the diffusers ones
//! ([`crate::diffusers::transformers::transformer`]) configured the ldm way. What differs:
//! * `CrossAttention(mask=...)` takes a boolean mask `(B, ...)`, True = attend, flattened to
//!   `(B, S)` and applied as `masked_fill(~mask, -finfo.max)`;
//! * `BasicTransformerBlock` always has `attn2` (self-attention when `context` is None),
//!   `gated_ff=False` uses `Sequential(Linear, GELU)` (key `ff.net.0.0`), and SD2's
//!   `disable_self_attn` makes `attn1` attend to the context;
//! * `SpatialTransformer(use_linear=True)` declares `proj_out = Linear(in_channels, inner_dim)`,
//!   arguments swapped; it only runs when `in_channels == n_heads·d_head`, which is required here.
//!
//! The attention runs as ldm writes it ([`Processor::Ldm`]): `einsum(q, k) * scale`,
//! `masked_fill`, softmax, `einsum(attn, v)`, each op rounded to the input dtype in f16/bf16
//! (SD 1.x). SD2's `ATTN_PRECISION == "fp32"` upcast of q and k is the same computation in
//! f32/f64; in half precision PyTorch cannot run it on the CPU (its `einsum(sim, v)` mixes f32
//! and f16), so the SD 1.x rounding is followed there too.

use crate::config::defaults;
use crate::diffusers::attention::{Attention, AttentionConfig, Processor};
use crate::diffusers::feed_forward::{ActivationFn, FeedForwardConfig};
use crate::diffusers::transformers::transformer::{
    AttentionSource, SpatialTransformer as Spatial, TransformerBlock, TransformerBlockSpec,
};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `CrossAttention(query_dim, context_dim=None, heads=8, dim_head=64,
/// dropout=0.)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CrossAttentionConfig {
    pub query_dim: usize,
    #[serde(default)]
    pub context_dim: Option<usize>,
    #[serde(default = "defaults::usize::<8>")]
    pub heads: usize,
    #[serde(default = "defaults::usize::<64>")]
    pub dim_head: usize,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
}

/// `ldm.modules.attention.CrossAttention`.
#[derive(Debug, Clone)]
pub struct CrossAttention(Attention);

impl CrossAttention {
    pub const BLOCK: &'static str = "ldm.CrossAttention";

    pub fn new(vb: VarBuilder, cfg: &CrossAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        // to_q/to_k/to_v Linear(.., bias=False), to_out = Sequential(Linear(inner, query_dim), Dropout),
        // scale dim_head ** -0.5 after q·kᵀ: diffusers' Attention with bias=False.
        let attn = AttentionConfig {
            cross_attention_dim: cfg.context_dim,
            heads: cfg.heads,
            dim_head: cfg.dim_head,
            bias: false,
            processor: Some(Processor::Ldm),
            ..AttentionConfig::new(cfg.query_dim)
        };
        Ok(Self(Attention::new(vb, &attn)?))
    }

    /// `forward(x, context=None, mask=None)`: `x` `(B, N, query_dim)`, `context`
    /// `(B, S, context_dim)`, `mask` boolean (as `U8`, non-zero = attend) `(B, ...)` with S
    /// elements per batch item.
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>, mask: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "context", context, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "mask", mask)?;
        let bias = match mask {
            Some(m) => Some(mask_bias(m)?),
            None => None,
        };
        self.0.forward(x, context, bias.as_ref())
    }
}

/// `rearrange(mask, 'b ... -> b (...)')`, then `masked_fill(~mask, -max)` as an additive bias
/// `(B, 1, S)`: 0 where attended, `-f32::MAX` elsewhere.
fn mask_bias(mask: &Tensor) -> Result<Tensor> {
    let b = mask.dim(0)?;
    let flat = mask.reshape((b, ()))?;
    let keep = flat.ne(0u8)?;
    let zeros = Tensor::zeros(flat.shape(), DType::F32, flat.device())?;
    let neg = Tensor::full(-f32::MAX, flat.shape(), flat.device())?;
    Ok(keep.where_cond(&zeros, &neg)?.unsqueeze(1)?)
}

/// Keyword arguments of `BasicTransformerBlock(dim, n_heads, d_head, dropout=0.,
/// context_dim=None, gated_ff=True, checkpoint=True[, disable_self_attn=False])` (SD 1.x / 2.x).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicTransformerBlockConfig {
    pub dim: usize,
    pub n_heads: usize,
    pub d_head: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub context_dim: Option<usize>,
    #[serde(default = "defaults::yes")]
    pub gated_ff: bool,
    /// Gradient checkpointing: no effect on the forward.
    #[serde(default = "defaults::yes")]
    pub checkpoint: bool,
    #[serde(default)]
    pub disable_self_attn: bool,
}

impl BasicTransformerBlockConfig {
    /// The shared block description.
    pub fn spec(&self) -> TransformerBlockSpec {
        let context = AttentionSource::Context(self.context_dim.unwrap_or(self.dim));
        let mut ff = FeedForwardConfig::new(self.dim);
        ff.activation_fn = if self.gated_ff {
            ActivationFn::Geglu
        } else {
            ActivationFn::Gelu
        };
        TransformerBlockSpec {
            dim: self.dim,
            heads: self.n_heads,
            head_dim: self.d_head,
            attn1: if self.disable_self_attn {
                context
            } else {
                AttentionSource::SelfTokens
            },
            attn2: Some(context),
            attention_bias: false,
            attention_out_bias: true,
            upcast_attention: false,
            processor: Some(Processor::Ldm),
            norm_eps: 1e-5,
            norm_elementwise_affine: true,
            ff,
            ff_project_in_key: if self.gated_ff { "net.0.proj" } else { "net.0.0" },
            pos_embed: None,
        }
    }
}

/// `ldm.modules.attention.BasicTransformerBlock`.
#[derive(Debug, Clone)]
pub struct BasicTransformerBlock(TransformerBlock);

impl BasicTransformerBlock {
    pub const BLOCK: &'static str = "ldm.BasicTransformerBlock";

    pub fn new(vb: VarBuilder, cfg: &BasicTransformerBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Ok(Self(TransformerBlock::load(vb, Self::BLOCK, &cfg.spec())?))
    }

    /// `forward(x, context=None)`: `x` `(B, N, dim)`.
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "context", context, &[])?;
        if x.rank() != 3 {
            return Err(Error::input(
                Self::BLOCK,
                "x",
                format!("expected (B, N, dim), found {:?}", x.dims()),
            ));
        }
        self.0.forward(x, context, None, None)
    }
}

/// `context_dim`: one width for every block, or (SD2) one per block, where `null` is a block
/// without context (its `attn2` attends to `x`). SD 2.x indexes the list by depth, so
/// `context_dim=[None]` is how that tree builds a transformer without context (`None` itself
/// fails there at `context_dim[d]`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum ContextDim {
    One(usize),
    PerDepth(Vec<Option<usize>>),
}

/// Keyword arguments of `SpatialTransformer(in_channels, n_heads, d_head, depth=1, dropout=0.,
/// context_dim=None[, disable_self_attn=False, use_linear=False, use_checkpoint=True])`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpatialTransformerConfig {
    pub in_channels: usize,
    pub n_heads: usize,
    pub d_head: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub depth: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub context_dim: Option<ContextDim>,
    #[serde(default)]
    pub disable_self_attn: bool,
    #[serde(default)]
    pub use_linear: bool,
    /// Gradient checkpointing: no effect on the forward.
    #[serde(default = "defaults::yes")]
    pub use_checkpoint: bool,
}

impl SpatialTransformerConfig {
    /// `SpatialTransformer(in_channels, n_heads, d_head)` with every other argument at its
    /// default.
    pub fn new(in_channels: usize, n_heads: usize, d_head: usize) -> Self {
        Self {
            in_channels,
            n_heads,
            d_head,
            depth: defaults::usize::<1>(),
            dropout: 0.0,
            context_dim: None,
            disable_self_attn: false,
            use_linear: false,
            use_checkpoint: defaults::yes(),
        }
    }
}

/// `ldm.modules.attention.SpatialTransformer`.
#[derive(Debug, Clone)]
pub struct SpatialTransformer(Spatial);

impl SpatialTransformer {
    pub const BLOCK: &'static str = "ldm.SpatialTransformer";

    pub fn new(vb: VarBuilder, cfg: &SpatialTransformerConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let inner = cfg.n_heads * cfg.d_head;
        if cfg.use_linear && inner != cfg.in_channels {
            return Err(Error::config(
                block,
                format!(
                    "use_linear needs in_channels ({}) == n_heads·d_head ({inner}): SD2 declares proj_out as \
                     Linear(in_channels, inner_dim), which only runs when they are equal",
                    cfg.in_channels
                ),
            ));
        }
        let context_dims: Vec<Option<usize>> = match &cfg.context_dim {
            None => vec![None; cfg.depth],
            Some(ContextDim::One(d)) => vec![Some(*d); cfg.depth],
            Some(ContextDim::PerDepth(list)) if list.len() >= cfg.depth => list.clone(),
            Some(ContextDim::PerDepth(list)) => {
                return Err(Error::config(
                    block,
                    format!("context_dim lists {} widths for depth {}", list.len(), cfg.depth),
                ))
            }
        };
        let specs: Vec<TransformerBlockSpec> = context_dims
            .into_iter()
            .take(cfg.depth)
            .map(|context_dim| {
                BasicTransformerBlockConfig {
                    dim: inner,
                    n_heads: cfg.n_heads,
                    d_head: cfg.d_head,
                    dropout: cfg.dropout,
                    context_dim,
                    gated_ff: true,
                    checkpoint: cfg.use_checkpoint,
                    disable_self_attn: cfg.disable_self_attn,
                }
                .spec()
            })
            .collect();
        // Normalize(in_channels) = GroupNorm(32, in_channels, eps=1e-6).
        Ok(Self(Spatial::load(
            vb,
            block,
            32,
            cfg.in_channels,
            cfg.in_channels,
            cfg.use_linear,
            &specs,
        )?))
    }

    /// `forward(x, context=None)`: `x` `(B, C, H, W)`; one context serves every block (a list
    /// of identical contexts in SD2's terms).
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "context", context, &[])?;
        if x.rank() != 4 {
            return Err(Error::input(
                Self::BLOCK,
                "x",
                format!("expected (B, C, H, W), found {:?}", x.dims()),
            ));
        }
        self.0.forward(x, context, None, None)
    }

    /// SD2's `forward(x, context=[c0, c1, ...])`: block `i` attends to `contexts[i]`.
    pub fn forward_per_block(&self, x: &Tensor, contexts: &[&Tensor]) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        for t in contexts {
            crate::validate::input(Self::BLOCK, "contexts", t, &[])?;
        }
        if x.rank() != 4 {
            return Err(Error::input(
                Self::BLOCK,
                "x",
                format!("expected (B, C, H, W), found {:?}", x.dims()),
            ));
        }
        self.0.forward_per_block(x, contexts, None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `new` gives what the required arguments deserialize to (one source for the defaults).
    #[test]
    fn new_matches_serde_defaults() {
        let parsed: SpatialTransformerConfig = crate::config::from_json(
            SpatialTransformer::BLOCK,
            &serde_json::json!({"in_channels": 32, "n_heads": 2, "d_head": 16}),
        )
        .unwrap();
        let built = SpatialTransformerConfig::new(32, 2, 16);
        assert_eq!(
            serde_json::to_value(parsed).unwrap(),
            serde_json::to_value(built).unwrap()
        );
    }

    fn config(context_dim: serde_json::Value) -> Result<SpatialTransformerConfig> {
        crate::config::from_json(
            SpatialTransformer::BLOCK,
            &serde_json::json!({"in_channels": 32, "n_heads": 2, "d_head": 16, "depth": 2, "context_dim": context_dim}),
        )
    }

    /// SD 2.x's `context_dim=[None, None]` builds the same blocks as SD 1.x's `None`: the same
    /// weights give the same output; a list shorter than the depth is refused, as
    /// `context_dim[d]` fails upstream.
    /// Random weights under the key names of a conv-projection SpatialTransformer of 32
    /// channels, depth 2, without context (`attn2` reads the 32 channels).
    fn weights() -> Result<VarBuilder<'static>> {
        let dev = Device::Cpu;
        let mut m = std::collections::HashMap::new();
        let mut put = |name: String, shape: &[usize]| -> Result<()> {
            m.insert(name, (Tensor::randn(0f32, 1., shape, &dev)? * 0.1)?);
            Ok(())
        };
        for (conv, shape) in [("proj_in", [32, 32, 1, 1]), ("proj_out", [32, 32, 1, 1])] {
            put(format!("{conv}.weight"), &shape)?;
            put(format!("{conv}.bias"), &[32])?;
        }
        put("norm.weight".into(), &[32])?;
        put("norm.bias".into(), &[32])?;
        for i in 0..2 {
            let p = format!("transformer_blocks.{i}");
            for attn in ["attn1", "attn2"] {
                for w in ["to_q", "to_k", "to_v", "to_out.0"] {
                    put(format!("{p}.{attn}.{w}.weight"), &[32, 32])?;
                }
                put(format!("{p}.{attn}.to_out.0.bias"), &[32])?;
            }
            for n in ["norm1", "norm2", "norm3"] {
                put(format!("{p}.{n}.weight"), &[32])?;
                put(format!("{p}.{n}.bias"), &[32])?;
            }
            put(format!("{p}.ff.net.0.proj.weight"), &[256, 32])?;
            put(format!("{p}.ff.net.0.proj.bias"), &[256])?;
            put(format!("{p}.ff.net.2.weight"), &[32, 128])?;
            put(format!("{p}.ff.net.2.bias"), &[32])?;
        }
        Ok(VarBuilder::from_tensors(m, DType::F32, &dev))
    }

    #[test]
    fn a_context_dim_list_of_none_is_a_transformer_without_context() -> Result<()> {
        let vb = weights()?;
        let plain = SpatialTransformer::new(vb.clone(), &config(serde_json::Value::Null)?)?;
        let listed = SpatialTransformer::new(vb.clone(), &config(serde_json::json!([null, null]))?)?;
        let x = Tensor::randn(0f32, 1., (1, 32, 3, 4), &Device::Cpu)?;
        let (a, b) = (plain.forward(&x, None)?, listed.forward(&x, None)?);
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        let short = SpatialTransformer::new(vb, &config(serde_json::json!([null]))?).unwrap_err();
        assert!(short.to_string().contains("lists 1 widths for depth 2"), "{short}");
        Ok(())
    }
}

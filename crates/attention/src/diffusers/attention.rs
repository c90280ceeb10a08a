//! `diffusers.models.attention_processor.Attention` (diffusers 0.42.1; semantics unchanged
//! since 0.17), run with its default processor `AttnProcessor2_0` or the classic `AttnProcessor`.
//!
//! This covers the spatial self-attention of the U-Net and VAE mid blocks (`group_norm`,
//! `to_q`/`to_k`/`to_v`/`to_out.0`, `residual_connection`, `rescale_output_factor`) and
//! cross-attention through `encoder_hidden_states`, for token `(B, N, C)` and image
//! `(B, C, H, W)` inputs. Checkpoints saved by diffusers ≤ 0.16 (and never re-saved, such as
//! `google/ddpm-*`) name the projections `query`/`key`/`value`/`proj_attn`; both spellings load.
//!
//! Constructor options that change the forward and are not implemented yet (`kv_heads`,
//! `cross_attention_norm`, `qk_norm`, `added_kv_proj_dim`, `spatial_norm_dim`,
//! `only_cross_attention`, `out_context_dim`, `context_pre_only`, `pre_only`) are rejected
//! with an error rather than ignored.

use crate::heads::{image_to_tokens, merge_tokens, split_tokens, tokens_to_image};
use crate::layers::{group_norm, Projection};
use crate::sdpa::{default_scale, sdpa};
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Which diffusers attention processor produced the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Processor {
    /// `AttnProcessor2_0`: `F.scaled_dot_product_attention` with its default scale
    /// `1/sqrt(head_dim)`; ignores `scale_qk` and the upcast flags.
    AttnProcessor2_0,
    /// `AttnProcessor`: `baddbmm(mask, q, kᵀ, alpha=scale)`, honours `scale_qk` and the
    /// upcast flags.
    AttnProcessor,
}

/// Keyword arguments of `Attention.__init__` (0.42.1), plus `processor` naming the processor
/// class that ran (absent: diffusers' default for the config).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionConfig {
    pub query_dim: usize,
    #[serde(default)]
    pub cross_attention_dim: Option<usize>,
    #[serde(default = "eight")]
    pub heads: usize,
    #[serde(default)]
    pub kv_heads: Option<usize>,
    #[serde(default = "sixty_four")]
    pub dim_head: usize,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub bias: bool,
    /// Only affects half precision; attention here always accumulates in f32.
    #[serde(default)]
    pub upcast_attention: bool,
    /// Only affects half precision; the softmax here always runs in f32.
    #[serde(default)]
    pub upcast_softmax: bool,
    #[serde(default)]
    pub cross_attention_norm: Option<String>,
    #[serde(default = "thirty_two")]
    pub cross_attention_norm_num_groups: usize,
    #[serde(default)]
    pub qk_norm: Option<String>,
    #[serde(default)]
    pub added_kv_proj_dim: Option<usize>,
    #[serde(default = "crate::config::yes")]
    pub added_proj_bias: bool,
    #[serde(default)]
    pub norm_num_groups: Option<usize>,
    #[serde(default)]
    pub spatial_norm_dim: Option<usize>,
    #[serde(default = "crate::config::yes")]
    pub out_bias: bool,
    #[serde(default = "crate::config::yes")]
    pub scale_qk: bool,
    #[serde(default)]
    pub only_cross_attention: bool,
    #[serde(default = "eps_default")]
    pub eps: f64,
    #[serde(default = "one")]
    pub rescale_output_factor: f64,
    #[serde(default)]
    pub residual_connection: bool,
    /// Marks the attention of `UNetMidBlock2D`, whose checkpoints may use the legacy names.
    #[serde(default)]
    pub _from_deprecated_attn_block: bool,
    #[serde(default)]
    pub processor: Option<Processor>,
    #[serde(default)]
    pub out_dim: Option<usize>,
    #[serde(default)]
    pub out_context_dim: Option<usize>,
    #[serde(default)]
    pub context_pre_only: Option<bool>,
    #[serde(default)]
    pub pre_only: bool,
    /// Only used by `qk_norm`.
    #[serde(default = "crate::config::yes")]
    pub elementwise_affine: bool,
    /// `AttnProcessor2_0` and `AttnProcessor` do not read it.
    #[serde(default)]
    pub is_causal: bool,
}

fn eight() -> usize {
    8
}
fn sixty_four() -> usize {
    64
}
fn thirty_two() -> usize {
    32
}
fn eps_default() -> f64 {
    1e-5
}
fn one() -> f64 {
    1.0
}

/// `diffusers.models.attention_processor.Attention`.
#[derive(Debug, Clone)]
pub struct Attention {
    group_norm: Option<candle_nn::GroupNorm>,
    to_q: Projection,
    to_k: Projection,
    to_v: Projection,
    to_out: Projection,
    heads: usize,
    scale: f64,
    residual_connection: bool,
    rescale_output_factor: f64,
    processor: Processor,
}

impl Attention {
    pub const BLOCK: &'static str = "diffusers.Attention";

    pub fn new(vb: VarBuilder, cfg: &AttentionConfig) -> Result<Self> {
        let block = Self::BLOCK;
        let unsupported = [
            ("kv_heads", cfg.kv_heads.is_some()),
            ("cross_attention_norm", cfg.cross_attention_norm.is_some()),
            ("qk_norm", cfg.qk_norm.is_some()),
            ("added_kv_proj_dim", cfg.added_kv_proj_dim.is_some()),
            ("spatial_norm_dim", cfg.spatial_norm_dim.is_some()),
            ("only_cross_attention", cfg.only_cross_attention),
            ("out_context_dim", cfg.out_context_dim.is_some()),
            ("context_pre_only", cfg.context_pre_only.is_some()),
            ("pre_only", cfg.pre_only),
        ];
        if let Some((name, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(Error::unsupported(block, format!("`{name}` is not implemented yet")));
        }
        if cfg.dim_head == 0 {
            return Err(Error::config(block, "`dim_head` must be positive"));
        }
        // diffusers: inner_dim = out_dim or dim_head * heads; heads = out_dim // dim_head.
        let (inner_dim, heads) = match cfg.out_dim {
            Some(out_dim) => (out_dim, out_dim / cfg.dim_head),
            None => (cfg.dim_head * cfg.heads, cfg.heads),
        };
        if heads == 0 || inner_dim % heads != 0 {
            return Err(Error::config(
                block,
                format!("{heads} heads do not divide the inner dim {inner_dim}"),
            ));
        }
        let out_features = cfg.out_dim.unwrap_or(cfg.query_dim);
        let kv_dim = cfg.cross_attention_dim.unwrap_or(cfg.query_dim);
        let processor = cfg.processor.unwrap_or(if cfg.scale_qk {
            Processor::AttnProcessor2_0
        } else {
            Processor::AttnProcessor
        });
        let scale = match processor {
            // SDPA's default scale uses the per-head dim of the key projection.
            Processor::AttnProcessor2_0 => default_scale(inner_dim / heads),
            Processor::AttnProcessor if cfg.scale_qk => default_scale(cfg.dim_head),
            Processor::AttnProcessor => 1.0,
        };
        let legacy = vb.contains_tensor("query.weight");
        let [q, k, v, out] = if legacy {
            ["query", "key", "value", "proj_attn"]
        } else {
            ["to_q", "to_k", "to_v", "to_out.0"]
        };
        let group_norm = match cfg.norm_num_groups {
            Some(groups) => Some(group_norm(vb.pp("group_norm"), block, groups, cfg.query_dim, cfg.eps)?),
            None => None,
        };
        Ok(Self {
            group_norm,
            to_q: Projection::load(vb.pp(q), block, cfg.query_dim, inner_dim, cfg.bias)?,
            to_k: Projection::load(vb.pp(k), block, kv_dim, inner_dim, cfg.bias)?,
            to_v: Projection::load(vb.pp(v), block, kv_dim, inner_dim, cfg.bias)?,
            to_out: Projection::load(vb.pp(out), block, inner_dim, out_features, cfg.out_bias)?,
            heads,
            scale,
            residual_connection: cfg.residual_connection,
            rescale_output_factor: cfg.rescale_output_factor,
            processor,
        })
    }

    /// `forward(hidden_states, encoder_hidden_states=None, attention_mask=None)`.
    ///
    /// `hidden_states`: `(B, N, query_dim)` or `(B, query_dim, H, W)`;
    /// `encoder_hidden_states`: `(B, S, cross_attention_dim)`; `attention_mask`: additive,
    /// `(B, S)`, `(B, 1, S)` or `(B, N, S)` (or `(B·heads, ·, S)`), as diffusers'
    /// `prepare_attention_mask` takes it.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let block = Self::BLOCK;
        let residual = hidden_states;
        let image = match hidden_states.rank() {
            4 => Some(hidden_states.dims4()?),
            3 => None,
            _ => {
                return Err(Error::input(
                    block,
                    "hidden_states",
                    format!("expected (B, N, C) or (B, C, H, W), found {:?}", hidden_states.dims()),
                ))
            }
        };
        let mut hs = match image {
            Some(_) => image_to_tokens(hidden_states)?,
            None => hidden_states.clone(),
        };
        let context = encoder_hidden_states.unwrap_or(&hs);
        if context.rank() != 3 || context.dim(0)? != hs.dim(0)? {
            return Err(Error::input(
                block,
                "encoder_hidden_states",
                format!("expected (B={}, S, C), found {:?}", hs.dim(0)?, context.dims()),
            ));
        }
        let (batch, kv_len, _) = context.dims3()?;
        let mask = match attention_mask {
            Some(m) => Some(self.prepare_attention_mask(m, kv_len, batch)?),
            None => None,
        };
        if let Some(gn) = &self.group_norm {
            hs = gn.forward(&hs.transpose(1, 2)?)?.transpose(1, 2)?;
        }
        let query = self.to_q.forward_tokens(&hs)?;
        let context = encoder_hidden_states.unwrap_or(&hs);
        let key = self.to_k.forward_tokens(context)?;
        let value = self.to_v.forward_tokens(context)?;
        let (q, k, v) = (
            split_tokens(&query, self.heads)?,
            split_tokens(&key, self.heads)?,
            split_tokens(&value, self.heads)?,
        );
        let out = sdpa(&q, &k, &v, mask.as_ref(), self.scale)?;
        let mut out = self.to_out.forward_tokens(&merge_tokens(&out)?)?;
        if let Some((_, _, h, w)) = image {
            out = tokens_to_image(&out, h, w)?;
        }
        if self.residual_connection {
            out = (out + residual)?;
        }
        if self.rescale_output_factor != 1.0 {
            out = (out / self.rescale_output_factor)?;
        }
        Ok(out)
    }

    /// diffusers' `prepare_attention_mask` followed by the processor's reshape, as an additive
    /// mask broadcasting to `(B, heads, N, S)`.
    fn prepare_attention_mask(&self, mask: &Tensor, target_len: usize, batch: usize) -> Result<Tensor> {
        let block = Self::BLOCK;
        let mut mask = mask.clone();
        if mask.dtype() == DType::U8 {
            // A bool mask: SDPA reads True as "attend"; baddbmm cannot take one at all.
            if self.processor == Processor::AttnProcessor {
                return Err(Error::input(
                    block,
                    "attention_mask",
                    "a boolean mask is not accepted by AttnProcessor (baddbmm needs a float mask)",
                ));
            }
            let zeros = Tensor::zeros(mask.shape(), DType::F32, mask.device())?;
            let neg = Tensor::full(f32::NEG_INFINITY, mask.shape(), mask.device())?;
            mask = mask.where_cond(&zeros, &neg)?;
        }
        if mask.rank() == 2 {
            mask = mask.unsqueeze(1)?;
        }
        if mask.rank() != 3 {
            return Err(Error::input(
                block,
                "attention_mask",
                format!("expected (B, S) or (B, N, S), found {:?}", mask.dims()),
            ));
        }
        let current = mask.dim(2)?;
        if current != target_len {
            // diffusers pads by `target_len` (not by the difference): kept for parity.
            mask = mask.pad_with_zeros(2, 0, target_len)?;
        }
        let (rows, queries, keys) = mask.dims3()?;
        let heads = self.heads;
        let mask = if rows == batch * heads {
            mask.reshape((batch, heads, queries, keys))?
        } else if rows == batch {
            mask.unsqueeze(1)?
        } else {
            return Err(Error::input(
                block,
                "attention_mask",
                format!(
                    "first dim {rows} is neither batch {batch} nor batch × heads {}",
                    batch * heads
                ),
            ));
        };
        Ok(mask)
    }
}

//! The configuration of [`super::Attention`]: the keyword arguments of diffusers 0.42.1
//! `Attention.__init__` (`models/attention_processor.py`) as [`AttentionConfig`] with their
//! serde defaults, the processor classes that can run it ([`Processor`]) and the `qk_norm` and
//! `cross_attention_norm` kinds.

use crate::config::defaults;
use serde::Deserialize;

/// Which diffusers attention processor produced the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum Processor {
    /// `AttnProcessor2_0`: `F.scaled_dot_product_attention` with its default scale
    /// `1/sqrt(head_dim)`; ignores `scale_qk` and the upcast flags; applies `qk_norm`.
    AttnProcessor2_0,
    /// `AttnProcessor`: `baddbmm(mask, q, kᵀ, alpha=scale)`, honours `scale_qk` and the
    /// upcast flags; does not apply `qk_norm`.
    AttnProcessor,
    /// `AttnAddedKVProcessor` (UnCLIP, `SimpleCrossAttnDownBlock2D`): keys and values of the
    /// projected context (`add_k_proj`/`add_v_proj`) prepended to the self keys and values;
    /// baddbmm attention as in `AttnProcessor`.
    AttnAddedKVProcessor,
    /// `AttnAddedKVProcessor2_0`: the same with `F.scaled_dot_product_attention`.
    AttnAddedKVProcessor2_0,
    /// Not a diffusers processor (and not accepted in a config): the attention of CompVis /
    /// Stability `ldm.modules.attention.CrossAttention`, which [`crate::ldm`] builds on this
    /// block: `sim = einsum(q, k) * scale`, `sim.masked_fill_(~mask, -finfo(sim.dtype).max)`,
    /// softmax, `einsum(attn, v)`, each op rounded to the input dtype in f16/bf16. The mask is
    /// additive (0 = attend); every non-zero entry is filled. SD 2.x's `ATTN_PRECISION="fp32"`
    /// branch cannot run in half precision on the CPU (its `einsum` mixes f32 and f16), so the
    /// SD 1.x arithmetic is the one followed.
    #[serde(skip_deserializing)]
    Ldm,
}

impl Processor {
    /// Uses `F.scaled_dot_product_attention` (default scale, bool masks accepted).
    pub(super) fn is_sdpa(self) -> bool {
        matches!(self, Processor::AttnProcessor2_0 | Processor::AttnAddedKVProcessor2_0)
    }

    /// One of the added-key/value processors.
    pub(super) fn is_added_kv(self) -> bool {
        matches!(
            self,
            Processor::AttnAddedKVProcessor | Processor::AttnAddedKVProcessor2_0
        )
    }
}

/// `qk_norm` of `Attention.__init__`: the norm `norm_q`/`norm_k` apply to each head's queries
/// and keys (`(B, heads, N, head_dim)`, over the last dimension) under `AttnProcessor2_0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// `nn.LayerNorm(dim_head, eps, elementwise_affine)`.
    LayerNorm,
    /// `FP32LayerNorm(dim_head, elementwise_affine=False, bias=False, eps)`.
    Fp32LayerNorm,
    /// `nn.LayerNorm(dim_head · heads)` / `nn.LayerNorm(dim_head · kv_heads)` (Lumina).
    LayerNormAcrossHeads,
    /// diffusers `RMSNorm(dim_head, eps, elementwise_affine)`.
    RmsNorm,
    /// `RMSNorm(dim_head · heads, eps)` / `RMSNorm(dim_head · kv_heads, eps)` (LTX).
    RmsNormAcrossHeads,
    /// `LpNorm(p=2, dim=-1, eps)`: `F.normalize`.
    L2,
}

/// `cross_attention_norm` of `Attention.__init__`: the norm `norm_cross` applied to
/// `encoder_hidden_states` when they are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrossAttentionNorm {
    /// `nn.LayerNorm(cross_attention_dim)` (eps 1e-5).
    LayerNorm,
    /// `nn.GroupNorm(cross_attention_norm_num_groups, added_kv_proj_dim or cross_attention_dim,
    /// eps=1e-5)` over the channels of the `(B, S, C)` context.
    GroupNorm,
}

/// Keyword arguments of `Attention.__init__` (0.42.1), plus `processor` naming the processor
/// class that ran (absent: diffusers' default for the config).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionConfig {
    pub query_dim: usize,
    #[serde(default)]
    pub cross_attention_dim: Option<usize>,
    #[serde(default = "defaults::usize::<8>")]
    pub heads: usize,
    /// Accepted only when `dim_head · kv_heads` is the inner dim (diffusers' processors here
    /// fail otherwise); required by the `*_across_heads` `qk_norm` kinds.
    #[serde(default)]
    pub kv_heads: Option<usize>,
    #[serde(default = "defaults::usize::<64>")]
    pub dim_head: usize,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub bias: bool,
    /// `AttnProcessor` / `AttnAddedKVProcessor` only, f16/bf16 only: q and k in f32 for the
    /// scores (and the softmax). The SDPA processors ignore it, as in diffusers.
    #[serde(default)]
    pub upcast_attention: bool,
    /// `AttnProcessor` / `AttnAddedKVProcessor` only, f16/bf16 only: the softmax in f32 (the
    /// probabilities are cast back to the input dtype before `· v`). The SDPA processors ignore
    /// it, as in diffusers.
    #[serde(default)]
    pub upcast_softmax: bool,
    #[serde(default)]
    pub cross_attention_norm: Option<CrossAttentionNorm>,
    #[serde(default = "defaults::usize::<32>")]
    pub cross_attention_norm_num_groups: usize,
    #[serde(default)]
    pub qk_norm: Option<QkNorm>,
    #[serde(default)]
    pub added_kv_proj_dim: Option<usize>,
    #[serde(default = "defaults::yes")]
    pub added_proj_bias: bool,
    #[serde(default)]
    pub norm_num_groups: Option<usize>,
    #[serde(default)]
    pub spatial_norm_dim: Option<usize>,
    #[serde(default = "defaults::yes")]
    pub out_bias: bool,
    #[serde(default = "defaults::yes")]
    pub scale_qk: bool,
    #[serde(default)]
    pub only_cross_attention: bool,
    #[serde(default = "defaults::eps_1e5")]
    pub eps: f64,
    #[serde(default = "defaults::one_f")]
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
    /// Joint attention only: rejected.
    #[serde(default)]
    pub out_context_dim: Option<usize>,
    /// Joint attention only: rejected.
    #[serde(default)]
    pub context_pre_only: Option<bool>,
    /// Joint attention only: rejected.
    #[serde(default)]
    pub pre_only: bool,
    /// Only used by `qk_norm` (`layer_norm`, `rms_norm`).
    #[serde(default = "defaults::yes")]
    pub elementwise_affine: bool,
    /// None of the processors here reads it.
    #[serde(default)]
    pub is_causal: bool,
}

impl AttentionConfig {
    /// `Attention(query_dim)` with every other argument at its diffusers default
    /// (8 heads of 64, no bias, `out_bias`, `scale_qk`, eps 1e-5, default processor).
    pub fn new(query_dim: usize) -> Self {
        Self {
            query_dim,
            cross_attention_dim: None,
            heads: defaults::usize::<8>(),
            kv_heads: None,
            dim_head: defaults::usize::<64>(),
            dropout: 0.0,
            bias: false,
            upcast_attention: false,
            upcast_softmax: false,
            cross_attention_norm: None,
            cross_attention_norm_num_groups: defaults::usize::<32>(),
            qk_norm: None,
            added_kv_proj_dim: None,
            added_proj_bias: true,
            norm_num_groups: None,
            spatial_norm_dim: None,
            out_bias: true,
            scale_qk: true,
            only_cross_attention: false,
            eps: defaults::eps_1e5(),
            rescale_output_factor: defaults::one_f(),
            residual_connection: false,
            _from_deprecated_attn_block: false,
            processor: None,
            out_dim: None,
            out_context_dim: None,
            context_pre_only: None,
            pre_only: false,
            elementwise_affine: true,
            is_causal: false,
        }
    }

    /// The processor that runs: `processor`, or diffusers' default (`AttnProcessor2_0` when
    /// `scale_qk`, else `AttnProcessor`).
    pub fn resolved_processor(&self) -> Processor {
        self.processor.unwrap_or(if self.scale_qk {
            Processor::AttnProcessor2_0
        } else {
            Processor::AttnProcessor
        })
    }
}

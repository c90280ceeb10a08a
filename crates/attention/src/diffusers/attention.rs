//! `diffusers.models.attention_processor.Attention` (diffusers 0.42.1), run with one of the
//! processors `AttnProcessor2_0` (the default), `AttnProcessor` (the default when
//! `scale_qk=False`), or the UnCLIP / `SimpleCrossAttn` processors `AttnAddedKVProcessor2_0` and
//! `AttnAddedKVProcessor`.
//!
//! This covers the spatial self-attention of the U-Net and VAE mid blocks (`group_norm`,
//! `to_q`/`to_k`/`to_v`/`to_out.0`, `residual_connection`, `rescale_output_factor`), the MoVQ
//! decoder's `spatial_norm` (input `temb`), cross-attention through `encoder_hidden_states`
//! (with `cross_attention_norm`), `qk_norm`, and the added key/value projections
//! (`add_k_proj`/`add_v_proj`, `only_cross_attention`), for token `(B, N, C)` and image
//! `(B, C, H, W)` inputs. Checkpoints saved by diffusers ≤ 0.16 (and never re-saved, such as
//! `google/ddpm-*`) name the projections `query`/`key`/`value`/`proj_attn`; both spellings load.
//!
//! What each processor reads, mirrored exactly (weights a processor does not read are still
//! loaded, so a strict load of the state dict succeeds):
//!
//! | | `AttnProcessor2_0` | `AttnProcessor` | `AttnAddedKVProcessor2_0` | `AttnAddedKVProcessor` |
//! |---|---|---|---|---|
//! | scale | `1/sqrt(head_dim)` | `dim_head^-½` or 1 (`scale_qk`) | `1/sqrt(head_dim)` | `dim_head^-½` or 1 |
//! | `spatial_norm` (`temb`) | yes | yes | ignored | ignored |
//! | `qk_norm` (`norm_q`, `norm_k`) | yes | ignored | ignored | ignored |
//! | `norm_added_q`, `norm_added_k` | ignored | ignored | ignored | ignored |
//! | `group_norm` | optional | optional | required | required |
//! | `added_kv_proj_dim` | rejected | rejected | yes | yes |
//! | residual | `residual_connection` | `residual_connection` | always | always |
//! | `rescale_output_factor` | yes | yes | ignored | ignored |
//! | bool mask | yes | rejected (baddbmm) | yes | rejected (baddbmm) |
//!
//! Rejected, with an error: `kv_heads` unless `dim_head · kv_heads` equals the inner dim (any
//! other value breaks every one of these processors in diffusers), `added_kv_proj_dim` under the
//! processors that would ignore it, and the joint-attention options `out_context_dim`,
//! `context_pre_only` and `pre_only`.

use crate::cpu::contiguous;
use crate::heads::{image_to_tokens, merge_tokens, split_tokens, tokens_to_image};
use crate::layers::{group_norm, l2_normalize_last_dim, LastDimRmsNorm, LayerNorm, Projection, SpatialNorm};
use crate::ops::{div, matmul, softmax, upcast};
use crate::sdpa::{default_scale, sdpa, trace_probs, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor, D};
use candle_nn::VarBuilder;
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
    fn is_sdpa(self) -> bool {
        matches!(self, Processor::AttnProcessor2_0 | Processor::AttnAddedKVProcessor2_0)
    }

    /// One of the added-key/value processors.
    fn is_added_kv(self) -> bool {
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
    #[serde(default = "eight")]
    pub heads: usize,
    /// Accepted only when `dim_head · kv_heads` is the inner dim (diffusers' processors here
    /// fail otherwise); required by the `*_across_heads` `qk_norm` kinds.
    #[serde(default)]
    pub kv_heads: Option<usize>,
    #[serde(default = "sixty_four")]
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
    #[serde(default = "thirty_two")]
    pub cross_attention_norm_num_groups: usize,
    #[serde(default)]
    pub qk_norm: Option<QkNorm>,
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
    #[serde(default = "crate::config::yes")]
    pub elementwise_affine: bool,
    /// None of the processors here reads it.
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

impl AttentionConfig {
    /// `Attention(query_dim)` with every other argument at its diffusers default
    /// (8 heads of 64, no bias, `out_bias`, `scale_qk`, eps 1e-5, default processor).
    pub fn new(query_dim: usize) -> Self {
        Self {
            query_dim,
            cross_attention_dim: None,
            heads: eight(),
            kv_heads: None,
            dim_head: sixty_four(),
            dropout: 0.0,
            bias: false,
            upcast_attention: false,
            upcast_softmax: false,
            cross_attention_norm: None,
            cross_attention_norm_num_groups: thirty_two(),
            qk_norm: None,
            added_kv_proj_dim: None,
            added_proj_bias: true,
            norm_num_groups: None,
            spatial_norm_dim: None,
            out_bias: true,
            scale_qk: true,
            only_cross_attention: false,
            eps: eps_default(),
            rescale_output_factor: one(),
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

/// A norm over the last dimension of per-head queries or keys.
#[derive(Debug, Clone)]
enum HeadNorm {
    Layer(LayerNorm),
    Rms(LastDimRmsNorm),
    L2(f64),
}

impl HeadNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            HeadNorm::Layer(n) => n.forward(x),
            HeadNorm::Rms(n) => n.forward(x),
            HeadNorm::L2(eps) => l2_normalize_last_dim(x, *eps),
        }
    }
}

/// `norm_cross`.
#[derive(Debug, Clone)]
enum CrossNorm {
    Layer(LayerNorm),
    Group(crate::layers::GroupNorm),
}

impl CrossNorm {
    /// diffusers' `norm_encoder_hidden_states` on `(B, S, C)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            CrossNorm::Layer(n) => n.forward(x),
            CrossNorm::Group(n) => n.forward(&x.transpose(1, 2)?)?.transpose(1, 2),
        }
    }
}

/// `diffusers.models.attention_processor.Attention`.
#[derive(Debug, Clone)]
pub struct Attention {
    processor: Processor,
    group_norm: Option<crate::layers::GroupNorm>,
    /// Only when the processor applies it.
    spatial_norm: Option<SpatialNorm>,
    norm_cross: Option<CrossNorm>,
    /// Only when the processor applies them (`AttnProcessor2_0`).
    norm_q: Option<HeadNorm>,
    norm_k: Option<HeadNorm>,
    to_q: Projection,
    /// Absent with `only_cross_attention`.
    to_k: Option<Projection>,
    to_v: Option<Projection>,
    add_k_proj: Option<Projection>,
    add_v_proj: Option<Projection>,
    to_out: Projection,
    heads: usize,
    scale: f64,
    query_dim: usize,
    /// Width `encoder_hidden_states` must have.
    context_dim: usize,
    residual_connection: bool,
    rescale_output_factor: f64,
    upcast_attention: bool,
    upcast_softmax: bool,
}

/// The `(norm_q, norm_k)` of a `qk_norm` kind (diffusers 0.42.1 `Attention.__init__`).
fn qk_norms(vb: &VarBuilder, cfg: &AttentionConfig, kind: QkNorm) -> Result<(HeadNorm, HeadNorm)> {
    let block = Attention::BLOCK;
    let (d, eps, affine) = (cfg.dim_head, cfg.eps, cfg.elementwise_affine);
    let kv_heads = || {
        cfg.kv_heads.ok_or_else(|| {
            Error::config(
                block,
                format!("qk_norm {kind:?} sizes norm_k as dim_head * kv_heads and needs `kv_heads` (diffusers fails without it)"),
            )
        })
    };
    let layer = |name: &str, dim: usize, affine: bool| -> Result<HeadNorm> {
        Ok(HeadNorm::Layer(LayerNorm::load(vb.pp(name), dim, eps, affine)?))
    };
    let rms = |name: &str, dim: usize, affine: bool| -> Result<HeadNorm> {
        Ok(HeadNorm::Rms(LastDimRmsNorm::load(vb.pp(name), dim, eps, affine)?))
    };
    Ok(match kind {
        QkNorm::LayerNorm => (layer("norm_q", d, affine)?, layer("norm_k", d, affine)?),
        QkNorm::Fp32LayerNorm => (layer("norm_q", d, false)?, layer("norm_k", d, false)?),
        QkNorm::LayerNormAcrossHeads => {
            let kv = kv_heads()?;
            (layer("norm_q", d * cfg.heads, true)?, layer("norm_k", d * kv, true)?)
        }
        QkNorm::RmsNorm => (rms("norm_q", d, affine)?, rms("norm_k", d, affine)?),
        QkNorm::RmsNormAcrossHeads => {
            let kv = kv_heads()?;
            (rms("norm_q", d * cfg.heads, true)?, rms("norm_k", d * kv, true)?)
        }
        QkNorm::L2 => (HeadNorm::L2(eps), HeadNorm::L2(eps)),
    })
}

/// Load `norm_added_q`/`norm_added_k` (built when both `qk_norm` and `added_kv_proj_dim` are
/// set). None of the processors here reads them; they are loaded for a strict state dict.
fn load_added_qk_norms(vb: &VarBuilder, cfg: &AttentionConfig, kind: QkNorm) -> Result<()> {
    let block = Attention::BLOCK;
    let (d, eps) = (cfg.dim_head, cfg.eps);
    match kind {
        QkNorm::LayerNorm => {
            for name in ["norm_added_q", "norm_added_k"] {
                LayerNorm::load(vb.pp(name), d, eps, cfg.elementwise_affine)?;
            }
        }
        QkNorm::Fp32LayerNorm => {}
        QkNorm::RmsNorm => {
            for name in ["norm_added_q", "norm_added_k"] {
                LastDimRmsNorm::load(vb.pp(name), d, eps, true)?;
            }
        }
        QkNorm::RmsNormAcrossHeads => {
            let kv = cfg.kv_heads.ok_or_else(|| {
                Error::config(
                    block,
                    "qk_norm RmsNormAcrossHeads with added_kv_proj_dim needs `kv_heads`",
                )
            })?;
            LastDimRmsNorm::load(vb.pp("norm_added_k"), d * kv, eps, true)?;
        }
        QkNorm::LayerNormAcrossHeads | QkNorm::L2 => {
            return Err(Error::config(
                block,
                format!("qk_norm {kind:?} cannot be combined with `added_kv_proj_dim` (diffusers raises ValueError)"),
            ))
        }
    }
    Ok(())
}

/// `x.repeat_interleave(repeats, dim)`.
fn repeat_interleave(x: &Tensor, repeats: usize, dim: usize) -> candle_core::Result<Tensor> {
    if repeats == 1 {
        return Ok(x.clone());
    }
    let mut expanded = x.dims().to_vec();
    expanded.insert(dim + 1, repeats);
    let mut out = x.dims().to_vec();
    out[dim] *= repeats;
    x.unsqueeze(dim + 1)?.broadcast_as(expanded)?.contiguous()?.reshape(out)
}

impl Attention {
    pub const BLOCK: &'static str = "diffusers.Attention";

    pub fn new(vb: VarBuilder, cfg: &AttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let joint = [
            ("out_context_dim", cfg.out_context_dim.is_some()),
            ("context_pre_only", cfg.context_pre_only.is_some()),
            ("pre_only", cfg.pre_only),
        ];
        if let Some((name, _)) = joint.iter().find(|(_, set)| *set) {
            return Err(Error::unsupported(
                block,
                format!(
                    "`{name}` belongs to the joint-attention processors (JointAttnProcessor2_0 and \
                     relatives: add_q_proj, to_add_out), which are not implemented"
                ),
            ));
        }
        if cfg.dim_head == 0 {
            return Err(Error::config(block, "`dim_head` must be positive"));
        }
        if cfg.only_cross_attention && cfg.added_kv_proj_dim.is_none() {
            return Err(Error::config(
                block,
                "`only_cross_attention` can only be set to True if `added_kv_proj_dim` is not None",
            ));
        }
        // diffusers: inner_dim = out_dim or dim_head * heads; heads = out_dim // dim_head.
        let (inner_dim, heads) = match cfg.out_dim {
            Some(out_dim) => (out_dim, out_dim / cfg.dim_head),
            None => (cfg.dim_head * cfg.heads, cfg.heads),
        };
        if heads == 0 || !inner_dim.is_multiple_of(heads) {
            return Err(Error::config(
                block,
                format!("{heads} heads do not divide the inner dim {inner_dim}"),
            ));
        }
        let head_dim = inner_dim / heads;
        let processor = cfg.resolved_processor();
        let inner_kv_dim = cfg.kv_heads.map_or(inner_dim, |kv| cfg.dim_head * kv);
        if inner_kv_dim != inner_dim {
            return Err(Error::unsupported(
                block,
                format!(
                    "kv_heads={:?} gives keys/values of {inner_kv_dim} features for queries of {inner_dim}; \
                     diffusers' {processor:?} splits both into the same {heads} heads and fails on this config",
                    cfg.kv_heads
                ),
            ));
        }
        let out_features = cfg.out_dim.unwrap_or(cfg.query_dim);
        let cross_dim = cfg.cross_attention_dim.unwrap_or(cfg.query_dim);
        if processor.is_added_kv() {
            let Some(_) = cfg.added_kv_proj_dim else {
                return Err(Error::config(
                    block,
                    format!("{processor:?} needs `added_kv_proj_dim` (it calls add_k_proj/add_v_proj)"),
                ));
            };
            if cfg.norm_num_groups.is_none() {
                return Err(Error::config(
                    block,
                    format!("{processor:?} always applies `group_norm` and needs `norm_num_groups`"),
                ));
            }
            if out_features != cfg.query_dim {
                return Err(Error::config(
                    block,
                    format!(
                        "{processor:?} reshapes its output ({out_features} channels) to the input's shape \
                         ({} channels) and fails unless out_dim == query_dim",
                        cfg.query_dim
                    ),
                ));
            }
            if processor == Processor::AttnAddedKVProcessor2_0 && inner_dim != cfg.query_dim {
                return Err(Error::config(
                    block,
                    format!(
                        "AttnAddedKVProcessor2_0 merges heads into query_dim ({}) channels and fails unless \
                         the inner dim ({inner_dim}) equals it",
                        cfg.query_dim
                    ),
                ));
            }
            if cfg.cross_attention_norm == Some(CrossAttentionNorm::LayerNorm)
                && cfg.added_kv_proj_dim != Some(cross_dim)
            {
                return Err(Error::config(
                    block,
                    format!(
                        "cross_attention_norm LayerNorm({cross_dim}) is applied to the added_kv_proj_dim-wide \
                         ({:?}) context and fails unless they are equal",
                        cfg.added_kv_proj_dim
                    ),
                ));
            }
        } else if cfg.added_kv_proj_dim.is_some() {
            return Err(Error::unsupported(
                block,
                format!(
                    "`added_kv_proj_dim` is only read by AttnAddedKVProcessor / AttnAddedKVProcessor2_0; \
                     {processor:?} would ignore add_k_proj/add_v_proj (set `processor`)"
                ),
            ));
        }
        if let Some(QkNorm::LayerNormAcrossHeads | QkNorm::RmsNormAcrossHeads) = cfg.qk_norm {
            if cfg.kv_heads.is_none() {
                return Err(Error::config(
                    block,
                    format!(
                        "qk_norm {:?} sizes norm_k as dim_head * kv_heads and needs `kv_heads` (diffusers fails without it)",
                        cfg.qk_norm.unwrap_or(QkNorm::L2)
                    ),
                ));
            }
        }
        if let (Some(kind @ (QkNorm::LayerNormAcrossHeads | QkNorm::L2)), Some(_)) =
            (cfg.qk_norm, cfg.added_kv_proj_dim)
        {
            return Err(Error::config(
                block,
                format!("qk_norm {kind:?} cannot be combined with `added_kv_proj_dim` (diffusers raises ValueError)"),
            ));
        }
        if let (Processor::AttnProcessor2_0, Some(kind)) = (processor, cfg.qk_norm) {
            // AttnProcessor2_0 applies norm_q/norm_k to (B, heads, N, head_dim).
            let sizes = match kind {
                QkNorm::LayerNorm | QkNorm::Fp32LayerNorm | QkNorm::RmsNorm => Some((cfg.dim_head, cfg.dim_head)),
                QkNorm::LayerNormAcrossHeads | QkNorm::RmsNormAcrossHeads => Some((
                    cfg.dim_head * cfg.heads,
                    cfg.dim_head * cfg.kv_heads.unwrap_or(cfg.heads),
                )),
                QkNorm::L2 => None,
            };
            if let Some((q, k)) = sizes {
                if q != head_dim || k != head_dim {
                    return Err(Error::config(
                        block,
                        format!(
                            "qk_norm {kind:?} normalises {q}/{k} features but AttnProcessor2_0 applies it to \
                             heads of {head_dim}; diffusers fails on this config"
                        ),
                    ));
                }
            }
        }

        let scale = match processor {
            // SDPA's default scale uses the per-head dim of the key projection.
            Processor::AttnProcessor2_0 | Processor::AttnAddedKVProcessor2_0 => default_scale(head_dim),
            Processor::AttnProcessor | Processor::AttnAddedKVProcessor if cfg.scale_qk => default_scale(cfg.dim_head),
            Processor::AttnProcessor | Processor::AttnAddedKVProcessor => 1.0,
            // ldm: self.scale = dim_head ** -0.5
            Processor::Ldm => default_scale(cfg.dim_head),
        };
        let group_norm = match cfg.norm_num_groups {
            Some(groups) => Some(group_norm(vb.pp("group_norm"), block, groups, cfg.query_dim, cfg.eps)?),
            None => None,
        };
        let spatial_norm = match cfg.spatial_norm_dim {
            Some(zq) => {
                let norm = SpatialNorm::load(vb.pp("spatial_norm"), block, cfg.query_dim, zq)?;
                // The added-KV processors never call spatial_norm (and drop `temb`).
                (!processor.is_added_kv()).then_some(norm)
            }
            None => None,
        };
        let (norm_q, norm_k) = match cfg.qk_norm {
            Some(kind) => {
                let (q, k) = qk_norms(&vb, cfg, kind)?;
                if cfg.added_kv_proj_dim.is_some() {
                    load_added_qk_norms(&vb, cfg, kind)?;
                }
                // Only AttnProcessor2_0 applies them.
                if processor == Processor::AttnProcessor2_0 {
                    (Some(q), Some(k))
                } else {
                    (None, None)
                }
            }
            None => (None, None),
        };
        let norm_cross = match cfg.cross_attention_norm {
            None => None,
            Some(CrossAttentionNorm::LayerNorm) => Some(CrossNorm::Layer(LayerNorm::load(
                vb.pp("norm_cross"),
                cross_dim,
                1e-5,
                true,
            )?)),
            Some(CrossAttentionNorm::GroupNorm) => Some(CrossNorm::Group(crate::layers::group_norm(
                vb.pp("norm_cross"),
                block,
                cfg.cross_attention_norm_num_groups,
                cfg.added_kv_proj_dim.unwrap_or(cross_dim),
                1e-5,
            )?)),
        };
        let legacy = vb.contains_tensor("query.weight");
        let [q, k, v, out] = if legacy {
            ["query", "key", "value", "proj_attn"]
        } else {
            ["to_q", "to_k", "to_v", "to_out.0"]
        };
        let to_q = Projection::load(vb.pp(q), block, cfg.query_dim, inner_dim, cfg.bias)?;
        let (to_k, to_v) = if cfg.only_cross_attention {
            (None, None)
        } else {
            (
                Some(Projection::load(vb.pp(k), block, cross_dim, inner_kv_dim, cfg.bias)?),
                Some(Projection::load(vb.pp(v), block, cross_dim, inner_kv_dim, cfg.bias)?),
            )
        };
        let (add_k_proj, add_v_proj) = match cfg.added_kv_proj_dim {
            Some(added) => (
                Some(Projection::load(
                    vb.pp("add_k_proj"),
                    block,
                    added,
                    inner_kv_dim,
                    cfg.added_proj_bias,
                )?),
                Some(Projection::load(
                    vb.pp("add_v_proj"),
                    block,
                    added,
                    inner_kv_dim,
                    cfg.added_proj_bias,
                )?),
            ),
            None => (None, None),
        };
        let to_out = Projection::load(vb.pp(out), block, inner_dim, out_features, cfg.out_bias)?;
        Ok(Self {
            processor,
            group_norm,
            spatial_norm,
            norm_cross,
            norm_q,
            norm_k,
            to_q,
            to_k,
            to_v,
            add_k_proj,
            add_v_proj,
            to_out,
            heads,
            scale,
            query_dim: cfg.query_dim,
            context_dim: cfg.added_kv_proj_dim.unwrap_or(cross_dim),
            residual_connection: cfg.residual_connection,
            rescale_output_factor: cfg.rescale_output_factor,
            upcast_attention: cfg.upcast_attention,
            upcast_softmax: cfg.upcast_softmax,
        })
    }

    /// The processor this block runs.
    pub fn processor(&self) -> Processor {
        self.processor
    }

    /// `forward(hidden_states, encoder_hidden_states=None, attention_mask=None)`.
    ///
    /// `hidden_states`: `(B, N, query_dim)` or `(B, query_dim, H, W)` (the added-KV processors
    /// read any input as channels-first `(B, query_dim, ...)`); `encoder_hidden_states`:
    /// `(B, S, cross_attention_dim)` (`added_kv_proj_dim` wide for the added-KV processors);
    /// `attention_mask`: additive float or (SDPA processors only) boolean, shaped as diffusers'
    /// `prepare_attention_mask` takes it, e.g. `(B, S)`, `(B, 1, S)`, `(B, N, S)` or
    /// `(B·heads, ·, S)`.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        self.forward_with_temb(hidden_states, encoder_hidden_states, attention_mask, None)
    }

    /// [`Attention::forward`] with the processors' `temb` argument: the `zq` map
    /// `(B, spatial_norm_dim, h, w)` that `spatial_norm` conditions on (nearest-interpolated to
    /// the input's `(H, W)`). Required when `spatial_norm_dim` is set under
    /// `AttnProcessor2_0`/`AttnProcessor`; ignored otherwise, as in diffusers.
    pub fn forward_with_temb(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        temb: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        if let Some(context) = encoder_hidden_states {
            self.check_context(hidden_states, context)?;
        }
        if self.processor.is_added_kv() {
            self.forward_added_kv(hidden_states, encoder_hidden_states, attention_mask)
        } else {
            self.forward_standard(hidden_states, encoder_hidden_states, attention_mask, temb)
        }
    }

    fn check_context(&self, hidden_states: &Tensor, context: &Tensor) -> Result<()> {
        let batch = hidden_states.dims().first().copied().unwrap_or(0);
        if context.rank() != 3 || context.dim(0)? != batch || context.dim(2)? != self.context_dim {
            return Err(Error::input(
                Self::BLOCK,
                "encoder_hidden_states",
                format!(
                    "expected (B={batch}, S, {}), found {:?}",
                    self.context_dim,
                    context.dims()
                ),
            ));
        }
        Ok(())
    }

    /// `AttnProcessor2_0` / `AttnProcessor`.
    fn forward_standard(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        temb: Option<&Tensor>,
    ) -> Result<Tensor> {
        let block = Self::BLOCK;
        let residual = hidden_states;
        let channels_ok =
            hidden_states.dims().get(if hidden_states.rank() == 4 { 1 } else { 2 }) == Some(&self.query_dim);
        if !matches!(hidden_states.rank(), 3 | 4) || !channels_ok {
            return Err(Error::input(
                block,
                "hidden_states",
                format!(
                    "expected (B, N, {0}) or (B, {0}, H, W), found {1:?}",
                    self.query_dim,
                    hidden_states.dims()
                ),
            ));
        }
        let normed;
        let mut x = hidden_states;
        if let Some(spatial_norm) = &self.spatial_norm {
            let zq = temb.ok_or_else(|| {
                Error::input(block, "temb", "spatial_norm (spatial_norm_dim) needs the zq map `temb`")
            })?;
            if x.rank() != 4 || zq.rank() != 4 {
                return Err(Error::input(
                    block,
                    "temb",
                    format!(
                        "spatial_norm needs a (B, C, H, W) input and a (B, zq, h, w) temb, found {:?} and {:?}",
                        x.dims(),
                        zq.dims()
                    ),
                ));
            }
            normed = spatial_norm.forward(x, zq)?;
            trace::record("spatial_norm", &normed);
            x = &normed;
        }
        let image = match x.rank() {
            4 => Some(x.dims4()?),
            _ => None,
        };
        let mut hs = match image {
            Some(_) => image_to_tokens(x)?,
            None => x.clone(),
        };
        let (batch, q_len) = (hs.dim(0)?, hs.dim(1)?);
        let kv_len = encoder_hidden_states.map_or(Ok(q_len), |c| c.dim(1))?;
        let mask = match attention_mask {
            Some(m) => Some(self.attention_mask(m, kv_len, batch, q_len, kv_len)?),
            None => None,
        };
        if let Some(gn) = &self.group_norm {
            // group_norm(hidden_states.transpose(1, 2)): stage `norm` is (B, C, N).
            let normed = gn.forward(&hs.transpose(1, 2)?)?;
            trace::record("norm", &normed);
            hs = normed.transpose(1, 2)?;
        }
        // PyTorch holds the tokens as a transposed view after `view(B, C, -1).transpose(1, 2)`
        // or `group_norm(h.transpose(1, 2)).transpose(1, 2)`: its Linear then rounds twice.
        let hs_strided = image.is_some() || self.group_norm.is_some();
        // One contiguous copy of a strided view for the three projections (each would make its
        // own); the rounding the flag selects does not depend on the layout.
        if hs_strided {
            hs = contiguous(&hs)?;
        }
        // Every intermediate (tokens, q, k, v, the heads' output) is dropped as soon as the
        // next step has its result: at 128×128 tokens each is 32 MiB.
        let merged = {
            let hs = hs;
            let query = linear(&self.to_q, &hs, hs_strided)?;
            let (context, context_strided) = match (encoder_hidden_states, &self.norm_cross) {
                (None, _) => (hs.clone(), hs_strided),
                (Some(c), Some(norm)) => (norm.forward(c)?, matches!(norm, CrossNorm::Group(_))),
                (Some(c), None) => (c.clone(), false),
            };
            let (to_k, to_v) = match (&self.to_k, &self.to_v) {
                (Some(k), Some(v)) => (k, v),
                _ => unreachable!("only_cross_attention is rejected without the added-KV processors"),
            };
            let key = linear(to_k, &context, context_strided)?;
            let value = linear(to_v, &context, context_strided)?;
            let mut q = split_tokens(&query, self.heads)?;
            let mut k = split_tokens(&key, self.heads)?;
            let v = split_tokens(&value, self.heads)?;
            if let Some(norm) = &self.norm_q {
                q = norm.forward(&q)?;
            }
            if let Some(norm) = &self.norm_k {
                k = norm.forward(&k)?;
            }
            trace::record_qkv(&q, &k, &v);
            let out = self.attend(&q, &k, &v, mask.as_ref())?;
            merge_tokens(&out)
        }?;
        trace::record("attn", &merged);
        let mut out = self.to_out.forward_tokens(&merged)?;
        drop(merged);
        trace::record("proj", &out);
        if let Some((_, _, h, w)) = image {
            out = tokens_to_image(&out, h, w)?;
        }
        if self.residual_connection {
            out = (out + residual)?;
        }
        // hidden_states / attn.rescale_output_factor
        let out = div(&out, self.rescale_output_factor)?;
        trace::record("output", &out);
        Ok(out)
    }

    /// `AttnAddedKVProcessor2_0` / `AttnAddedKVProcessor`.
    fn forward_added_kv(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let block = Self::BLOCK;
        let residual = hidden_states;
        if hidden_states.rank() < 2 || hidden_states.dim(1)? != self.query_dim {
            return Err(Error::input(
                block,
                "hidden_states",
                format!(
                    "{:?} reads the input channels-first: expected (B, {}, ...), found {:?}",
                    self.processor,
                    self.query_dim,
                    hidden_states.dims()
                ),
            ));
        }
        // hidden_states.view(B, C, -1).transpose(1, 2)
        let (batch, channels) = (hidden_states.dim(0)?, hidden_states.dim(1)?);
        let hs = hidden_states.reshape((batch, channels, ()))?.transpose(1, 2)?;
        let q_len = hs.dim(1)?;
        let (context, context_strided) = match (encoder_hidden_states, &self.norm_cross) {
            (None, _) => {
                if channels != self.context_dim {
                    return Err(Error::input(
                        block,
                        "encoder_hidden_states",
                        format!(
                            "without encoder_hidden_states add_k_proj reads the {channels}-channel input, \
                             but added_kv_proj_dim is {}",
                            self.context_dim
                        ),
                    ));
                }
                (hs.clone(), true)
            }
            (Some(c), Some(norm)) => (norm.forward(c)?, matches!(norm, CrossNorm::Group(_))),
            (Some(c), None) => (c.clone(), false),
        };
        let group_norm = self
            .group_norm
            .as_ref()
            .expect("the added-KV processors require group_norm (checked in new)");
        let normed = group_norm.forward(&hs.transpose(1, 2)?)?;
        trace::record("norm", &normed);
        // hidden_states.view(B, C, -1).transpose(1, 2): a transposed view, as after group_norm
        // (the strided projections keep its rounding); copied once for its three projections.
        let hs = contiguous(&normed.transpose(1, 2)?)?;
        let q = split_tokens(&self.to_q.forward_tokens_strided(&hs)?, self.heads)?;
        let (add_k, add_v) = match (&self.add_k_proj, &self.add_v_proj) {
            (Some(k), Some(v)) => (k, v),
            _ => unreachable!("the added-KV processors require added_kv_proj_dim (checked in new)"),
        };
        let ek = split_tokens(&linear(add_k, &context, context_strided)?, self.heads)?;
        let ev = split_tokens(&linear(add_v, &context, context_strided)?, self.heads)?;
        let (k, v) = match (&self.to_k, &self.to_v) {
            (Some(to_k), Some(to_v)) => {
                let k = split_tokens(&to_k.forward_tokens_strided(&hs)?, self.heads)?;
                let v = split_tokens(&to_v.forward_tokens_strided(&hs)?, self.heads)?;
                // [context tokens | self tokens]
                (Tensor::cat(&[&ek, &k], 2)?, Tensor::cat(&[&ev, &v], 2)?)
            }
            _ => (ek, ev),
        };
        trace::record_qkv(&q, &k, &v);
        let kv_len = k.dim(2)?;
        let mask = match attention_mask {
            // prepare_attention_mask(attention_mask, sequence_length=N, batch_size)
            Some(m) => Some(self.attention_mask(m, q_len, batch, q_len, kv_len)?),
            None => None,
        };
        let out = merge_tokens(&self.attend(&q, &k, &v, mask.as_ref())?)?;
        trace::record("attn", &out);
        let out = self.to_out.forward_tokens(&out)?;
        trace::record("proj", &out);
        let out = (out.transpose(1, 2)?.reshape(residual.shape())? + residual)?;
        trace::record("output", &out);
        Ok(out)
    }

    /// The processor's attention on `(B, heads, tokens, head_dim)` q/k/v with a prepared additive
    /// mask `(B, heads, Lq, Lk)`, with the processor's rounding in f16/bf16.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> candle_core::Result<Tensor> {
        match self.processor {
            // F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
            Processor::AttnProcessor2_0 | Processor::AttnAddedKVProcessor2_0 => sdpa(q, k, v, mask, self.scale),
            Processor::AttnProcessor | Processor::AttnAddedKVProcessor => {
                trace_probs(q, k, mask, Scale::Mul(self.scale));
                get_attention_scores_bmm(q, k, v, mask, self.scale, self.upcast_attention, self.upcast_softmax)
            }
            Processor::Ldm => {
                if mask.is_none() {
                    trace_probs(q, k, None, Scale::Mul(self.scale));
                }
                // sim = einsum('b i d, b j d -> b i j', q, k) * self.scale
                let sim = Scale::Mul(self.scale).apply(&matmul(q, &k.t()?)?)?;
                // sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)
                let sim = match mask {
                    Some(m) => {
                        let fill = match sim.dtype() {
                            DType::F64 => Tensor::full(lowest(DType::F64), (), sim.device())?,
                            // Exact in f32 for f32/f16/bf16 (and Metal has no f64 tensors).
                            dtype => Tensor::full(lowest(dtype) as f32, (), sim.device())?.to_dtype(dtype)?,
                        }
                        .broadcast_as(sim.shape())?;
                        m.eq(0f64)?.where_cond(&sim, &fill)?
                    }
                    None => sim,
                };
                // attn = sim.softmax(dim=-1); out = einsum('b i j, b j d -> b i d', attn, v)
                matmul(&softmax(&sim, D::Minus1)?, v)
            }
        }
    }

    /// diffusers' `prepare_attention_mask(mask, target_len, batch)` (with its quirk of padding
    /// by `target_len`, not the difference, and padding bool masks with False) followed by the
    /// processor's own reshape and the broadcast its attention kernel applies; returns an
    /// additive mask of shape `(B, heads, q_len, kv_len)`.
    fn attention_mask(
        &self,
        mask: &Tensor,
        target_len: usize,
        batch: usize,
        q_len: usize,
        kv_len: usize,
    ) -> Result<Tensor> {
        let block = Self::BLOCK;
        let bad = |message: String| Error::input(block, "attention_mask", message);
        let is_bool = mask.dtype() == DType::U8;
        if !is_bool && !mask.dtype().is_float() {
            return Err(bad(format!("expected a float or bool mask, found {:?}", mask.dtype())));
        }
        if is_bool && !self.processor.is_sdpa() {
            return Err(bad(format!(
                "a boolean mask is not accepted by {:?} (baddbmm needs a float mask)",
                self.processor
            )));
        }
        if mask.rank() == 0 {
            return Err(bad("expected at least one dimension".to_string()));
        }
        let heads = self.heads;
        let last = mask.rank() - 1;
        let mut m = mask.clone();
        if m.dim(last)? != target_len {
            // F.pad(mask, (0, target_len), value=0.0): False for bool masks.
            m = m.pad_with_zeros(last, 0, target_len)?;
        }
        let shape_err = |m: &Tensor, what: &str| {
            bad(format!(
                "{:?} cannot use a mask of shape {:?} (prepared to {:?}) for {what} \
                 (batch {batch}, heads {heads}, {q_len} queries, {kv_len} keys)",
                self.processor,
                mask.dims(),
                m.dims()
            ))
        };
        let m = match self.processor {
            Processor::AttnProcessor
            | Processor::AttnAddedKVProcessor
            | Processor::AttnProcessor2_0
            | Processor::Ldm => {
                // out_dim=3: repeat_interleave(heads, dim=0) when shape[0] < batch * heads.
                if m.dim(0)? < batch * heads {
                    m = repeat_interleave(&m, heads, 0)?;
                }
                if matches!(self.processor, Processor::AttnProcessor2_0 | Processor::Ldm) {
                    // attention_mask.view(batch, heads, -1, attention_mask.shape[-1])
                    let l = m.dim(m.rank() - 1)?;
                    let n = m.elem_count();
                    if batch * heads * l == 0 || !n.is_multiple_of(batch * heads * l) {
                        return Err(shape_err(&m, "view(batch, heads, -1, S)"));
                    }
                    m.reshape((batch, heads, n / (batch * heads * l), l))?
                } else {
                    // baddbmm broadcasts its input against (batch * heads, q_len, kv_len).
                    if m.rank() > 3 {
                        return Err(shape_err(&m, "baddbmm"));
                    }
                    m.broadcast_as((batch * heads, q_len, kv_len))
                        .map_err(|_| shape_err(&m, "baddbmm"))?
                        .contiguous()?
                        .reshape((batch, heads, q_len, kv_len))?
                }
            }
            Processor::AttnAddedKVProcessor2_0 => {
                // out_dim=4: unsqueeze(1).repeat_interleave(heads, dim=1).
                repeat_interleave(&m.unsqueeze(1)?, heads, 1)?
            }
        };
        let m = if is_bool {
            // SDPA: True attends, False is -inf.
            let zeros = Tensor::zeros(m.shape(), DType::F32, m.device())?;
            let neg = Tensor::full(f32::NEG_INFINITY, m.shape(), m.device())?;
            m.where_cond(&zeros, &neg)?
        } else {
            m
        };
        if m.rank() > 4 {
            return Err(shape_err(&m, "scaled_dot_product_attention"));
        }
        let full = (batch, heads, q_len, kv_len);
        m.broadcast_as(full)
            .map_err(|_| shape_err(&m, "scaled_dot_product_attention"))
    }
}

/// `proj(x)`, where PyTorch's `x` is a non-contiguous view when `strided`
/// ([`Projection::forward_tokens_strided`]).
fn linear(proj: &Projection, x: &Tensor, strided: bool) -> candle_core::Result<Tensor> {
    if strided {
        proj.forward_tokens_strided(x)
    } else {
        proj.forward_tokens(x)
    }
}

/// `-torch.finfo(dtype).max`.
fn lowest(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => -65504.0,
        DType::BF16 => -3.389_531_389_251_535_5e38,
        DType::F32 => -f64::from(f32::MAX),
        _ => -f64::MAX,
    }
}

/// diffusers' `Attention.get_attention_scores` followed by `torch.bmm(attention_probs, value)`
/// (`AttnProcessor`, `AttnAddedKVProcessor`), with its casts:
/// `upcast_attention` → q, k `.float()`; scores = `baddbmm(mask, q, kᵀ, beta, alpha=scale)`
/// (one rounding to q's dtype); `upcast_softmax` → scores `.float()`; softmax; probabilities
/// `.to(dtype)` **before** the `bmm` with v. "float" is at least f32: a float64 run stays
/// float64, as the reference's float64 copy (its upcasts switched off) does.
fn get_attention_scores_bmm(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    upcast_attention: bool,
    upcast_softmax: bool,
) -> candle_core::Result<Tensor> {
    let dtype = q.dtype();
    let (q, k) = if upcast_attention {
        (upcast(q)?, upcast(k)?)
    } else {
        (q.clone(), k.clone())
    };
    let scores_dtype = q.dtype();
    // alpha·(q·kᵀ) + beta·mask in at least f32, rounded once.
    let mut scores = (upcast(&q)?.contiguous()?.matmul(&upcast(&k)?.t()?.contiguous()?)? * scale)?;
    if let Some(m) = mask {
        scores = scores.broadcast_add(&upcast(m)?)?;
    }
    let scores = scores.to_dtype(scores_dtype)?;
    let scores = if upcast_softmax { upcast(&scores)? } else { scores };
    let probs = softmax(&scores, D::Minus1)?.to_dtype(dtype)?;
    matmul(&probs, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use candle_core::Device;
    use serde_json::json;
    use std::collections::HashMap;

    fn cfg(value: serde_json::Value) -> AttentionConfig {
        from_json(Attention::BLOCK, &value).unwrap()
    }

    fn empty() -> VarBuilder<'static> {
        VarBuilder::from_tensors(HashMap::new(), DType::F32, &Device::Cpu)
    }

    fn err(value: serde_json::Value) -> String {
        Attention::new(empty(), &cfg(value)).unwrap_err().to_string()
    }

    /// Random weights under the given names and shapes.
    fn weights(entries: &[(&str, &[usize])]) -> VarBuilder<'static> {
        let dev = Device::Cpu;
        let ts = entries
            .iter()
            .map(|(name, shape)| (name.to_string(), Tensor::randn(0f32, 0.3, *shape, &dev).unwrap()))
            .collect::<HashMap<_, _>>();
        VarBuilder::from_tensors(ts, DType::F32, &dev)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn new_gives_the_diffusers_defaults() {
        let parsed = cfg(json!({"query_dim": 320}));
        let built = AttentionConfig::new(320);
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
        assert_eq!(built.resolved_processor(), Processor::AttnProcessor2_0);
        let classic = AttentionConfig {
            scale_qk: false,
            ..AttentionConfig::new(8)
        };
        assert_eq!(classic.resolved_processor(), Processor::AttnProcessor);
    }

    #[test]
    fn unknown_kinds_are_config_errors() {
        let e = from_json::<AttentionConfig>(Attention::BLOCK, &json!({"query_dim": 8, "qk_norm": "batch_norm"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid config") && e.contains("batch_norm"), "{e}");
        let e = from_json::<AttentionConfig>(
            Attention::BLOCK,
            &json!({"query_dim": 8, "cross_attention_norm": "rms_norm"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rms_norm"), "{e}");
        let e = from_json::<AttentionConfig>(Attention::BLOCK, &json!({"query_dim": 8, "processor": "XFormers"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("XFormers"), "{e}");
    }

    #[test]
    fn joint_attention_options_are_rejected() {
        for extra in [
            json!({"out_context_dim": 16}),
            json!({"context_pre_only": false}),
            json!({"pre_only": true}),
        ] {
            let mut c = json!({"query_dim": 16, "heads": 2, "dim_head": 8});
            c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let e = err(c);
            assert!(e.contains("not supported") && e.contains("joint-attention"), "{e}");
        }
    }

    #[test]
    fn kv_heads_only_when_it_matches_the_query_heads() {
        let e = err(json!({"query_dim": 16, "heads": 4, "kv_heads": 2, "dim_head": 4}));
        assert!(e.contains("not supported") && e.contains("kv_heads"), "{e}");
        let vb = weights(&[
            ("to_q.weight", &[16, 16]),
            ("to_k.weight", &[16, 16]),
            ("to_v.weight", &[16, 16]),
            ("to_out.0.weight", &[16, 16]),
            ("to_out.0.bias", &[16]),
        ]);
        let c = cfg(json!({"query_dim": 16, "heads": 4, "kv_heads": 4, "dim_head": 4}));
        Attention::new(vb, &c).unwrap();
    }

    #[test]
    fn added_kv_options_need_the_added_kv_processors() {
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "only_cross_attention": true}));
        assert!(e.contains("only_cross_attention"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12}));
        assert!(e.contains("not supported") && e.contains("AttnAddedKVProcessor"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "processor": "AttnProcessor"}),
        );
        assert!(e.contains("not supported"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "norm_num_groups": 4,
                           "processor": "AttnAddedKVProcessor2_0"}));
        assert!(e.contains("added_kv_proj_dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "processor": "AttnAddedKVProcessor"}),
        );
        assert!(e.contains("norm_num_groups"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "out_dim": 8, "processor": "AttnAddedKVProcessor"}),
        );
        assert!(e.contains("out_dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 4, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "processor": "AttnAddedKVProcessor2_0"}),
        );
        assert!(e.contains("inner dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "cross_attention_norm": "layer_norm",
                           "processor": "AttnAddedKVProcessor2_0"}),
        );
        assert!(e.contains("LayerNorm(16)"), "{e}");
    }

    #[test]
    fn qk_norm_shapes_diffusers_cannot_run_are_rejected() {
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "qk_norm": "rms_norm_across_heads"}));
        assert!(e.contains("kv_heads"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "kv_heads": 2, "dim_head": 8,
                           "qk_norm": "layer_norm_across_heads"}));
        assert!(e.contains("heads of 8"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "qk_norm": "l2",
                           "added_kv_proj_dim": 16, "norm_num_groups": 4,
                           "processor": "AttnAddedKVProcessor"}));
        assert!(e.contains("ValueError"), "{e}");
        // out_dim makes the head dim differ from dim_head: norm_q(LayerNorm(dim_head)) fails.
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 5, "out_dim": 12, "qk_norm": "layer_norm"}));
        assert!(e.contains("heads of 6"), "{e}");
    }

    #[test]
    fn attn_processor_loads_but_ignores_qk_norm() {
        let entries: Vec<(&str, &[usize])> = vec![
            ("to_q.weight", &[16, 16]),
            ("to_k.weight", &[16, 16]),
            ("to_v.weight", &[16, 16]),
            ("to_out.0.weight", &[16, 16]),
            ("to_out.0.bias", &[16]),
            ("norm_q.weight", &[8]),
            ("norm_q.bias", &[8]),
            ("norm_k.weight", &[8]),
            ("norm_k.bias", &[8]),
        ];
        let vb = weights(&entries);
        let x = Tensor::randn(0f32, 1., (2, 5, 16), &Device::Cpu).unwrap();
        let base = json!({"query_dim": 16, "heads": 2, "dim_head": 8, "processor": "AttnProcessor"});
        let plain = Attention::new(vb.clone(), &cfg(base.clone())).unwrap();
        let mut with_norm = base.clone();
        with_norm["qk_norm"] = json!("layer_norm");
        let ignored = Attention::new(vb.clone(), &cfg(with_norm.clone())).unwrap();
        assert_eq!(
            max_diff(
                &plain.forward(&x, None, None).unwrap(),
                &ignored.forward(&x, None, None).unwrap()
            ),
            0.0
        );
        with_norm["processor"] = json!("AttnProcessor2_0");
        let applied = Attention::new(vb, &cfg(with_norm)).unwrap();
        assert!(
            max_diff(
                &plain.forward(&x, None, None).unwrap(),
                &applied.forward(&x, None, None).unwrap()
            ) > 1e-3
        );
    }

    #[test]
    fn spatial_norm_needs_temb() {
        let vb = weights(&[
            ("to_q.weight", &[32, 32]),
            ("to_k.weight", &[32, 32]),
            ("to_v.weight", &[32, 32]),
            ("to_out.0.weight", &[32, 32]),
            ("to_out.0.bias", &[32]),
            ("spatial_norm.norm_layer.weight", &[32]),
            ("spatial_norm.norm_layer.bias", &[32]),
            ("spatial_norm.conv_y.weight", &[32, 4, 1, 1]),
            ("spatial_norm.conv_y.bias", &[32]),
            ("spatial_norm.conv_b.weight", &[32, 4, 1, 1]),
            ("spatial_norm.conv_b.bias", &[32]),
        ]);
        let a = Attention::new(
            vb,
            &cfg(json!({"query_dim": 32, "heads": 1, "dim_head": 32, "spatial_norm_dim": 4})),
        )
        .unwrap();
        let x = Tensor::randn(0f32, 1., (2, 32, 3, 5), &Device::Cpu).unwrap();
        let e = a.forward(&x, None, None).unwrap_err().to_string();
        assert!(e.contains("temb"), "{e}");
        let zq = Tensor::randn(0f32, 1., (2, 4, 2, 2), &Device::Cpu).unwrap();
        let y = a.forward_with_temb(&x, None, None, Some(&zq)).unwrap();
        assert_eq!(y.dims(), x.dims());
    }

    #[test]
    fn mask_preparation_follows_diffusers() {
        let dev = Device::Cpu;
        let vb = weights(&[
            ("to_q.weight", &[6, 6]),
            ("to_k.weight", &[6, 6]),
            ("to_v.weight", &[6, 6]),
            ("to_out.0.weight", &[6, 6]),
            ("to_out.0.bias", &[6]),
        ]);
        let a = Attention::new(
            vb.clone(),
            &cfg(json!({"query_dim": 6, "heads": 3, "dim_head": 2, "processor": "AttnProcessor"})),
        )
        .unwrap();
        // (B=1, S=4) float mask: repeat_interleave to (3, 4), which baddbmm broadcasts as rows of
        // the query axis: only valid when batch * heads == q_len (here 3).
        let m = Tensor::new(&[[0f32, -1., -2., -3.]], &dev).unwrap();
        let p = a.attention_mask(&m, 4, 1, 3, 4).unwrap();
        assert_eq!(p.dims(), &[1, 3, 3, 4]);
        let e = a.attention_mask(&m, 4, 1, 5, 4).unwrap_err().to_string();
        assert!(e.contains("baddbmm"), "{e}");
        let b = Tensor::new(&[[1u8, 0, 1, 1]], &dev).unwrap();
        assert!(a.attention_mask(&b, 4, 1, 3, 4).is_err());
        // Under SDPA a bool mask padded by the quirk gets False (-inf) in the new columns.
        let s = Attention::new(
            vb,
            &cfg(json!({"query_dim": 6, "heads": 3, "dim_head": 2, "processor": "AttnProcessor2_0"})),
        )
        .unwrap();
        let b = Tensor::new(&[[[1u8, 0]]], &dev).unwrap();
        let p = s.attention_mask(&b, 2, 1, 3, 2).unwrap();
        let row = p
            .get(0)
            .unwrap()
            .get(2)
            .unwrap()
            .get(1)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(row, vec![0.0, f32::NEG_INFINITY]);
        assert_eq!(
            repeat_interleave(&Tensor::new(&[1f32, 2.], &dev).unwrap(), 2, 0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![1., 1., 2., 2.]
        );
    }

    #[test]
    fn nearest_interpolation_indices_match_torch() {
        // F.interpolate(torch.arange(n).view(1, 1, 1, n), size=(1, m), mode="nearest").
        use crate::layers::nearest_source_indices;
        assert_eq!(nearest_source_indices(7, 3), vec![0, 2, 4]);
        assert_eq!(nearest_source_indices(3, 10), vec![0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
        assert_eq!(nearest_source_indices(3, 7), vec![0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(nearest_source_indices(3, 6), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(nearest_source_indices(4, 4), vec![0, 1, 2, 3]);
    }
}

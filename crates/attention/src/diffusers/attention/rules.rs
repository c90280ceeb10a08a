//! The rules [`super::Attention::new`] applies before loading a weight: which configs are
//! rejected, and the sizes and scale a valid one resolves to. They mirror diffusers 0.42.1
//! `Attention.__init__` (`inner_dim`, `heads`, `inner_kv_dim`, the `qk_norm` and
//! `added_kv_proj_dim` checks) and the configs on which the chosen processor
//! (`AttnProcessor2_0`, `AttnProcessor`, `AttnAddedKVProcessor[2_0]`) would fail in diffusers.

use super::config::{AttentionConfig, CrossAttentionNorm, Processor, QkNorm};
use super::Attention;
use crate::sdpa::default_scale;
use crate::{Error, Result};

/// What a config resolves to once every rule holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resolved {
    pub(super) processor: Processor,
    pub(super) heads: usize,
    /// `out_dim or dim_head * heads`: the width of `to_q` (and `to_out`'s input).
    pub(super) inner_dim: usize,
    /// `dim_head * kv_heads` (only accepted when it equals `inner_dim`).
    pub(super) inner_kv_dim: usize,
    /// `out_dim or query_dim`: the width of `to_out`.
    pub(super) out_features: usize,
    /// `cross_attention_dim or query_dim`: the width `to_k`/`to_v` read.
    pub(super) cross_dim: usize,
    pub(super) scale: f64,
}

/// Apply every rule to `cfg`, in the order diffusers would fail on them, and resolve its sizes.
pub(super) fn resolve(cfg: &AttentionConfig) -> Result<Resolved> {
    let block = Attention::BLOCK;
    reject_joint_attention(cfg)?;
    if cfg.dim_head == 0 {
        return Err(Error::config(block, "`dim_head` must be positive"));
    }
    if cfg.only_cross_attention && cfg.added_kv_proj_dim.is_none() {
        return Err(Error::config(
            block,
            "`only_cross_attention` can only be set to True if `added_kv_proj_dim` is not None",
        ));
    }
    let (inner_dim, heads) = inner_dim_and_heads(cfg)?;
    let head_dim = inner_dim / heads;
    let processor = cfg.resolved_processor();
    let inner_kv_dim = inner_kv_dim(cfg, processor, inner_dim, heads)?;
    let out_features = cfg.out_dim.unwrap_or(cfg.query_dim);
    let cross_dim = cfg.cross_attention_dim.unwrap_or(cfg.query_dim);
    check_added_kv(cfg, processor, inner_dim, out_features, cross_dim)?;
    check_qk_norm(cfg, processor, head_dim)?;
    Ok(Resolved {
        processor,
        heads,
        inner_dim,
        inner_kv_dim,
        out_features,
        cross_dim,
        scale: scale(cfg, processor, head_dim),
    })
}

/// `out_context_dim`, `context_pre_only` and `pre_only` belong to the joint-attention
/// processors, which are not implemented.
fn reject_joint_attention(cfg: &AttentionConfig) -> Result<()> {
    let joint = [
        ("out_context_dim", cfg.out_context_dim.is_some()),
        ("context_pre_only", cfg.context_pre_only.is_some()),
        ("pre_only", cfg.pre_only),
    ];
    match joint.iter().find(|(_, set)| *set) {
        Some((name, _)) => Err(Error::unsupported(
            Attention::BLOCK,
            format!(
                "`{name}` belongs to the joint-attention processors (JointAttnProcessor2_0 and \
                 relatives: add_q_proj, to_add_out), which are not implemented"
            ),
        )),
        None => Ok(()),
    }
}

/// diffusers: `inner_dim = out_dim or dim_head * heads`; `heads = out_dim // dim_head`.
fn inner_dim_and_heads(cfg: &AttentionConfig) -> Result<(usize, usize)> {
    let (inner_dim, heads) = match cfg.out_dim {
        Some(out_dim) => (out_dim, out_dim / cfg.dim_head),
        None => (cfg.dim_head * cfg.heads, cfg.heads),
    };
    if heads == 0 || !inner_dim.is_multiple_of(heads) {
        return Err(Error::config(
            Attention::BLOCK,
            format!("{heads} heads do not divide the inner dim {inner_dim}"),
        ));
    }
    Ok((inner_dim, heads))
}

/// `inner_kv_dim = inner_dim if kv_heads is None else dim_head * kv_heads`; every processor
/// here splits keys and values into the query heads, so any other width fails in diffusers.
fn inner_kv_dim(cfg: &AttentionConfig, processor: Processor, inner_dim: usize, heads: usize) -> Result<usize> {
    let inner_kv_dim = cfg.kv_heads.map_or(inner_dim, |kv| cfg.dim_head * kv);
    if inner_kv_dim != inner_dim {
        return Err(Error::unsupported(
            Attention::BLOCK,
            format!(
                "kv_heads={:?} gives keys/values of {inner_kv_dim} features for queries of {inner_dim}; \
                 diffusers' {processor:?} splits both into the same {heads} heads and fails on this config",
                cfg.kv_heads
            ),
        ));
    }
    Ok(inner_kv_dim)
}

/// `added_kv_proj_dim` only under the added-KV processors, and what those need to run.
fn check_added_kv(
    cfg: &AttentionConfig,
    processor: Processor,
    inner_dim: usize,
    out_features: usize,
    cross_dim: usize,
) -> Result<()> {
    let block = Attention::BLOCK;
    if !processor.is_added_kv() {
        if cfg.added_kv_proj_dim.is_some() {
            return Err(Error::unsupported(
                block,
                format!(
                    "`added_kv_proj_dim` is only read by AttnAddedKVProcessor / AttnAddedKVProcessor2_0; \
                     {processor:?} would ignore add_k_proj/add_v_proj (set `processor`)"
                ),
            ));
        }
        return Ok(());
    }
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
    if cfg.cross_attention_norm == Some(CrossAttentionNorm::LayerNorm) && cfg.added_kv_proj_dim != Some(cross_dim) {
        return Err(Error::config(
            block,
            format!(
                "cross_attention_norm LayerNorm({cross_dim}) is applied to the added_kv_proj_dim-wide \
                 ({:?}) context and fails unless they are equal",
                cfg.added_kv_proj_dim
            ),
        ));
    }
    Ok(())
}

/// The `qk_norm` kinds diffusers cannot build or run with this config.
fn check_qk_norm(cfg: &AttentionConfig, processor: Processor, head_dim: usize) -> Result<()> {
    let block = Attention::BLOCK;
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
    if let (Some(kind @ (QkNorm::LayerNormAcrossHeads | QkNorm::L2)), Some(_)) = (cfg.qk_norm, cfg.added_kv_proj_dim) {
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
    Ok(())
}

/// The scale of `q·kᵀ` the processor applies.
fn scale(cfg: &AttentionConfig, processor: Processor, head_dim: usize) -> f64 {
    match processor {
        // SDPA's default scale uses the per-head dim of the key projection.
        Processor::AttnProcessor2_0 | Processor::AttnAddedKVProcessor2_0 => default_scale(head_dim),
        Processor::AttnProcessor | Processor::AttnAddedKVProcessor if cfg.scale_qk => default_scale(cfg.dim_head),
        Processor::AttnProcessor | Processor::AttnAddedKVProcessor => 1.0,
        // ldm: self.scale = dim_head ** -0.5
        Processor::Ldm => default_scale(cfg.dim_head),
    }
}

//! The norms [`super::Attention`] may apply, loaded as diffusers 0.42.1 `Attention.__init__`
//! builds them: `group_norm`, `spatial_norm` (`SpatialNorm`, MoVQ), `norm_q`/`norm_k` of
//! `qk_norm` (and the unread `norm_added_q`/`norm_added_k`), and `norm_cross`
//! (`norm_encoder_hidden_states`), each kept only when the resolved processor applies it.

use super::config::{AttentionConfig, CrossAttentionNorm, Processor, QkNorm};
use super::rules::Resolved;
use super::Attention;
use crate::layers::{self, l2_normalize_last_dim, GroupNorm, LastDimRmsNorm, LayerNorm, SpatialNorm};
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

/// A norm over the last dimension of per-head queries or keys.
#[derive(Debug, Clone)]
pub(super) enum HeadNorm {
    Layer(LayerNorm),
    Rms(LastDimRmsNorm),
    L2(f64),
}

impl HeadNorm {
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            HeadNorm::Layer(n) => n.forward(x),
            HeadNorm::Rms(n) => n.forward(x),
            HeadNorm::L2(eps) => l2_normalize_last_dim(x, *eps),
        }
    }
}

/// `norm_cross`.
#[derive(Debug, Clone)]
pub(super) enum CrossNorm {
    Layer(LayerNorm),
    Group(GroupNorm),
}

impl CrossNorm {
    /// diffusers' `norm_encoder_hidden_states` on `(B, S, C)`.
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            CrossNorm::Layer(n) => n.forward(x),
            CrossNorm::Group(n) => n.forward(&x.transpose(1, 2)?)?.transpose(1, 2),
        }
    }
}

/// The norms of one block, in the order `Attention.__init__` creates them.
#[derive(Debug, Clone)]
pub(super) struct Norms {
    pub(super) group_norm: Option<GroupNorm>,
    /// Only when the processor applies it.
    pub(super) spatial_norm: Option<SpatialNorm>,
    /// Only when the processor applies them (`AttnProcessor2_0`).
    pub(super) norm_q: Option<HeadNorm>,
    pub(super) norm_k: Option<HeadNorm>,
    pub(super) norm_cross: Option<CrossNorm>,
}

impl Norms {
    pub(super) fn load(vb: &VarBuilder, cfg: &AttentionConfig, resolved: &Resolved) -> Result<Self> {
        let block = Attention::BLOCK;
        let processor = resolved.processor;
        let group_norm = match cfg.norm_num_groups {
            Some(groups) => Some(layers::group_norm(
                vb.pp("group_norm"),
                block,
                groups,
                cfg.query_dim,
                cfg.eps,
            )?),
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
                let (q, k) = qk_norms(vb, cfg, kind)?;
                if cfg.added_kv_proj_dim.is_some() {
                    load_added_qk_norms(vb, cfg, kind)?;
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
                resolved.cross_dim,
                1e-5,
                true,
            )?)),
            Some(CrossAttentionNorm::GroupNorm) => Some(CrossNorm::Group(layers::group_norm(
                vb.pp("norm_cross"),
                block,
                cfg.cross_attention_norm_num_groups,
                cfg.added_kv_proj_dim.unwrap_or(resolved.cross_dim),
                1e-5,
            )?)),
        };
        Ok(Self {
            group_norm,
            spatial_norm,
            norm_q,
            norm_k,
            norm_cross,
        })
    }
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

//! The input projection of [`super::MultiheadAttention`]: the packed `in_proj_weight` (or the
//! separate `q_proj_weight`/`k_proj_weight`/`v_proj_weight` when `kdim`/`vdim` differ from
//! `embed_dim`) as `torch.nn.MultiheadAttention.__init__` (torch 2.15.0) creates it, applied as
//! `F._in_projection_packed` / `F._in_projection` do.

use super::MultiheadAttention;
use crate::layers::Projection;
use crate::Result;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

/// The input projection: packed `in_proj_weight` or separate q/k/v weights.
#[derive(Debug, Clone)]
pub(super) enum InProj {
    /// `in_proj_weight (3E, E)`: all rows (self-attention), rows `E..3E` (`key is value`), and
    /// each third.
    Packed {
        qkv: Projection,
        kv: Projection,
        q: Projection,
        k: Projection,
        v: Projection,
    },
    Separate {
        q: Projection,
        k: Projection,
        v: Projection,
    },
}

/// How the query, key and value relate, which picks the linears `_in_projection_packed` runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sharing {
    /// `query is key is value`: one linear over all of `in_proj_weight`.
    pub(super) self_attention: bool,
    /// `key is value`: one linear over rows `E..3E` for both.
    pub(super) key_is_value: bool,
}

impl InProj {
    /// `in_proj_weight`/`in_proj_bias` (`kdim == vdim == embed_dim`) or
    /// `q_proj_weight`/`k_proj_weight`/`v_proj_weight` with `in_proj_bias`.
    pub(super) fn load(vb: &VarBuilder, e: usize, kdim: usize, vdim: usize, bias: bool) -> Result<Self> {
        let (dtype, device) = (vb.dtype(), vb.device().clone());
        let in_bias = if bias {
            Some(vb.get(3 * e, "in_proj_bias")?)
        } else {
            None
        };
        Ok(if kdim == e && vdim == e {
            let w = vb.get((3 * e, e), "in_proj_weight")?;
            let part = |start: usize, len: usize| -> Result<Projection> {
                projection(w.narrow(0, start, len)?, rows(&in_bias, start, len)?, dtype, &device)
            };
            InProj::Packed {
                qkv: part(0, 3 * e)?,
                kv: part(e, 2 * e)?,
                q: part(0, e)?,
                k: part(e, e)?,
                v: part(2 * e, e)?,
            }
        } else {
            InProj::Separate {
                q: projection(vb.get((e, e), "q_proj_weight")?, rows(&in_bias, 0, e)?, dtype, &device)?,
                k: projection(
                    vb.get((e, kdim), "k_proj_weight")?,
                    rows(&in_bias, e, e)?,
                    dtype,
                    &device,
                )?,
                v: projection(
                    vb.get((e, vdim), "v_proj_weight")?,
                    rows(&in_bias, 2 * e, e)?,
                    dtype,
                    &device,
                )?,
            }
        })
    }

    /// `q, k, v` of the batch-first `(N, tokens, features)` inputs. `strided`: torch projects
    /// a non-contiguous view (`batch_first`), where its Linear rounds twice in half precision.
    pub(super) fn forward(
        &self,
        (q_in, k_in, v_in): (&Tensor, &Tensor, &Tensor),
        sharing: Sharing,
        strided: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let lin = |p: &Projection, x: &Tensor| {
            if strided {
                p.forward_tokens_strided(x)
            } else {
                p.forward_tokens(x)
            }
        };
        Ok(match self {
            InProj::Packed { qkv, kv, q, k, v } => {
                let e = q_in.dim(2)?;
                if sharing.self_attention {
                    let all = lin(qkv, q_in)?;
                    (all.narrow(2, 0, e)?, all.narrow(2, e, e)?, all.narrow(2, 2 * e, e)?)
                } else if sharing.key_is_value {
                    let both = lin(kv, k_in)?;
                    (lin(q, q_in)?, both.narrow(2, 0, e)?, both.narrow(2, e, e)?)
                } else {
                    (lin(q, q_in)?, lin(k, k_in)?, lin(v, v_in)?)
                }
            }
            InProj::Separate { q, k, v } => (lin(q, q_in)?, lin(k, k_in)?, lin(v, v_in)?),
        })
    }
}

/// A [`Projection`] from tensors already loaded (rows of a packed weight).
fn projection(weight: Tensor, bias: Option<Tensor>, dtype: DType, device: &Device) -> Result<Projection> {
    let (out_dim, in_dim) = weight.dims2()?;
    let mut map = HashMap::new();
    map.insert("weight".to_string(), weight.contiguous()?);
    let has_bias = bias.is_some();
    if let Some(bias) = bias {
        map.insert("bias".to_string(), bias.contiguous()?);
    }
    let vb = VarBuilder::from_tensors(map, dtype, device);
    Projection::load(vb, MultiheadAttention::BLOCK, in_dim, out_dim, has_bias)
}

fn rows(t: &Option<Tensor>, start: usize, len: usize) -> Result<Option<Tensor>> {
    Ok(match t {
        Some(t) => Some(t.narrow(0, start, len)?),
        None => None,
    })
}

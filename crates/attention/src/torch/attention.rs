//! The attention and output of [`super::MultiheadAttention::forward`], as torch 2.15.0
//! `F.multi_head_attention_forward` computes them: with `need_weights`, `q · sqrt(1/d)`,
//! `baddbmm` with the mask, softmax, `bmm` with v and the weights averaged over heads
//! (`average_attn_weights`); without, `F.scaled_dot_product_attention`; then `out_proj` and the
//! output brought back to the query's layout.

use super::MultiheadAttention;
use crate::heads::merge_tokens;
use crate::ops::{matmul, mul, softmax, upcast};
use crate::sdpa::{default_scale, sdpa};
use crate::trace;
use crate::Result;
use candle_core::{DType, Tensor, D};

impl MultiheadAttention {
    /// The heads' output `(N, H, L, d)` and, with `need_weights`, the attention weights
    /// `(N, L, S)` averaged over heads or `(N, H, L, S)`, rounded to the input's `dtype`.
    pub(super) fn attend(
        &self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        mask: Option<&Tensor>,
        dtype: DType,
        (need_weights, average_attn_weights): (bool, bool),
    ) -> Result<(Tensor, Option<Tensor>)> {
        let d = self.head_dim;
        if !need_weights {
            return Ok((sdpa(q, k, v, mask, default_scale(d))?, None));
        }
        // q_scaled = q * math.sqrt(1.0 / float(E))
        let q_scaled = mul(q, (1.0 / d as f64).sqrt())?;
        // baddbmm(attn_mask, q_scaled, k.transpose(-2, -1)) (or bmm): one rounding
        let mut scores = upcast(&q_scaled)?.matmul(&upcast(k)?.t()?)?;
        if let Some(m) = mask {
            scores = scores.broadcast_add(&upcast(m)?)?;
        }
        let probs = softmax(&scores.to_dtype(dtype)?, D::Minus1)?; // (N, H, L, S)
        trace::record("probs", &probs);
        let out = matmul(&probs, v)?;
        let weights = if average_attn_weights {
            // attn_output_weights.mean(dim=1), accumulated in at least f32
            upcast(&probs)?.mean(1)?.to_dtype(dtype)?
        } else {
            probs
        };
        Ok((out, Some(weights)))
    }

    /// `out_proj` of the merged heads, in the query's layout (`(L, N, E)`, `(N, L, E)` with
    /// `batch_first`, or `(L, E)` unbatched), and the weights without the batch dimension of
    /// an unbatched query.
    pub(super) fn out_projection(
        &self,
        out: &Tensor,
        weights: Option<Tensor>,
        batched: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let out = self.out_proj.forward_tokens(&merge_tokens(out)?)?; // (N, L, E)
        let out = if !batched {
            out.squeeze(0)?
        } else if self.batch_first {
            out
        } else {
            out.transpose(0, 1)?.contiguous()?
        };
        let weights = match weights {
            Some(w) if !batched => Some(w.squeeze(0)?),
            w => w,
        };
        trace::record("output", &out);
        Ok((out, weights))
    }
}

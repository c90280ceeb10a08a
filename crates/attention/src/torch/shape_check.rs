//! The input checks of [`super::MultiheadAttention::forward`]: torch 2.15.0
//! `F._mha_shape_check` (batched 3-D or unbatched 2-D inputs, the masks' ranks) and the shape
//! asserts at the top of `F.multi_head_attention_forward`, on the inputs brought to
//! batch-first `(N, L, E)`.

use super::masks::check_mask_dtype;
use super::{MultiheadAttention, MultiheadAttentionArgs};
use crate::Result;
use candle_core::Tensor;

/// The query, key and value batch-first `(N, tokens, features)`.
pub(super) struct BatchFirst {
    pub(super) q: Tensor,
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    /// Batch size, query length and key length.
    pub(super) n: usize,
    pub(super) l: usize,
    pub(super) s: usize,
}

impl MultiheadAttention {
    /// `_mha_shape_check`: whether the query is batched, with the ranks of the key, value and
    /// masks checked against it (and `_canonical_mask`'s dtype check, which torch applies even
    /// to a mask the `is_causal` hint later drops).
    pub(super) fn mha_shape_check(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        args: &MultiheadAttentionArgs,
    ) -> Result<bool> {
        let batched = match query.rank() {
            3 => true,
            2 => false,
            _ => {
                return Err(Self::input_err(
                    "query",
                    format!(
                        "expected a batched 3-D or unbatched 2-D tensor, found shape {:?}",
                        query.dims()
                    ),
                ))
            }
        };
        let rank = query.rank();
        for (name, t) in [("key", key), ("value", value)] {
            if t.rank() != rank {
                return Err(Self::input_err(
                    name,
                    format!("expected a {rank}-D tensor like the query, found shape {:?}", t.dims()),
                ));
            }
        }
        if let Some(m) = args.key_padding_mask {
            if m.rank() != rank - 1 {
                return Err(Self::input_err(
                    "key_padding_mask",
                    format!(
                        "expected a {}-D tensor for a {rank}-D query, found shape {:?}",
                        rank - 1,
                        m.dims()
                    ),
                ));
            }
        }
        if let Some(m) = args.attn_mask {
            self.check_attn_mask_rank(m, batched, query, key)?;
        }
        for (name, m) in [
            ("key_padding_mask", args.key_padding_mask),
            ("attn_mask", args.attn_mask),
        ] {
            if let Some(m) = m {
                check_mask_dtype(m, name)?;
            }
        }
        Ok(batched)
    }

    /// `attn_mask` is 2-D or 3-D; an unbatched query's 3-D mask is `(num_heads, L, S)`.
    fn check_attn_mask_rank(&self, m: &Tensor, batched: bool, query: &Tensor, key: &Tensor) -> Result<()> {
        if m.rank() != 2 && m.rank() != 3 {
            return Err(Self::input_err(
                "attn_mask",
                format!("expected a 2-D or 3-D tensor, found shape {:?}", m.dims()),
            ));
        }
        // torch checks an unbatched 3-D mask here, before is_causal may drop it.
        let (l, s) = (query.dim(0)?, key.dim(0)?);
        if !batched && m.rank() == 3 && m.dims() != [self.num_heads, l, s] {
            return Err(Self::input_err(
                "attn_mask",
                format!(
                    "the 3-D attn_mask of an unbatched query should be ({}, {l}, {s}) (num_heads, L, S), found {:?}",
                    self.num_heads,
                    m.dims()
                ),
            ));
        }
        Ok(())
    }

    /// The inputs batch-first `(N, L, E)` (`unsqueeze(0)` when unbatched, `transpose(0, 1)`
    /// unless `batch_first`), with the feature, batch and length asserts of
    /// `multi_head_attention_forward`.
    pub(super) fn batch_first_inputs(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        batched: bool,
    ) -> Result<BatchFirst> {
        let to_batch_first = |t: &Tensor| -> candle_core::Result<Tensor> {
            if !batched {
                t.unsqueeze(0)
            } else if self.batch_first {
                Ok(t.clone())
            } else {
                t.transpose(0, 1)
            }
        };
        let q = to_batch_first(query)?;
        let k = to_batch_first(key)?;
        let v = to_batch_first(value)?;
        let (n, l, e) = q.dims3()?;
        let (nk, s, ek) = k.dims3()?;
        let (nv, sv, ev) = v.dims3()?;
        let features = [
            ("query", e, self.embed_dim, "embedding dimension ", query),
            ("key", ek, self.kdim, "feature dimension kdim=", key),
            ("value", ev, self.vdim, "feature dimension vdim=", value),
        ];
        for (name, found, expected, what, t) in features {
            if found != expected {
                return Err(Self::input_err(
                    name,
                    format!("expected {what}{expected}, found shape {:?}", t.dims()),
                ));
            }
        }
        if nk != n || nv != n {
            return Err(Self::input_err(
                "key",
                format!(
                    "key {:?} and value {:?} must have the query's batch size {n}",
                    key.dims(),
                    value.dims()
                ),
            ));
        }
        if sv != s {
            return Err(Self::input_err(
                "value",
                format!(
                    "key {:?} and value {:?} must have the same sequence length",
                    key.dims(),
                    value.dims()
                ),
            ));
        }
        Ok(BatchFirst { q, k, v, n, l, s })
    }
}

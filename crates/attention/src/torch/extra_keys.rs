//! The keys and values torch 2.15.0 `F.multi_head_attention_forward` appends after the input
//! projection: `bias_k`/`bias_v` (`add_bias_kv`) at the end of the projected sequence, and
//! `add_zero_attn`'s zero key/value in head space, each padding the masks with one allowed
//! column; in between, the split into `(N, H, tokens, head_dim)` heads.

use super::masks::Masks;
use super::MultiheadAttention;
use crate::heads::split_tokens;
use crate::Result;
use candle_core::Tensor;

impl MultiheadAttention {
    /// The projected `(N, tokens, E)` q, k, v as heads, with `bias_k`/`bias_v` and the zero
    /// attention key appended (and `masks` padded for each).
    pub(super) fn heads_with_extra_keys(
        &self,
        (q, k, v): (Tensor, Tensor, Tensor),
        masks: &mut Masks,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (n, e) = (q.dim(0)?, self.embed_dim);
        let (h, d) = (self.num_heads, self.head_dim);
        // bias_k / bias_v: one more key/value at the end of the sequence.
        let (k, v) = match (&self.bias_k, &self.bias_v) {
            (Some(bk), Some(bv)) => {
                masks.pad_one_key()?;
                let bk = bk.broadcast_as((n, 1, e))?.to_dtype(k.dtype())?;
                let bv = bv.broadcast_as((n, 1, e))?.to_dtype(v.dtype())?;
                (Tensor::cat(&[&k, &bk], 1)?, Tensor::cat(&[&v, &bv], 1)?)
            }
            _ => (k, v),
        };
        let q = split_tokens(&q, h)?.contiguous()?;
        let mut k = split_tokens(&k, h)?.contiguous()?;
        let mut v = split_tokens(&v, h)?.contiguous()?;
        if self.add_zero_attn {
            masks.pad_one_key()?;
            let zk = Tensor::zeros((n, h, 1, d), k.dtype(), k.device())?;
            let zv = Tensor::zeros((n, h, 1, d), v.dtype(), v.device())?;
            k = Tensor::cat(&[&k, &zk], 2)?;
            v = Tensor::cat(&[&v, &zv], 2)?;
        }
        Ok((q, k, v))
    }
}

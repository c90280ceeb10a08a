//! The attention mask of [`super::Attention`]: diffusers 0.42.1
//! `Attention.prepare_attention_mask` (`models/attention_processor.py`), the reshape each
//! processor applies to its result, and the broadcast of `F.scaled_dot_product_attention` /
//! `baddbmm`, giving one additive `(B, heads, q_len, kv_len)` mask.

use super::config::Processor;
use super::Attention;
use crate::{Error, Result};
use candle_core::{DType, Tensor};

impl Attention {
    /// diffusers' `prepare_attention_mask(mask, target_len, batch)` (with its quirk of padding
    /// by `target_len`, not the difference, and padding bool masks with False) followed by the
    /// processor's own reshape and the broadcast its attention kernel applies; returns an
    /// additive mask of shape `(B, heads, q_len, kv_len)`.
    pub(super) fn attention_mask(
        &self,
        mask: &Tensor,
        target_len: usize,
        batch: usize,
        q_len: usize,
        kv_len: usize,
    ) -> Result<Tensor> {
        let target = MaskTarget {
            processor: self.processor,
            mask,
            batch,
            heads: self.heads,
            q_len,
            kv_len,
        };
        let is_bool = mask.dtype() == DType::U8;
        if !is_bool && !mask.dtype().is_float() {
            return Err(target.bad(format!("expected a float or bool mask, found {:?}", mask.dtype())));
        }
        if is_bool && !self.processor.is_sdpa() {
            return Err(target.bad(format!(
                "a boolean mask is not accepted by {:?} (baddbmm needs a float mask)",
                self.processor
            )));
        }
        if mask.rank() == 0 {
            return Err(target.bad("expected at least one dimension".to_string()));
        }
        let last = mask.rank() - 1;
        let mut m = mask.clone();
        if m.dim(last)? != target_len {
            // F.pad(mask, (0, target_len), value=0.0): False for bool masks.
            m = m.pad_with_zeros(last, 0, target_len)?;
        }
        let m = target.processor_layout(m)?;
        let m = if is_bool {
            // SDPA: True attends, False is -inf.
            let zeros = Tensor::zeros(m.shape(), DType::F32, m.device())?;
            let neg = Tensor::full(f32::NEG_INFINITY, m.shape(), m.device())?;
            m.where_cond(&zeros, &neg)?
        } else {
            m
        };
        if m.rank() > 4 {
            return Err(target.shape_error(&m, "scaled_dot_product_attention"));
        }
        let full = (batch, self.heads, q_len, kv_len);
        m.broadcast_as(full)
            .map_err(|_| target.shape_error(&m, "scaled_dot_product_attention"))
    }
}

/// The attention a mask is prepared for, and the mask as given (for the errors).
struct MaskTarget<'a> {
    processor: Processor,
    mask: &'a Tensor,
    batch: usize,
    heads: usize,
    q_len: usize,
    kv_len: usize,
}

impl MaskTarget<'_> {
    fn bad(&self, message: String) -> Error {
        Error::input(Attention::BLOCK, "attention_mask", message)
    }

    /// The mask `m` (prepared from the given one) cannot be used for `what`.
    fn shape_error(&self, m: &Tensor, what: &str) -> Error {
        let Self {
            processor,
            mask,
            batch,
            heads,
            q_len,
            kv_len,
        } = self;
        self.bad(format!(
            "{processor:?} cannot use a mask of shape {:?} (prepared to {:?}) for {what} \
             (batch {batch}, heads {heads}, {q_len} queries, {kv_len} keys)",
            mask.dims(),
            m.dims()
        ))
    }

    /// The padded mask as the processor lays it out: `prepare_attention_mask`'s
    /// `repeat_interleave` over the heads (`out_dim=3`, or `out_dim=4` for
    /// `AttnAddedKVProcessor2_0`), then `view(batch, heads, -1, S)` (SDPA, ldm) or the
    /// `(batch * heads, q_len, kv_len)` broadcast of `baddbmm`.
    fn processor_layout(&self, mut m: Tensor) -> Result<Tensor> {
        let (batch, heads, q_len, kv_len) = (self.batch, self.heads, self.q_len, self.kv_len);
        Ok(match self.processor {
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
                        return Err(self.shape_error(&m, "view(batch, heads, -1, S)"));
                    }
                    m.reshape((batch, heads, n / (batch * heads * l), l))?
                } else {
                    // baddbmm broadcasts its input against (batch * heads, q_len, kv_len).
                    if m.rank() > 3 {
                        return Err(self.shape_error(&m, "baddbmm"));
                    }
                    m.broadcast_as((batch * heads, q_len, kv_len))
                        .map_err(|_| self.shape_error(&m, "baddbmm"))?
                        .contiguous()?
                        .reshape((batch, heads, q_len, kv_len))?
                }
            }
            Processor::AttnAddedKVProcessor2_0 => {
                // out_dim=4: unsqueeze(1).repeat_interleave(heads, dim=1).
                repeat_interleave(&m.unsqueeze(1)?, heads, 1)?
            }
        })
    }
}

/// `x.repeat_interleave(repeats, dim)`.
pub(super) fn repeat_interleave(x: &Tensor, repeats: usize, dim: usize) -> candle_core::Result<Tensor> {
    if repeats == 1 {
        return Ok(x.clone());
    }
    let mut expanded = x.dims().to_vec();
    expanded.insert(dim + 1, repeats);
    let mut out = x.dims().to_vec();
    out[dim] *= repeats;
    x.unsqueeze(dim + 1)?.broadcast_as(expanded)?.contiguous()?.reshape(out)
}

//! The masks of [`super::MultiheadAttention::forward`], as torch 2.15.0
//! `F.multi_head_attention_forward` prepares them: `_canonical_mask` (bool → additive `-inf`),
//! `key_padding_mask` `(N, S)` and `attn_mask` `(L, S)` / `(N·H, L, S)` laid out to broadcast to
//! `(N, H, L, S)`, the `is_causal` hint (SDPA's own causal mask when torch drops `attn_mask`),
//! the padding column `bias_k` / `add_zero_attn` add, and the merge of the two masks.

use super::shape_check::BatchFirst;
use super::{MultiheadAttention, MultiheadAttentionArgs};
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor, D};

/// The canonical additive masks, each broadcastable to `(N, H, L, S)`.
pub(super) struct Masks {
    pub(super) attn_mask: Option<Tensor>,
    pub(super) key_padding_mask: Option<Tensor>,
    /// `is_causal` with `need_weights=False` and no `key_padding_mask`: torch drops `attn_mask`
    /// and SDPA applies its upper-left causal mask.
    pub(super) sdpa_causal: bool,
}

impl MultiheadAttention {
    /// `key_padding_mask` and `attn_mask` canonical (additive, in the query's dtype as
    /// `_canonical_mask` makes them; the float masks of a bundle are in that dtype already).
    pub(super) fn canonical_masks(
        &self,
        args: &MultiheadAttentionArgs,
        inputs: &BatchFirst,
        batched: bool,
    ) -> Result<Masks> {
        let (n, l, s, h) = (inputs.n, inputs.l, inputs.s, self.num_heads);
        let dtype = inputs.q.dtype();
        let key_padding_mask = match args.key_padding_mask {
            Some(m) => {
                let m = if batched { m.clone() } else { m.unsqueeze(0)? };
                if m.dims() != [n, s] {
                    return Err(Self::input_err(
                        "key_padding_mask",
                        format!("expected shape ({n}, {s}) (batch, key length), found {:?}", m.dims()),
                    ));
                }
                Some(canonical_mask(&m, "key_padding_mask", dtype)?.reshape((n, 1, 1, s))?)
            }
            None => None,
        };
        if args.is_causal && args.attn_mask.is_none() {
            return Err(Self::input_err(
                "is_causal",
                "the is_causal hint needs an attn_mask (torch raises \"Need attn_mask if specifying the is_causal hint\")",
            ));
        }
        // With need_weights=False and no key_padding_mask torch drops the mask and lets SDPA
        // apply its own causal mask; otherwise the given attn_mask is used as it is.
        let sdpa_causal = args.is_causal && key_padding_mask.is_none() && !args.need_weights;
        let attn_mask = match args.attn_mask {
            Some(m) if !sdpa_causal => {
                let m4 = if m.rank() == 2 {
                    if m.dims() != [l, s] {
                        return Err(Self::input_err(
                            "attn_mask",
                            format!("the 2-D attn_mask should be ({l}, {s}), found {:?}", m.dims()),
                        ));
                    }
                    m.reshape((1, 1, l, s))?
                } else {
                    if m.dims() != [n * h, l, s] {
                        let want = if batched {
                            format!("({}, {l}, {s}) (N·num_heads, L, S)", n * h)
                        } else {
                            format!("({h}, {l}, {s}) (num_heads, L, S)")
                        };
                        return Err(Self::input_err(
                            "attn_mask",
                            format!("the 3-D attn_mask should be {want}, found {:?}", m.dims()),
                        ));
                    }
                    m.reshape((n, h, l, s))?
                };
                Some(canonical_mask(&m4, "attn_mask", dtype)?)
            }
            _ => None,
        };
        Ok(Masks {
            attn_mask,
            key_padding_mask,
            sdpa_causal,
        })
    }
}

impl Masks {
    /// One allowed column for a key appended by `bias_k` or `add_zero_attn`
    /// (`F.pad(mask, (0, 1))`).
    pub(super) fn pad_one_key(&mut self) -> Result<()> {
        let pad = |m: Option<Tensor>| -> candle_core::Result<Option<Tensor>> {
            m.map(|m| m.pad_with_zeros(D::Minus1, 0, 1)).transpose()
        };
        self.attn_mask = pad(self.attn_mask.take())?;
        self.key_padding_mask = pad(self.key_padding_mask.take())?;
        Ok(())
    }

    /// `attn_mask + key_padding_mask` (either alone, or none), or SDPA's causal mask over
    /// `l` queries and the final `src_len` keys.
    pub(super) fn merged(self, l: usize, src_len: usize, dtype: DType, device: &Device) -> Result<Option<Tensor>> {
        if self.sdpa_causal {
            return Ok(Some(causal_mask(l, src_len, dtype, device)?));
        }
        Ok(match (self.attn_mask, self.key_padding_mask) {
            (Some(a), Some(p)) => Some(a.broadcast_add(&p)?),
            (a, p) => a.or(p),
        })
    }
}

/// torch's `_canonical_mask`: bool (U8, non-zero = `True`) → `-inf` where `True`, `0`
/// elsewhere; float masks unchanged (cast to `dtype`).
fn canonical_mask(mask: &Tensor, name: &str, dtype: DType) -> Result<Tensor> {
    check_mask_dtype(mask, name)?;
    match mask.dtype() {
        DType::U8 => {
            let ninf = Tensor::full(f32::NEG_INFINITY, mask.shape(), mask.device())?.to_dtype(dtype)?;
            let zero = Tensor::zeros(mask.shape(), dtype, mask.device())?;
            Ok(mask.where_cond(&ninf, &zero)?)
        }
        _ => Ok(mask.to_dtype(dtype)?),
    }
}

/// Masks are bool (U8) or floating, as torch's `_canonical_mask` requires.
pub(super) fn check_mask_dtype(mask: &Tensor, name: &str) -> Result<()> {
    match mask.dtype() {
        DType::U8 => Ok(()),
        t if t.is_float() => Ok(()),
        other => Err(Error::input(
            MultiheadAttention::BLOCK,
            name,
            format!("only bool (as U8) and floating masks are supported, found {other:?}"),
        )),
    }
}

/// SDPA's `is_causal` mask: `tril(ones(L, S))` (upper-left aligned) as an additive mask
/// `(1, 1, L, S)`.
fn causal_mask(l: usize, s: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = (0..l)
        .flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Ok(Tensor::from_vec(data, (1, 1, l, s), device)?.to_dtype(dtype)?)
}

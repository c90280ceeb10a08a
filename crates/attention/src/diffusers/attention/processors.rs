//! The forwards of the diffusers 0.42.1 processors [`super::Attention`] runs
//! (`models/attention_processor.py`): `AttnProcessor2_0.__call__` / `AttnProcessor.__call__`
//! ([`Attention::forward_standard`]), `AttnAddedKVProcessor2_0.__call__` /
//! `AttnAddedKVProcessor.__call__` ([`Attention::forward_added_kv`]), and the attention each
//! applies to the split heads: `F.scaled_dot_product_attention`, `Attention.get_attention_scores`
//! + `torch.bmm`, or ldm's `CrossAttention` einsums.

use super::config::Processor;
use super::norms::CrossNorm;
use super::Attention;
use crate::cpu::contiguous;
use crate::heads::{image_to_tokens, merge_tokens, split_tokens, tokens_to_image};
use crate::layers::Projection;
use crate::ops::{div, matmul, published_float, softmax, upcast};
use crate::sdpa::{sdpa, trace_probs, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor, D};

impl Attention {
    /// `AttnProcessor2_0` / `AttnProcessor`.
    pub(super) fn forward_standard(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        temb: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.check_standard_input(hidden_states)?;
        let residual = hidden_states;
        let normed = self.spatial_normed(hidden_states, temb)?;
        let x = normed.as_ref().unwrap_or(hidden_states);
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
        let merged = self.standard_heads(hs, hs_strided, encoder_hidden_states, mask.as_ref())?;
        trace::record("attn", &merged);
        #[cfg(feature = "cuda")]
        if let Some(out) = self.to_out_fused(&merged, image, residual)? {
            return Ok(out);
        }
        let mut out = self.to_out.forward_tokens(&merged)?;
        drop(merged);
        trace::record("proj", &out);
        if let Some((_, _, h, w)) = image {
            out = tokens_to_image(&out, h, w)?;
        }
        if self.residual_connection {
            out = crate::ops::add(&out, residual)?;
        }
        // hidden_states / attn.rescale_output_factor
        let out = div(&out, self.rescale_output_factor)?;
        trace::record("output", &out);
        Ok(out)
    }

    /// `to_out`, the image reshape, `+ residual` and `/ rescale_output_factor` on CUDA in half
    /// precision: `to_out` natively with its bias inside the GEMM's sum
    /// ([`Projection::linear_native`]: PyTorch's `addmm` on the contiguous merged heads), then
    /// residual and rescale in one epilogue kernel (`unet_attention::cuda::epilogue` (feature
    /// `cuda`); each step rounded as PyTorch's separate ops). `None` off that path (not CUDA,
    /// not half, a trace recorded).
    #[cfg(feature = "cuda")]
    fn to_out_fused(
        &self,
        merged: &Tensor,
        image: Option<(usize, usize, usize, usize)>,
        residual: &Tensor,
    ) -> Result<Option<Tensor>> {
        let Some(y) = self.to_out.linear_native(merged)? else {
            return Ok(None);
        };
        let y = match image {
            Some((_, _, h, w)) => tokens_to_image(&y, h, w)?,
            None => y,
        };
        let residual = self.residual_connection.then_some(residual);
        let rescale = Some(self.rescale_output_factor);
        if let Some(out) = crate::cuda::epilogue(&y, None, residual, rescale)? {
            return Ok(Some(out));
        }
        let out = match residual {
            Some(r) => crate::ops::add(&y, &r)?,
            None => y,
        };
        Ok(Some(div(&out, self.rescale_output_factor)?))
    }

    /// `AttnProcessor2_0` / `AttnProcessor` read `(B, N, query_dim)` or `(B, query_dim, H, W)`.
    fn check_standard_input(&self, hidden_states: &Tensor) -> Result<()> {
        let channels_ok =
            hidden_states.dims().get(if hidden_states.rank() == 4 { 1 } else { 2 }) == Some(&self.query_dim);
        if !matches!(hidden_states.rank(), 3 | 4) || !channels_ok {
            return Err(Error::input(
                Self::BLOCK,
                "hidden_states",
                format!(
                    "expected (B, N, {0}) or (B, {0}, H, W), found {1:?}",
                    self.query_dim,
                    hidden_states.dims()
                ),
            ));
        }
        Ok(())
    }

    /// `if attn.spatial_norm is not None: hidden_states = attn.spatial_norm(hidden_states, temb)`
    /// (stage `spatial_norm`); `None` without a spatial norm.
    fn spatial_normed(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Option<Tensor>> {
        let block = Self::BLOCK;
        let Some(spatial_norm) = &self.spatial_norm else {
            return Ok(None);
        };
        let zq =
            temb.ok_or_else(|| Error::input(block, "temb", "spatial_norm (spatial_norm_dim) needs the zq map `temb`"))?;
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
        let normed = spatial_norm.forward(x, zq)?;
        trace::record("spatial_norm", &normed);
        Ok(Some(normed))
    }

    /// The projections, `norm_cross`, the head split with `norm_q`/`norm_k` and the attention of
    /// the standard processors, on the `(B, N, C)` tokens `hs` (taken by value so that every
    /// intermediate is dropped as soon as the next step has its result: at 128×128 tokens each
    /// is 32 MiB); returns the merged heads `(B, N, inner_dim)`.
    fn standard_heads(
        &self,
        hs: Tensor,
        hs_strided: bool,
        encoder_hidden_states: Option<&Tensor>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
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
        let out = self.attend(&q, &k, &v, mask)?;
        Ok(merge_tokens(&out)?)
    }

    /// `AttnAddedKVProcessor2_0` / `AttnAddedKVProcessor`.
    pub(super) fn forward_added_kv(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let residual = hidden_states;
        if hidden_states.rank() < 2 || hidden_states.dim(1)? != self.query_dim {
            return Err(Error::input(
                Self::BLOCK,
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
        let (context, context_strided) = self.added_kv_context(&hs, channels, encoder_hidden_states)?;
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
        let (k, v) = self.added_kv_keys_values(&hs, &context, context_strided)?;
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
        let out = crate::ops::add(&out.transpose(1, 2)?.reshape(residual.shape())?, residual)?;
        trace::record("output", &out);
        Ok(out)
    }

    /// The context `add_k_proj`/`add_v_proj` read (with whether PyTorch holds it as a strided
    /// view): `norm_cross(encoder_hidden_states)`, or the `channels`-wide input tokens `hs`
    /// when no `encoder_hidden_states` are given.
    fn added_kv_context(
        &self,
        hs: &Tensor,
        channels: usize,
        encoder_hidden_states: Option<&Tensor>,
    ) -> Result<(Tensor, bool)> {
        Ok(match (encoder_hidden_states, &self.norm_cross) {
            (None, _) => {
                if channels != self.context_dim {
                    return Err(Error::input(
                        Self::BLOCK,
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
        })
    }

    /// The split keys and values of the added-KV processors: the projected context's
    /// (`add_k_proj`/`add_v_proj`), followed by the self tokens' unless `only_cross_attention`.
    fn added_kv_keys_values(&self, hs: &Tensor, context: &Tensor, context_strided: bool) -> Result<(Tensor, Tensor)> {
        let (add_k, add_v) = match (&self.add_k_proj, &self.add_v_proj) {
            (Some(k), Some(v)) => (k, v),
            _ => unreachable!("the added-KV processors require added_kv_proj_dim (checked in new)"),
        };
        let ek = split_tokens(&linear(add_k, context, context_strided)?, self.heads)?;
        let ev = split_tokens(&linear(add_v, context, context_strided)?, self.heads)?;
        Ok(match (&self.to_k, &self.to_v) {
            (Some(to_k), Some(to_v)) => {
                let k = split_tokens(&to_k.forward_tokens_strided(hs)?, self.heads)?;
                let v = split_tokens(&to_v.forward_tokens_strided(hs)?, self.heads)?;
                // [context tokens | self tokens]
                (Tensor::cat(&[&ek, &k], 2)?, Tensor::cat(&[&ev, &v], 2)?)
            }
            _ => (ek, ev),
        })
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
/// float64, as the exporters' float64 twins (their upcasts switched off) run it, unless the run
/// keeps the published casts ([`crate::ops::published_float`]).
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
        (published_float(q)?, published_float(k)?)
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
    let scores = if upcast_softmax {
        published_float(&scores)?
    } else {
        scores
    };
    let probs = softmax(&scores, D::Minus1)?.to_dtype(dtype)?;
    matmul(&probs, v)
}

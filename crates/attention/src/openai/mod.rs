//! OpenAI's `AttentionBlock`: openai/guided-diffusion `guided_diffusion/unet.py` (commit 22e0df8),
//! identical in CompVis latent-diffusion `ldm/modules/diffusionmodules/openaimodel.py` (a506df5,
//! = CompVis/stable-diffusion 21f890f, SD 1.x; Stability-AI/stablediffusion cf1d67a, SD 2.x) —
//! the U-Net `middle_block.1` when no spatial transformer is used — with its two attention
//! kernels `QKVAttentionLegacy` (the default) and `QKVAttention`
//! (`use_new_attention_order=True`). openai/improved-diffusion's `AttentionBlock`
//! (1bc7bbb; `qkv.reshape(b * num_heads, -1, T)` then a head-less split) is the legacy order.
//!
//! ```text
//! num_heads = num_heads if num_head_channels == -1 else channels // num_head_channels
//! norm = GroupNorm32(32, C)            # eps 1e-5, computed in float32, cast back
//! qkv = Conv1d(C, 3C, 1)               # qkv.weight (3C, C, 1), qkv.bias (3C,)
//! proj_out = Conv1d(C, C, 1)           # proj_out.weight (C, C, 1), proj_out.bias (C,)
//! _forward(x): b, c, *spatial = x.shape; x = x.reshape(b, c, -1)
//!              h = proj_out(attention(qkv(norm(x)))); return (x + h).reshape(b, c, *spatial)
//! ```
//!
//! Both kernels scale **`q` and `k`** by `1 / sqrt(sqrt(ch))` before the product and take the
//! softmax in float32. Legacy splits heads before q/k/v (per-head `[q_h | k_h | v_h]` channels);
//! the new order chunks `[Q | K | V]` first, then heads `(h c)`. `use_checkpoint` (gradient
//! checkpointing) does not change the forward.
//!
//! [`middle_block`]: the whole `middle_block` (`ResBlock`, `MiddleBlock`).

use crate::config::defaults;
use crate::heads::{chunk_qkv_channels, chunk_qkv_channels_per_head, merge_channels};
use crate::layers::{GroupNorm, Projection};
use crate::ops::{matmul, mul, published_float, softmax};
use crate::sdpa::{eager_attention, trace_probs, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

pub mod middle_block;
pub use middle_block::{MiddleBlock, MiddleBlockConfig, ResBlock, ResBlockConfig};

/// Keyword arguments of `AttentionBlock(channels, num_heads=1, num_head_channels=-1,
/// use_checkpoint=False, use_new_attention_order=False)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionBlockConfig {
    pub channels: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub num_heads: usize,
    /// `-1`: use `num_heads`; otherwise `num_heads = channels // num_head_channels`.
    #[serde(default = "defaults::minus_one")]
    pub num_head_channels: i64,
    /// Gradient checkpointing only; the forward is the same.
    #[serde(default)]
    pub use_checkpoint: bool,
    /// `QKVAttention` (split q/k/v, then heads) instead of `QKVAttentionLegacy`.
    #[serde(default)]
    pub use_new_attention_order: bool,
}

/// `normalization(channels)` = `GroupNorm32(32, channels)`.
const NORM_GROUPS: usize = 32;
const NORM_EPS: f64 = 1e-5;

impl AttentionBlockConfig {
    /// The number of heads the constructor ends up with, validated against `channels`.
    pub fn heads(&self, block: &'static str) -> Result<usize> {
        let c = self.channels;
        if c == 0 {
            return Err(Error::config(block, "channels must be greater than 0"));
        }
        let heads = match self.num_head_channels {
            -1 => self.num_heads,
            d if d > 0 => {
                let d = d as usize;
                // assert channels % num_head_channels == 0
                if !c.is_multiple_of(d) {
                    return Err(Error::config(
                        block,
                        format!("q,k,v channels {c} is not divisible by num_head_channels {d}"),
                    ));
                }
                c / d
            }
            d => {
                return Err(Error::config(
                    block,
                    format!("num_head_channels must be -1 or positive, found {d}"),
                ))
            }
        };
        // QKVAttention(Legacy): assert width % (3 * n_heads) == 0
        if heads == 0 || !c.is_multiple_of(heads) {
            return Err(Error::config(
                block,
                format!("{heads} heads do not divide {c} channels"),
            ));
        }
        Ok(heads)
    }
}

/// `QKVAttentionLegacy(n_heads)` or `QKVAttention(n_heads)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvOrder {
    /// `QKVAttentionLegacy`: "split heads before split qkv".
    Legacy,
    /// `QKVAttention`: "split qkv before split heads".
    New,
}

/// The attention kernel on a fused `qkv` of shape `(B, 3·H·ch, T)` → `(B, H·ch, T)`.
fn qkv_attention(qkv: &Tensor, heads: usize, order: QkvOrder) -> candle_core::Result<Tensor> {
    let (_, width, _) = qkv.dims3()?;
    let ch = width / (3 * heads);
    // q, k, v: (B, H, ch, T), channels first (batch-head index b·H + h).
    let [q, k, v] = match order {
        QkvOrder::Legacy => chunk_qkv_channels_per_head(qkv, heads)?,
        QkvOrder::New => chunk_qkv_channels(qkv, heads)?,
    };
    // Stages q, k, v: (B, H, T, ch), before the d^-1/4 scale.
    trace::record_qkv_channels(&q, &k, &v);
    let scale = 1.0 / (ch as f64).sqrt().sqrt();
    // weight = einsum("bct,bcs->bts", q * scale, k * scale)  # More stable with f16 than dividing afterwards
    let (q, k) = (mul(&q, scale)?, mul(&k, scale)?);
    // weight = softmax(weight.float(), dim=-1).type(weight.dtype); a = einsum("bts,bcs->bct", weight, v)
    let a = if q.dtype() == DType::F64 {
        float64_attention(&q.t()?, &k.t()?, &v.t()?)?
    } else {
        crate::float64_run::casts_kept();
        eager_attention(&q.t()?, &k.t()?, &v.t()?, None, Scale::Mul(1.0))?
    };
    // a.reshape(bs, -1, length)
    merge_channels(&a)
}

/// The attention of a float64 run, step by step: `weight = q·kᵀ`, its softmax of
/// `weight.float()` ([`published_float`]: float64, or float32 where the run keeps the published
/// casts), `.type(weight.dtype)`, then `weight·v`.
fn float64_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
    trace_probs(q, k, None, Scale::Mul(1.0));
    let weight = matmul(q, &k.t()?)?;
    let probs = softmax(&published_float(&weight)?, candle_core::D::Minus1)?.to_dtype(weight.dtype())?;
    matmul(&probs, v)
}

/// openai `AttentionBlock`.
#[derive(Debug, Clone)]
pub struct AttentionBlock {
    channels: usize,
    heads: usize,
    order: QkvOrder,
    norm: GroupNorm,
    qkv: Projection,
    proj_out: Projection,
}

impl AttentionBlock {
    pub const BLOCK: &'static str = "openai.AttentionBlock";

    pub fn new(vb: VarBuilder, cfg: &AttentionBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg.channels;
        let heads = cfg.heads(block)?;
        Ok(Self {
            channels: c,
            heads,
            order: if cfg.use_new_attention_order {
                QkvOrder::New
            } else {
                QkvOrder::Legacy
            },
            norm: GroupNorm::load(
                vb.pp("norm").to_dtype(crate::ops::compute_dtype(vb.dtype())),
                block,
                NORM_GROUPS,
                c,
                NORM_EPS,
            )?
            .float_input(),
            qkv: Projection::load(vb.pp("qkv"), block, c, 3 * c, true)?,
            proj_out: Projection::load(vb.pp("proj_out"), block, c, c, true)?,
        })
    }

    /// Heads after `num_head_channels` is applied.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Which kernel the block runs.
    pub fn order(&self) -> QkvOrder {
        self.order
    }

    /// The forward with the crate's errors: an input that is not `(B, C, *spatial)` with at
    /// least one spatial dimension is [`Error::Input`].
    pub fn forward_checked(&self, x: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let dims = x.dims();
        if dims.len() < 3 || dims[1] != self.channels {
            return Err(Error::input(
                Self::BLOCK,
                "x",
                format!(
                    "expected (B, {}, *spatial) with at least one spatial dimension, found {dims:?}",
                    self.channels
                ),
            ));
        }
        // b, c, *spatial = x.shape; x = x.reshape(b, c, -1)
        let (b, c) = (dims[0], dims[1]);
        let x = x.reshape((b, c, ()))?;
        let normed = self.norm.forward(&x)?;
        trace::record("norm", &normed);
        let qkv = self.qkv.forward_channels(&normed)?;
        let h = qkv_attention(&qkv, self.heads, self.order)?;
        trace::record("attn", &h);
        let h = self.proj_out.forward_channels(&h)?;
        trace::record("proj", &h);
        let out = crate::ops::add(&x, &h)?.reshape(dims)?;
        trace::record("output", &out);
        Ok(out)
    }
}

impl Module for AttentionBlock {
    /// `x`: `(B, C, *spatial)` → `(B, C, *spatial)`, residual inside.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        Ok(self.forward_checked(x)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use crate::test_support::max_diff;
    use candle_core::{DType, Device};
    use serde_json::json;
    use std::collections::HashMap;

    fn weights(c: usize, dev: &Device) -> HashMap<String, Tensor> {
        HashMap::from([
            ("norm.weight".to_string(), Tensor::randn(1f32, 0.1, c, dev).unwrap()),
            ("norm.bias".to_string(), Tensor::randn(0f32, 0.1, c, dev).unwrap()),
            (
                "qkv.weight".to_string(),
                Tensor::randn(0f32, 0.3, (3 * c, c, 1), dev).unwrap(),
            ),
            ("qkv.bias".to_string(), Tensor::randn(0f32, 0.3, 3 * c, dev).unwrap()),
            (
                "proj_out.weight".to_string(),
                Tensor::randn(0f32, 0.3, (c, c, 1), dev).unwrap(),
            ),
            ("proj_out.bias".to_string(), Tensor::randn(0f32, 0.3, c, dev).unwrap()),
        ])
    }

    fn block(map: &HashMap<String, Tensor>, cfg: serde_json::Value) -> Result<AttentionBlock> {
        let dev = Device::Cpu;
        let cfg: AttentionBlockConfig = from_json(AttentionBlock::BLOCK, &cfg)?;
        AttentionBlock::new(VarBuilder::from_tensors(map.clone(), DType::F32, &dev), &cfg)
    }

    #[test]
    fn config_errors_and_heads() {
        let dev = Device::Cpu;
        let map = weights(64, &dev);
        let err = block(&map, json!({"channels": 64, "heads": 2})).unwrap_err();
        assert!(err.to_string().contains("heads"), "{err}");
        let err = block(&map, json!({"channels": 64, "num_heads": 3})).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("3 heads do not divide 64 channels"),
            "{err}"
        );
        let err = block(&map, json!({"channels": 64, "num_head_channels": 24})).unwrap_err();
        assert!(
            err.to_string().contains("64") && err.to_string().contains("24"),
            "{err}"
        );
        let err = block(&map, json!({"channels": 64, "num_head_channels": 0})).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err}");
        let err = block(&map, json!({"channels": 64, "num_heads": 0})).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err}");
        let map48 = weights(48, &dev);
        let err = block(&map48, json!({"channels": 48})).unwrap_err();
        assert!(
            err.to_string().contains("32 norm groups do not divide 48 channels"),
            "{err}"
        );
        let b = block(
            &map,
            json!({"channels": 64, "num_heads": 7, "num_head_channels": 16, "use_checkpoint": true,
                   "use_new_attention_order": true}),
        )
        .unwrap();
        assert_eq!((b.heads(), b.order()), (4, QkvOrder::New));
        assert_eq!(block(&map, json!({"channels": 64})).unwrap().heads(), 1);
        // Weights of the wrong width are a weight-shape error.
        let err = block(&map, json!({"channels": 32})).unwrap_err();
        assert!(matches!(err, Error::Candle(_) | Error::WeightShape { .. }), "{err}");
    }

    #[test]
    fn input_ranks() {
        let dev = Device::Cpu;
        let b = block(&weights(32, &dev), json!({"channels": 32, "num_heads": 4})).unwrap();
        for shape in [vec![2, 32, 7], vec![2, 32, 3, 5], vec![1, 32, 2, 3, 2]] {
            let x = Tensor::randn(0f32, 1., shape.as_slice(), &dev).unwrap();
            assert_eq!(b.forward(&x).unwrap().dims(), shape.as_slice());
        }
        for shape in [vec![2, 32], vec![2, 16, 3, 3]] {
            let x = Tensor::zeros(shape.as_slice(), DType::F32, &dev).unwrap();
            assert!(matches!(b.forward_checked(&x).unwrap_err(), Error::Input { .. }));
            assert!(b.forward(&x).is_err());
        }
    }

    #[test]
    fn legacy_and_new_order_agree_on_one_head_and_on_permuted_weights() {
        let dev = Device::Cpu;
        let c = 64;
        let map = weights(c, &dev);
        let x = Tensor::randn(0f32, 1., (2, c, 4, 3), &dev).unwrap();
        let legacy = block(&map, json!({"channels": c})).unwrap();
        let new = block(&map, json!({"channels": c, "use_new_attention_order": true})).unwrap();
        assert_eq!(max_diff(&legacy.forward(&x).unwrap(), &new.forward(&x).unwrap()), 0.0);

        // Four heads: the legacy weights permuted to the new layout give the same output,
        // W.reshape(H, 3, d, ...).transpose(0, 1).reshape(3C, ...).
        let (h, d) = (4, c / 4);
        let legacy = block(&map, json!({"channels": c, "num_head_channels": d})).unwrap();
        let mut permuted = map.clone();
        let w = map["qkv.weight"]
            .reshape((h, 3, d, c))
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        permuted.insert("qkv.weight".into(), w.reshape((3 * c, c, 1)).unwrap());
        let bias = map["qkv.bias"].reshape((h, 3, d)).unwrap().transpose(0, 1).unwrap();
        permuted.insert("qkv.bias".into(), bias.reshape(3 * c).unwrap());
        let new = block(
            &permuted,
            json!({"channels": c, "num_heads": h, "use_new_attention_order": true}),
        )
        .unwrap();
        let (a, b) = (legacy.forward(&x).unwrap(), new.forward(&x).unwrap());
        assert!(max_diff(&a, &b) < 1e-5, "{}", max_diff(&a, &b));
        // ... and the unpermuted weights do not.
        let wrong = block(
            &map,
            json!({"channels": c, "num_heads": h, "use_new_attention_order": true}),
        )
        .unwrap();
        assert!(max_diff(&a, &wrong.forward(&x).unwrap()) > 1e-3);
    }

    #[test]
    fn half_precision_norm_runs_in_f32() {
        let dev = Device::Cpu;
        let c = 32;
        let map = weights(c, &dev);
        let b32 = block(&map, json!({"channels": c, "num_heads": 2})).unwrap();
        let cfg: AttentionBlockConfig =
            from_json(AttentionBlock::BLOCK, &json!({"channels": c, "num_heads": 2})).unwrap();
        let b16 = AttentionBlock::new(VarBuilder::from_tensors(map, DType::F16, &dev), &cfg).unwrap();
        let x = (Tensor::randn(0f32, 1., (1, c, 6, 5), &dev).unwrap() * 30.).unwrap();
        let y32 = b32.forward(&x).unwrap();
        let y16 = b16.forward(&x.to_dtype(DType::F16).unwrap()).unwrap();
        assert_eq!(y16.dtype(), DType::F16);
        let err = max_diff(&y16.to_dtype(DType::F32).unwrap(), &y32);
        assert!(err < 0.1, "{err}");
    }
}

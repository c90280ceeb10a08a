//! The fast.ai course (fastai/course22p2 @ df93232, `nbs/27_attention.ipynb`) self-attention
//! classes, on images `(n, c, h, w)` flattened to `(n, h·w, c)` tokens, with the residual
//! `+ inp` **inside** the block:
//!
//! * [`SelfAttention`], one block id for the two classes the notebook publishes as
//!   `SelfAttention(ni)`, told apart by their state-dict keys:
//!   * cell 9: `GroupNorm(1, ni)` + separate `q`, `k`, `v`, `proj` `nn.Linear(ni, ni)`
//!     (keys `norm.{weight,bias}`, `q.*`, `k.*`, `v.*`, `proj.*`; forward input `x`);
//!   * cell 19: `BatchNorm2d(ni)` (eval: running statistics) + fused `qkv = nn.Linear(ni, 3ni)`
//!     chunked `[Q | K | V]` on the last dim (keys `norm.{weight,bias,running_mean,running_var,
//!     num_batches_tracked}`, `qkv.*`, `proj.*`; forward input `inp`). Chosen when the weights
//!     hold `qkv.weight` or `norm.running_mean`;
//!
//!   both single-head with scores **divided** by `math.sqrt(ni)` after `q·kᵀ`;
//! * [`SelfAttentionMultiHead`] (cell 29): `BatchNorm2d(ni)`, `qkv = nn.Linear(ni, 3ni)`,
//!   heads split **before** the q/k/v chunk (`rearrange(x, 'n s (h d) -> (n h) s d')` with
//!   `d = 3ni/nheads`, then `chunk(3, dim=-1)`: the legacy per-head `[q_h | k_h | v_h]` layout),
//!   scores divided by `math.sqrt(ni / nheads)`, merged `'(n h) s d -> n s (h d)'`, `proj`.

use crate::config::check_divides;
use crate::heads::{chunk_qkv_tokens_per_head, image_to_tokens, merge_tokens, tokens_to_image};
use crate::layers::{group_norm, BatchNorm2d, Projection};
use crate::sdpa::{eager_attention, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `SelfAttention(ni)` (both notebook classes).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SelfAttentionConfig {
    pub ni: usize,
}

/// Keyword arguments of `SelfAttentionMultiHead(ni, nheads)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SelfAttentionMultiHeadConfig {
    pub ni: usize,
    pub nheads: usize,
}

/// PyTorch's default norm eps (GroupNorm and BatchNorm2d).
const EPS: f64 = 1e-5;

#[derive(Debug, Clone)]
enum Variant {
    /// Cell 9: GroupNorm(1, ni), separate q/k/v.
    GroupNorm {
        norm: crate::layers::GroupNorm,
        q: Projection,
        k: Projection,
        v: Projection,
    },
    /// Cell 19: BatchNorm2d(ni), fused qkv chunked [Q | K | V].
    Fused { norm: BatchNorm2d, qkv: Projection },
}

/// fast.ai `SelfAttention(ni)` (either notebook class, chosen by the weights' keys).
#[derive(Debug, Clone)]
pub struct SelfAttention {
    variant: Variant,
    proj: Projection,
    ni: usize,
    /// The scores are divided by this (`self.scale` in the Python).
    divisor: f64,
}

fn check_ni(block: &'static str, ni: usize) -> Result<()> {
    if ni == 0 {
        return Err(Error::config(block, "ni must be greater than 0"));
    }
    Ok(())
}

impl SelfAttention {
    pub const BLOCK: &'static str = "fastai.SelfAttention";

    pub fn new(vb: VarBuilder, cfg: &SelfAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let (block, ni) = (Self::BLOCK, cfg.ni);
        check_ni(block, ni)?;
        let fused = vb.contains_tensor("qkv.weight") || vb.contains_tensor("norm.running_mean");
        let variant = if fused {
            Variant::Fused {
                norm: BatchNorm2d::load(vb.pp("norm"), ni, EPS)?,
                qkv: Projection::load(vb.pp("qkv"), block, ni, 3 * ni, true)?,
            }
        } else {
            Variant::GroupNorm {
                norm: group_norm(vb.pp("norm"), block, 1, ni, EPS)?,
                q: Projection::load(vb.pp("q"), block, ni, ni, true)?,
                k: Projection::load(vb.pp("k"), block, ni, ni, true)?,
                v: Projection::load(vb.pp("v"), block, ni, ni, true)?,
            }
        };
        Ok(Self {
            variant,
            proj: Projection::load(vb.pp("proj"), block, ni, ni, true)?,
            ni,
            // s = (q @ k.transpose(1, 2)) / math.sqrt(ni)
            divisor: (ni as f64).sqrt(),
        })
    }

    /// Whether these weights are the cell-19 class (BatchNorm2d + fused qkv).
    pub fn is_fused(&self) -> bool {
        matches!(self.variant, Variant::Fused { .. })
    }
}

impl Module for SelfAttention {
    /// `x` / `inp`: `(n, ni, h, w)` → `(n, ni, h, w)`.
    fn forward(&self, inp: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "inp", inp, &[])?;
        let (_, _, h, w) = inp.dims4()?;
        // x.view(n, c, -1).transpose(1, 2) is a transposed view: PyTorch's Linear rounds twice
        // on it in half precision (`forward_tokens_strided`).
        let (q, k, v) = match &self.variant {
            Variant::GroupNorm { norm, q, k, v } => {
                let normed = norm.forward(inp)?;
                trace::record("norm", &normed);
                let x = image_to_tokens(&normed)?; // (n, hw, c)
                (
                    q.forward_tokens_strided(&x)?,
                    k.forward_tokens_strided(&x)?,
                    v.forward_tokens_strided(&x)?,
                )
            }
            Variant::Fused { norm, qkv } => {
                let normed = norm.forward(inp)?;
                trace::record("norm", &normed);
                let x = qkv.forward_tokens_strided(&image_to_tokens(&normed)?)?;
                let ni = self.ni;
                (x.narrow(2, 0, ni)?, x.narrow(2, ni, ni)?, x.narrow(2, 2 * ni, ni)?)
            }
        };
        // One head: (n, 1, hw, c).
        // s = (q @ k.transpose(1, 2)) / self.scale; x = s.softmax(dim=-1) @ v
        let (q, k, v) = (q.unsqueeze(1)?, k.unsqueeze(1)?, v.unsqueeze(1)?);
        trace::record_qkv(&q, &k, &v);
        let out = eager_attention(&q, &k, &v, None, Scale::Div(self.divisor))?.squeeze(1)?;
        trace::record("attn", &out);
        let out = self.proj.forward_tokens(&out)?;
        trace::record("proj", &out);
        let out = crate::ops::add(&tokens_to_image(&out, h, w)?, inp)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// fast.ai `SelfAttentionMultiHead(ni, nheads)`.
#[derive(Debug, Clone)]
pub struct SelfAttentionMultiHead {
    norm: BatchNorm2d,
    qkv: Projection,
    proj: Projection,
    nheads: usize,
    /// The scores are divided by this (`self.scale` in the Python).
    divisor: f64,
}

impl SelfAttentionMultiHead {
    pub const BLOCK: &'static str = "fastai.SelfAttentionMultiHead";

    pub fn new(vb: VarBuilder, cfg: &SelfAttentionMultiHeadConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let (block, ni) = (Self::BLOCK, cfg.ni);
        check_ni(block, ni)?;
        check_divides(block, ni, cfg.nheads)?;
        Ok(Self {
            norm: BatchNorm2d::load(vb.pp("norm"), ni, EPS)?,
            qkv: Projection::load(vb.pp("qkv"), block, ni, 3 * ni, true)?,
            proj: Projection::load(vb.pp("proj"), block, ni, ni, true)?,
            nheads: cfg.nheads,
            // math.sqrt(ni / nheads), float division
            divisor: (ni as f64 / cfg.nheads as f64).sqrt(),
        })
    }
}

impl Module for SelfAttentionMultiHead {
    /// `inp`: `(n, ni, h, w)` → `(n, ni, h, w)`.
    fn forward(&self, inp: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "inp", inp, &[])?;
        let (_, _, h, w) = inp.dims4()?;
        let normed = self.norm.forward(inp)?;
        trace::record("norm", &normed);
        let x = self.qkv.forward_tokens_strided(&image_to_tokens(&normed)?)?; // (n, s, 3ni)
        let [q, k, v] = chunk_qkv_tokens_per_head(&x, self.nheads)?; // (n, h, s, d) each
        trace::record_qkv(&q, &k, &v);
        // s = (q @ k.transpose(1, 2)) / self.scale; x = s.softmax(dim=-1) @ v
        let out = merge_tokens(&eager_attention(&q, &k, &v, None, Scale::Div(self.divisor))?)?;
        trace::record("attn", &out);
        let out = self.proj.forward_tokens(&out)?;
        trace::record("proj", &out);
        let out = crate::ops::add(&tokens_to_image(&out, h, w)?, inp)?;
        trace::record("output", &out);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use candle_core::{DType, Device};
    use serde_json::json;

    #[test]
    fn config_errors() {
        let dev = Device::Cpu;
        let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev).unwrap();
        let mut map = std::collections::HashMap::new();
        for (name, shape) in [
            ("norm.weight", vec![20]),
            ("norm.bias", vec![20]),
            ("norm.running_mean", vec![20]),
            ("norm.running_var", vec![20]),
            ("qkv.weight", vec![60, 20]),
            ("qkv.bias", vec![60]),
            ("proj.weight", vec![20, 20]),
            ("proj.bias", vec![20]),
        ] {
            map.insert(name.to_string(), z(&shape));
        }
        let vb = VarBuilder::from_tensors(map, DType::F32, &dev);
        let err = from_json::<SelfAttentionConfig>(SelfAttention::BLOCK, &json!({"ni": 8, "nheads": 2})).unwrap_err();
        assert!(err.to_string().contains("nheads"), "{err}");
        let cfg: SelfAttentionMultiHeadConfig =
            from_json(SelfAttentionMultiHead::BLOCK, &json!({"ni": 20, "nheads": 3})).unwrap();
        let err = SelfAttentionMultiHead::new(vb.clone(), &cfg).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("3 heads"),
            "{err}"
        );
        let cfg: SelfAttentionMultiHeadConfig =
            from_json(SelfAttentionMultiHead::BLOCK, &json!({"ni": 20, "nheads": 4})).unwrap();
        SelfAttentionMultiHead::new(vb, &cfg).unwrap();
    }

    #[test]
    fn variant_from_keys() {
        let dev = Device::Cpu;
        let ni = 4;
        let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dev).unwrap();
        let mut map = std::collections::HashMap::new();
        for p in ["q", "k", "v", "proj"] {
            map.insert(format!("{p}.weight"), z(&[ni, ni]));
            map.insert(format!("{p}.bias"), z(&[ni]));
        }
        map.insert("norm.weight".into(), z(&[ni]));
        map.insert("norm.bias".into(), z(&[ni]));
        let cfg = SelfAttentionConfig { ni };
        let gn = SelfAttention::new(VarBuilder::from_tensors(map.clone(), DType::F32, &dev), &cfg).unwrap();
        assert!(!gn.is_fused());
        map.insert("norm.running_mean".into(), z(&[ni]));
        map.insert("norm.running_var".into(), z(&[ni]));
        map.insert("qkv.weight".into(), z(&[3 * ni, ni]));
        map.insert("qkv.bias".into(), z(&[3 * ni]));
        let fused = SelfAttention::new(VarBuilder::from_tensors(map, DType::F32, &dev), &cfg).unwrap();
        assert!(fused.is_fused());
    }

    #[test]
    fn legacy_per_head_layout() {
        // channels of token 0: head 0 = [q q | k k | v v] = 0..6, head 1 = 6..12
        let x = Tensor::arange(0f32, 12., &Device::Cpu)
            .unwrap()
            .reshape((1, 1, 12))
            .unwrap();
        let [q, k, v] = chunk_qkv_tokens_per_head(&x, 2).unwrap();
        assert_eq!(q.dims(), &[1, 2, 1, 2]);
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&q), vec![0., 1., 6., 7.]);
        assert_eq!(flat(&k), vec![2., 3., 8., 9.]);
        assert_eq!(flat(&v), vec![4., 5., 10., 11.]);
    }
}

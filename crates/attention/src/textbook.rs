//! The "Attention Is All You Need" textbook classes, as published in the sword4869 attention
//! notes (sections 2.1 and 3.1; the multi-head code there is stated to match
//! datnnt1997/multi-head_self-attention `selfattention.py`):
//!
//! * [`SelfAttention`] ← `Self_Attention(Dx, D, Dv)`;
//! * [`MultiHeadAttention`] ← `MultiHead_Attention(input_dim, nh, dh)` and the second published
//!   form `MultiHead_Attention(input_dim, d_all, nh)`.
//!
//! Plain token attention on `x: (b, N, Dx)`: biased `nn.Linear` q/k/v, scores **divided** by
//! `D ** 0.5` (`dh ** 0.5`, `(d_all / nh) ** 0.5`) after `q·kᵀ`, softmax over keys, heads split
//! `'b nq (nh dh) -> b nh nq dh'`; no norm, no residual. The multi-head output has `nh·dh`
//! (`d_all`) features, not `input_dim`.

use crate::config::check_divides;
use crate::heads::{merge_tokens, split_tokens};
use crate::layers::Projection;
use crate::sdpa::{eager_attention, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Deserializer};

/// Keyword arguments of `Self_Attention(Dx, D, Dv)` (capitalised, as in Python).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SelfAttentionConfig {
    /// Input features.
    #[serde(rename = "Dx")]
    pub dx: usize,
    /// Query/key features.
    #[serde(rename = "D")]
    pub d: usize,
    /// Value (and output) features.
    #[serde(rename = "Dv")]
    pub dv: usize,
}

/// `Self_Attention(Dx, D, Dv)`.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    q: Projection,
    k: Projection,
    v: Projection,
    /// The scores are divided by this (`self.scale` in the Python).
    divisor: f64,
}

impl SelfAttention {
    pub const BLOCK: &'static str = "textbook.SelfAttention";

    pub fn new(vb: VarBuilder, cfg: &SelfAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        if cfg.d == 0 {
            return Err(Error::config(
                Self::BLOCK,
                "D must be greater than 0 (the scores are divided by D ** 0.5)",
            ));
        }
        Ok(Self {
            q: Projection::load(vb.pp("q"), Self::BLOCK, cfg.dx, cfg.d, true)?,
            k: Projection::load(vb.pp("k"), Self::BLOCK, cfg.dx, cfg.d, true)?,
            v: Projection::load(vb.pp("v"), Self::BLOCK, cfg.dx, cfg.dv, true)?,
            // attn = (Q @ K^T) / D ** 0.5
            divisor: (cfg.d as f64).sqrt(),
        })
    }
}

impl Module for SelfAttention {
    /// `x`: `(b, N, Dx)` (any number of leading dimensions, at least `(N, Dx)`) → `(b, N, Dv)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let dims = x.dims().to_vec();
        if dims.len() < 2 {
            candle_core::bail!("{}: expected x of shape (.., N, Dx), found {dims:?}", Self::BLOCK);
        }
        let n = dims[dims.len() - 2];
        let x3 = x.reshape(((), n, dims[dims.len() - 1]))?;
        // One head: (b, 1, N, D).
        let q = self.q.forward_tokens(&x3)?.unsqueeze(1)?;
        let k = self.k.forward_tokens(&x3)?.unsqueeze(1)?;
        let v = self.v.forward_tokens(&x3)?.unsqueeze(1)?;
        trace::record_qkv(&q, &k, &v);
        // attn = (Q @ K.transpose(-2, -1)) / self.scale; attn.softmax(dim=-1) @ V
        let out = eager_attention(&q, &k, &v, None, Scale::Div(self.divisor))?.squeeze(1)?;
        let mut shape = dims;
        let last = shape.len() - 1;
        shape[last] = out.dim(2)?;
        let out = out.reshape(shape)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// Keyword arguments of `MultiHead_Attention`: either `(input_dim, nh, dh)` (first published
/// form) or `(input_dim, d_all, nh)` (second form). Exactly one of `dh` and `d_all` must be
/// given.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MultiHeadAttentionConfig {
    pub input_dim: usize,
    pub nh: usize,
    #[serde(default, deserialize_with = "present")]
    pub dh: Option<usize>,
    #[serde(default, deserialize_with = "present")]
    pub d_all: Option<usize>,
}

/// A key that is present must hold a number (`None` is no valid head size in Python either).
fn present<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<usize>, D::Error> {
    usize::deserialize(d).map(Some)
}

impl MultiHeadAttentionConfig {
    /// `(total features nh·dh, head dim, score divisor)` of the form the keys select.
    fn resolve(&self, block: &'static str) -> Result<(usize, usize, f64)> {
        match (self.dh, self.d_all) {
            (Some(dh), None) => {
                if self.nh == 0 || dh == 0 {
                    return Err(Error::config(
                        block,
                        format!("nh={} and dh={dh} must be greater than 0", self.nh),
                    ));
                }
                // self.scale = dh ** 0.5
                Ok((self.nh * dh, dh, (dh as f64).sqrt()))
            }
            (None, Some(d_all)) => {
                let dh = check_divides(block, d_all, self.nh)?;
                if dh == 0 {
                    return Err(Error::config(block, "d_all must be greater than 0"));
                }
                // self.scale = (d_all / nh) ** 0.5  (float division)
                Ok((d_all, dh, (d_all as f64 / self.nh as f64).sqrt()))
            }
            (dh, d_all) => {
                let mut keys = vec!["input_dim", "nh"];
                if dh.is_some() {
                    keys.push("dh");
                }
                if d_all.is_some() {
                    keys.push("d_all");
                }
                Err(Error::config(
                    block,
                    format!(
                        "expected the keys {{input_dim, nh, dh}} (MultiHead_Attention(input_dim, nh, dh)) or \
                         {{input_dim, d_all, nh}} (MultiHead_Attention(input_dim, d_all, nh)), found {{{}}}",
                        keys.join(", ")
                    ),
                ))
            }
        }
    }
}

/// `MultiHead_Attention` (both published forms).
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    q: Projection,
    k: Projection,
    v: Projection,
    fc: Projection,
    nh: usize,
    /// The scores are divided by this (`self.scale` in the Python).
    divisor: f64,
}

impl MultiHeadAttention {
    pub const BLOCK: &'static str = "textbook.MultiHeadAttention";

    pub fn new(vb: VarBuilder, cfg: &MultiHeadAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let (all, _dh, divisor) = cfg.resolve(Self::BLOCK)?;
        Ok(Self {
            q: Projection::load(vb.pp("q"), Self::BLOCK, cfg.input_dim, all, true)?,
            k: Projection::load(vb.pp("k"), Self::BLOCK, cfg.input_dim, all, true)?,
            v: Projection::load(vb.pp("v"), Self::BLOCK, cfg.input_dim, all, true)?,
            fc: Projection::load(vb.pp("fc"), Self::BLOCK, all, all, true)?,
            nh: cfg.nh,
            divisor,
        })
    }
}

impl Module for MultiHeadAttention {
    /// `x`: `(b, nq, input_dim)` → `(b, nq, nh·dh)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        // 'b nq (nh dh) -> b nh nq dh'
        let q = split_tokens(&self.q.forward_tokens(x)?, self.nh)?;
        let k = split_tokens(&self.k.forward_tokens(x)?, self.nh)?;
        let v = split_tokens(&self.v.forward_tokens(x)?, self.nh)?;
        trace::record_qkv(&q, &k, &v);
        // (Q @ K^T) / self.scale, softmax(dim=-1), @ V
        let out = eager_attention(&q, &k, &v, None, Scale::Div(self.divisor))?;
        // 'b nh nq dh -> b nq (nh dh)'
        let out = merge_tokens(&out)?;
        trace::record("attn", &out);
        let out = self.fc.forward_tokens(&out)?;
        trace::record("proj", &out);
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

    fn zeros_vb<S: AsRef<str>>(shapes: &[(S, Vec<usize>)]) -> VarBuilder<'static> {
        let dev = Device::Cpu;
        let map = shapes
            .iter()
            .map(|(n, s)| {
                (
                    n.as_ref().to_string(),
                    Tensor::zeros(s.as_slice(), DType::F32, &dev).unwrap(),
                )
            })
            .collect();
        VarBuilder::from_tensors(map, DType::F32, &dev)
    }

    fn mha(cfg: serde_json::Value) -> Result<MultiHeadAttention> {
        let cfg: MultiHeadAttentionConfig = from_json(MultiHeadAttention::BLOCK, &cfg)?;
        let all = cfg.dh.map_or(cfg.d_all.unwrap_or(0), |dh| cfg.nh * dh);
        let mut shapes = vec![
            ("fc.weight".to_string(), vec![all, all]),
            ("fc.bias".to_string(), vec![all]),
        ];
        for p in ["q", "k", "v"] {
            shapes.push((format!("{p}.weight"), vec![all, cfg.input_dim]));
            shapes.push((format!("{p}.bias"), vec![all]));
        }
        MultiHeadAttention::new(zeros_vb(&shapes), &cfg)
    }

    #[test]
    fn config_errors() {
        let err = mha(json!({"input_dim": 4, "nh": 2, "dh": 3, "heads": 2})).unwrap_err();
        assert!(err.to_string().contains("heads"), "{err}");
        let err = mha(json!({"input_dim": 4, "d_all": 10, "nh": 4})).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("4 heads"),
            "{err}"
        );
        let err = mha(json!({"input_dim": 4, "nh": 2, "dh": 3, "d_all": 6})).unwrap_err();
        assert!(err.to_string().contains("found {input_dim, nh, dh, d_all}"), "{err}");
        let err = mha(json!({"input_dim": 4, "nh": 2})).unwrap_err();
        assert!(err.to_string().contains("found {input_dim, nh}"), "{err}");
        let err = mha(json!({"input_dim": 4, "nh": 2, "dh": null})).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err}");
        mha(json!({"input_dim": 4, "nh": 2, "dh": 3})).unwrap();
        mha(json!({"input_dim": 4, "d_all": 6, "nh": 2})).unwrap();

        let err =
            from_json::<SelfAttentionConfig>(SelfAttention::BLOCK, &json!({"dx": 2, "D": 3, "Dv": 4})).unwrap_err();
        assert!(err.to_string().contains("dx"), "{err}");
        let cfg: SelfAttentionConfig = from_json(SelfAttention::BLOCK, &json!({"Dx": 2, "D": 3, "Dv": 4})).unwrap();
        let vb = zeros_vb(&[
            ("q.weight", vec![3, 2]),
            ("q.bias", vec![3]),
            ("k.weight", vec![3, 2]),
            ("k.bias", vec![3]),
            ("v.weight", vec![4, 2]),
            ("v.bias", vec![4]),
        ]);
        let m = SelfAttention::new(vb, &cfg).unwrap();
        let x = Tensor::zeros((5, 2), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward(&x).unwrap().dims(), &[5, 4]);
        let x = Tensor::zeros((3, 2, 5, 2), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward(&x).unwrap().dims(), &[3, 2, 5, 4]);
    }
}

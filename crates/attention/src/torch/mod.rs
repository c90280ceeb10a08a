//! `torch.nn.MultiheadAttention` (torch 2.15.0: `torch/nn/modules/activation.py` and
//! `torch.nn.functional.multi_head_attention_forward`), in eval mode.
//!
//! The forward mirrors the general (non-fast-path) code of `multi_head_attention_forward`:
//!
//! * in-projection from the packed `in_proj_weight (3E, E)` rows `[W_q; W_k; W_v]` (one linear
//!   for self-attention, as torch does when `query is key is value`; `[E | 2E]` when
//!   `key is value`), or from `q_proj_weight`/`k_proj_weight`/`v_proj_weight` when `kdim` or
//!   `vdim` differ from `embed_dim`; `in_proj_bias (3E)` chunked `[b_q; b_k; b_v]`;
//! * bool masks (as [`candle_core::DType::U8`], non-zero = `True` = **masked out**, the MHA convention) become
//!   `-inf`/`0` additive masks, float masks are added as they are;
//! * `bias_k`/`bias_v` `(1, 1, E)` appended at the **end** of the key/value sequence after the
//!   projection, `add_zero_attn` appends a zero key/value in head space; each pads the masks
//!   with one allowed column;
//! * heads in `(h d)` order; `attn_mask` `(L, S)` or `(N·H, L, S)` with index `n·H + h`;
//!   `key_padding_mask` `(N, S)` added to it;
//! * `need_weights=True`: `q · sqrt(1/d)` **before** `q·kᵀ`, softmax, weights returned
//!   `(N, L, S)` averaged over heads (or `(N, H, L, S)`); `need_weights=False`:
//!   `scaled_dot_product_attention` semantics (scale on the scores), no weights;
//! * `is_causal` is a hint that needs an `attn_mask` (torch raises otherwise); with
//!   `need_weights=False` and no `key_padding_mask` the mask is replaced by SDPA's upper-left
//!   causal mask over the final key length, otherwise the given `attn_mask` is used;
//! * `dropout` is ignored (eval); batched `(L, N, E)` / `(N, L, E)` (`batch_first`) and
//!   unbatched `(L, E)` inputs.
//!
//! Not mirrored: torch's fused fast path (`_native_multi_head_attention`, same math, other
//! rounding). Rows whose keys are all masked: the `need_weights=True` path gives NaN, like
//! torch's; with `need_weights=False` the CPU fast path of [`crate::sdpa`] gives 0 like torch's
//! SDPA, the reference and chunked paths NaN.
//!
//! The forward follows `multi_head_attention_forward`'s own steps, one module each:
//! `shape_check` (`_mha_shape_check` and the shape asserts), `in_projection`
//! (`_in_projection_packed` / `_in_projection`), `masks` (`_canonical_mask`, `key_padding_mask`,
//! `is_causal`), `extra_keys` (`bias_k`/`bias_v`, `add_zero_attn`) and `attention` (the
//! attention, `out_proj` and the weights' average).

mod attention;
mod extra_keys;
mod in_projection;
mod masks;
mod shape_check;

use crate::config::{check_divides, defaults};
use crate::layers::Projection;
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use in_projection::{InProj, Sharing};
use serde::Deserialize;

/// Keyword arguments of `MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
/// add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
/// device=None, dtype=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MultiheadAttentionConfig {
    pub embed_dim: usize,
    pub num_heads: usize,
    /// Attention dropout; inactive in eval, so ignored.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "defaults::yes")]
    pub bias: bool,
    #[serde(default)]
    pub add_bias_kv: bool,
    #[serde(default)]
    pub add_zero_attn: bool,
    #[serde(default)]
    pub kdim: Option<usize>,
    #[serde(default)]
    pub vdim: Option<usize>,
    #[serde(default)]
    pub batch_first: bool,
    /// Accepted only as `null`: the device comes from the `VarBuilder`.
    #[serde(default)]
    pub device: Option<serde_json::Value>,
    /// Accepted only as `null`: the dtype comes from the `VarBuilder`.
    #[serde(default)]
    pub dtype: Option<serde_json::Value>,
}

/// The forward's arguments after `query`, with torch's defaults
/// (`need_weights=True`, `average_attn_weights=True`).
///
/// A missing `key` is the `query` and a missing `value` the `key` (self-attention, as when the
/// same tensor object is passed to torch).
#[derive(Debug, Clone, Copy)]
pub struct MultiheadAttentionArgs<'a> {
    pub key: Option<&'a Tensor>,
    pub value: Option<&'a Tensor>,
    /// `(N, S)` (or `(S,)` unbatched); U8 (bool, non-zero = ignored) or additive float.
    pub key_padding_mask: Option<&'a Tensor>,
    pub need_weights: bool,
    /// `(L, S)` or `(N·num_heads, L, S)`; U8 (bool, non-zero = not allowed) or additive float.
    pub attn_mask: Option<&'a Tensor>,
    pub average_attn_weights: bool,
    pub is_causal: bool,
}

impl Default for MultiheadAttentionArgs<'_> {
    fn default() -> Self {
        Self {
            key: None,
            value: None,
            key_padding_mask: None,
            need_weights: true,
            attn_mask: None,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

/// `torch.nn.MultiheadAttention`.
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    in_proj: InProj,
    out_proj: Projection,
    bias_k: Option<Tensor>,
    bias_v: Option<Tensor>,
    add_zero_attn: bool,
    embed_dim: usize,
    kdim: usize,
    vdim: usize,
    num_heads: usize,
    head_dim: usize,
    batch_first: bool,
}

impl MultiheadAttention {
    pub const BLOCK: &'static str = "torch.nn.MultiheadAttention";

    pub fn new(vb: VarBuilder, cfg: &MultiheadAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        for (name, value) in [("device", &cfg.device), ("dtype", &cfg.dtype)] {
            if let Some(value) = value {
                return Err(Error::unsupported(
                    block,
                    format!(
                        "{name}={value}: only null is accepted; load the VarBuilder on the device and dtype wanted"
                    ),
                ));
            }
        }
        let e = cfg.embed_dim;
        if e == 0 {
            return Err(Error::config(block, "embed_dim must be greater than 0"));
        }
        let head_dim = check_divides(block, e, cfg.num_heads)?;
        let kdim = cfg.kdim.unwrap_or(e);
        let vdim = cfg.vdim.unwrap_or(e);
        if kdim == 0 || vdim == 0 {
            return Err(Error::config(
                block,
                format!("kdim={kdim} and vdim={vdim} must be greater than 0"),
            ));
        }
        let in_proj = InProj::load(&vb, e, kdim, vdim, cfg.bias)?;
        let (bias_k, bias_v) = if cfg.add_bias_kv {
            (Some(vb.get((1, 1, e), "bias_k")?), Some(vb.get((1, 1, e), "bias_v")?))
        } else {
            (None, None)
        };
        Ok(Self {
            in_proj,
            out_proj: Projection::load(vb.pp("out_proj"), block, e, e, cfg.bias)?,
            bias_k,
            bias_v,
            add_zero_attn: cfg.add_zero_attn,
            embed_dim: e,
            kdim,
            vdim,
            num_heads: cfg.num_heads,
            head_dim,
            batch_first: cfg.batch_first,
        })
    }

    fn input_err(name: &str, message: impl Into<String>) -> Error {
        Error::input(Self::BLOCK, name, message)
    }

    /// `forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights, is_causal)` → `(attn_output, attn_weights)`.
    ///
    /// `attn_output` has the query's layout (`(L, N, E)`, `(N, L, E)` with `batch_first`, or
    /// `(L, E)` unbatched). `attn_weights` (only with `need_weights`) is `(N, L, S)` averaged over
    /// heads or `(N, H, L, S)` (the batch dimension dropped for unbatched input), where `S`
    /// counts the appended `bias_k` / zero-attention keys.
    pub fn forward(&self, query: &Tensor, args: MultiheadAttentionArgs) -> Result<(Tensor, Option<Tensor>)> {
        crate::validate::input(Self::BLOCK, "query", query, &[])?;
        crate::validate::optional(Self::BLOCK, "key", args.key, &[])?;
        crate::validate::optional(Self::BLOCK, "value", args.value, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "key_padding_mask", args.key_padding_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "attn_mask", args.attn_mask)?;
        let key = args.key.unwrap_or(query);
        let value = args.value.unwrap_or(key);
        let sharing = Sharing {
            self_attention: key.id() == query.id() && value.id() == key.id(),
            key_is_value: value.id() == key.id(),
        };
        let batched = self.mha_shape_check(query, key, value, &args)?;
        // Everything batch-first `(N, L, E)` from here on.
        let inputs = self.batch_first_inputs(query, key, value, batched)?;
        let dtype = inputs.q.dtype();
        let mut masks = self.canonical_masks(&args, &inputs, batched)?;
        // In-projection, on (N, tokens, features). With batch_first, torch projects
        // `query.transpose(1, 0)`, a non-contiguous view: its Linear rounds twice in half precision.
        let strided = self.batch_first && batched;
        let projected = self
            .in_proj
            .forward((&inputs.q, &inputs.k, &inputs.v), sharing, strided)?;
        let (q, k, v) = self.heads_with_extra_keys(projected, &mut masks)?;
        trace::record_qkv(&q, &k, &v);
        let src_len = k.dim(2)?;
        let mask = masks.merged(inputs.l, src_len, dtype, q.device())?;
        let (out, weights) = self.attend(
            (&q, &k, &v),
            mask.as_ref(),
            dtype,
            (args.need_weights, args.average_attn_weights),
        )?;
        self.out_projection(&out, weights, batched)
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

    /// Build from JSON kwargs with random weights under the state-dict names torch would save.
    fn build(cfg: serde_json::Value) -> Result<MultiheadAttention> {
        let cfg: MultiheadAttentionConfig = from_json(MultiheadAttention::BLOCK, &cfg)?;
        let e = cfg.embed_dim;
        let (kdim, vdim) = (cfg.kdim.unwrap_or(e), cfg.vdim.unwrap_or(e));
        let mut shapes = vec![("out_proj.weight", vec![e, e])];
        if kdim == e && vdim == e {
            shapes.push(("in_proj_weight", vec![3 * e, e]));
        } else {
            shapes.push(("q_proj_weight", vec![e, e]));
            shapes.push(("k_proj_weight", vec![e, kdim]));
            shapes.push(("v_proj_weight", vec![e, vdim]));
        }
        if cfg.bias {
            shapes.push(("in_proj_bias", vec![3 * e]));
            shapes.push(("out_proj.bias", vec![e]));
        }
        if cfg.add_bias_kv {
            shapes.push(("bias_k", vec![1, 1, e]));
            shapes.push(("bias_v", vec![1, 1, e]));
        }
        MultiheadAttention::new(random_vb(&shapes), &cfg)
    }

    #[test]
    fn config_errors() {
        let err = build(json!({"embed_dim": 8, "num_heads": 2, "nheads": 2})).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("nheads"),
            "{err}"
        );
        let err = build(json!({"embed_dim": 10, "num_heads": 3})).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("3 heads"),
            "{err}"
        );
        let err = build(json!({"embed_dim": 8, "num_heads": 0})).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err}");
        let err = build(json!({"embed_dim": 8, "num_heads": 2, "dtype": "float16"})).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        build(
            json!({"embed_dim": 8, "num_heads": 2, "device": null, "dtype": null, "dropout": 0.1,
                     "kdim": 3, "vdim": null, "add_bias_kv": true, "add_zero_attn": true, "bias": false}),
        )
        .unwrap();
    }

    #[test]
    fn input_errors_not_panics() {
        let m = build(json!({"embed_dim": 8, "num_heads": 2, "batch_first": true})).unwrap();
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 5, 8), DType::F32, &dev).unwrap();
        let bad = Tensor::zeros((2, 5, 7), DType::F32, &dev).unwrap();
        let r4 = Tensor::zeros((1, 2, 5, 8), DType::F32, &dev).unwrap();
        assert!(matches!(m.forward(&r4, Default::default()), Err(Error::Input { .. })));
        assert!(matches!(m.forward(&bad, Default::default()), Err(Error::Input { .. })));
        let args = MultiheadAttentionArgs {
            key: Some(&bad),
            ..Default::default()
        };
        assert!(matches!(m.forward(&x, args), Err(Error::Input { .. })));
        let mask = Tensor::zeros((4, 4), DType::U8, &dev).unwrap();
        let args = MultiheadAttentionArgs {
            attn_mask: Some(&mask),
            ..Default::default()
        };
        assert!(matches!(m.forward(&x, args), Err(Error::Input { .. })));
        let args = MultiheadAttentionArgs {
            is_causal: true,
            ..Default::default()
        };
        assert!(matches!(m.forward(&x, args), Err(Error::Input { .. })));
        let kpm = Tensor::zeros((2, 6), DType::U8, &dev).unwrap();
        let args = MultiheadAttentionArgs {
            key_padding_mask: Some(&kpm),
            ..Default::default()
        };
        assert!(matches!(m.forward(&x, args), Err(Error::Input { .. })));
        let imask = Tensor::zeros((5, 5), DType::I64, &dev).unwrap();
        let args = MultiheadAttentionArgs {
            attn_mask: Some(&imask),
            ..Default::default()
        };
        assert!(matches!(m.forward(&x, args), Err(Error::Input { .. })));
        let (out, w) = m.forward(&x, Default::default()).unwrap();
        assert_eq!(out.dims(), &[2, 5, 8]);
        assert_eq!(w.unwrap().dims(), &[2, 5, 5]);
    }

    /// Random weights in a VarBuilder; `f` gets (name, shape) pairs.
    fn random_vb(shapes: &[(&str, Vec<usize>)]) -> VarBuilder<'static> {
        let dev = Device::Cpu;
        let map: HashMap<String, Tensor> = shapes
            .iter()
            .map(|(n, s)| (n.to_string(), Tensor::randn(0f32, 0.5, s.as_slice(), &dev).unwrap()))
            .collect();
        VarBuilder::from_tensors(map, DType::F32, &dev)
    }

    #[test]
    fn unbatched_matches_batched_and_layouts_agree() {
        let e = 12;
        let vb = random_vb(&[
            ("in_proj_weight", vec![3 * e, e]),
            ("in_proj_bias", vec![3 * e]),
            ("out_proj.weight", vec![e, e]),
            ("out_proj.bias", vec![e]),
            ("bias_k", vec![1, 1, e]),
            ("bias_v", vec![1, 1, e]),
        ]);
        let cfg = |bf: bool| -> MultiheadAttentionConfig {
            from_json(
                MultiheadAttention::BLOCK,
                &json!({"embed_dim": e, "num_heads": 3, "add_bias_kv": true, "add_zero_attn": true, "batch_first": bf}),
            )
            .unwrap()
        };
        let seq_first = MultiheadAttention::new(vb.clone(), &cfg(false)).unwrap();
        let batch_first = MultiheadAttention::new(vb, &cfg(true)).unwrap();
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1., (4, 2, e), &dev).unwrap(); // (L, N, E)
        let kv = Tensor::randn(0f32, 1., (6, 2, e), &dev).unwrap();
        let kpm = Tensor::new(&[[0u8, 1, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0]], &dev).unwrap();
        for need_weights in [true, false] {
            let args = MultiheadAttentionArgs {
                key: Some(&kv),
                value: Some(&kv),
                key_padding_mask: Some(&kpm),
                need_weights,
                ..Default::default()
            };
            let (a, wa) = seq_first.forward(&q, args).unwrap();
            let qb = q.transpose(0, 1).unwrap().contiguous().unwrap();
            let kvb = kv.transpose(0, 1).unwrap().contiguous().unwrap();
            let args_b = MultiheadAttentionArgs {
                key: Some(&kvb),
                value: Some(&kvb),
                ..args
            };
            let (b, wb) = batch_first.forward(&qb, args_b).unwrap();
            assert!(max_diff(&a.transpose(0, 1).unwrap(), &b) < 1e-5);
            for i in 0..2 {
                let qi = q.narrow(1, i, 1).unwrap().squeeze(1).unwrap();
                let kvi = kv.narrow(1, i, 1).unwrap().squeeze(1).unwrap();
                let kpmi = kpm.get(i).unwrap();
                let args_i = MultiheadAttentionArgs {
                    key: Some(&kvi),
                    value: Some(&kvi),
                    key_padding_mask: Some(&kpmi),
                    ..args
                };
                let (c, wc) = seq_first.forward(&qi, args_i).unwrap();
                assert!(max_diff(&a.narrow(1, i, 1).unwrap().squeeze(1).unwrap(), &c) < 1e-5);
                if need_weights {
                    let wa = wa.as_ref().unwrap();
                    assert_eq!(wa.dims(), &[2, 4, 8]); // 6 keys + bias_k + zero attention
                    assert!(max_diff(&wa.get(i).unwrap(), wc.as_ref().unwrap()) < 1e-6);
                }
            }
            if need_weights {
                assert!(max_diff(wa.as_ref().unwrap(), wb.as_ref().unwrap()) < 1e-6);
            } else {
                assert!(wa.is_none() && wb.is_none());
            }
        }
    }

    #[test]
    fn weights_and_sdpa_paths_agree_and_causal_hint() {
        let e = 8;
        let vb = random_vb(&[
            ("in_proj_weight", vec![3 * e, e]),
            ("in_proj_bias", vec![3 * e]),
            ("out_proj.weight", vec![e, e]),
            ("out_proj.bias", vec![e]),
        ]);
        let cfg: MultiheadAttentionConfig = from_json(
            MultiheadAttention::BLOCK,
            &json!({"embed_dim": e, "num_heads": 2, "batch_first": true}),
        )
        .unwrap();
        let m = MultiheadAttention::new(vb, &cfg).unwrap();
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 5, e), &dev).unwrap();
        let (a, _) = m.forward(&x, Default::default()).unwrap();
        let args = MultiheadAttentionArgs {
            need_weights: false,
            ..Default::default()
        };
        let (b, w) = m.forward(&x, args).unwrap();
        assert!(w.is_none());
        assert!(max_diff(&a, &b) < 1e-5);
        // is_causal with need_weights=False replaces the (here: all-allowed) mask by a causal one;
        // with need_weights=True the given mask is used. A bool causal mask gives the same result.
        let none = Tensor::zeros((5, 5), DType::U8, &dev).unwrap();
        let causal_bool = Tensor::from_vec(
            (0..25u8).map(|i| u8::from(i % 5 > i / 5)).collect::<Vec<_>>(),
            (5, 5),
            &dev,
        )
        .unwrap();
        let args = MultiheadAttentionArgs {
            attn_mask: Some(&none),
            is_causal: true,
            need_weights: false,
            ..Default::default()
        };
        let (c, _) = m.forward(&x, args).unwrap();
        let args = MultiheadAttentionArgs {
            attn_mask: Some(&causal_bool),
            ..Default::default()
        };
        let (d, w) = m.forward(&x, args).unwrap();
        assert!(max_diff(&c, &d) < 1e-5);
        let w = w.unwrap().to_vec3::<f32>().unwrap();
        assert_eq!(w[0][0][1], 0.0);
        assert!((w[1][4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(max_diff(&c, &a) > 1e-4);
    }
}

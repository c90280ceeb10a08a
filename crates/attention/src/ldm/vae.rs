//! The single-head spatial attention of CompVis latent-diffusion (commit a506df5; identical in
//! CompVis/stable-diffusion 21f890f, SD 1.x, and Stability-AI/stablediffusion cf1d67a, SD 2.x):
//!
//! * [`AttnBlock`] ← `ldm.modules.diffusionmodules.model.AttnBlock(in_channels)`, the
//!   first-stage VAE / DDPM `Model` mid attention (`mid.attn_1`, `make_attn(.., "vanilla")`);
//! * [`SpatialSelfAttention`] ← `ldm.modules.attention.SpatialSelfAttention(in_channels)`: the
//!   same math and keys, written with `rearrange`/`einsum` instead of `reshape`/`bmm`;
//! * [`LinAttnBlock`] ← `ldm.modules.diffusionmodules.model.LinAttnBlock(in_channels)`
//!   (`make_attn(.., "linear")`), which *is* `LinearAttention(dim=C, heads=1, dim_head=C)`:
//!   keys `to_qkv.weight (3C, C, 1, 1)` (no bias), `to_out.{weight,bias}`; **no norm and no
//!   residual** (`Model`/`Encoder`/`Decoder` do `h = self.mid.attn_1(h)`).
//!
//! `AttnBlock` / `SpatialSelfAttention`: `norm = Normalize(C)` = `GroupNorm(32, C, eps=1e-6)`;
//! `q`, `k`, `v`, `proj_out` = `Conv2d(C, C, 1)` with bias (weights `(C, C, 1, 1)`); one head of
//! `C` channels, scores multiplied by `int(c) ** -0.5` **after** `q·kᵀ`, softmax over the keys,
//! and the residual `x + proj_out(h_)` **inside** the block.

use crate::heads::{merge_channels, split_channels};
use crate::layers::{group_norm, Projection};
use crate::ldm::linear::{LinearAttention, LinearAttentionConfig};
use crate::sdpa::{eager_attention, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `AttnBlock(in_channels)`, `SpatialSelfAttention(in_channels)` and
/// `LinAttnBlock(in_channels)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttnBlockConfig {
    pub in_channels: usize,
}

/// Keyword arguments of `SpatialSelfAttention(in_channels)`.
pub type SpatialSelfAttentionConfig = AttnBlockConfig;

/// Keyword arguments of `LinAttnBlock(in_channels)`.
pub type LinAttnBlockConfig = AttnBlockConfig;

/// ldm `Normalize(in_channels)`: `GroupNorm(num_groups=32, eps=1e-6, affine=True)`.
const NORM_GROUPS: usize = 32;
const NORM_EPS: f64 = 1e-6;

fn check_channels(block: &'static str, in_channels: usize) -> Result<()> {
    if in_channels == 0 {
        return Err(Error::config(block, "in_channels must be greater than 0"));
    }
    Ok(())
}

/// Check that `x` is `(B, in_channels, H, W)`.
fn check_image(block: &'static str, x: &Tensor, in_channels: usize) -> Result<()> {
    if x.rank() != 4 || x.dim(1)? != in_channels {
        return Err(Error::input(
            block,
            "x",
            format!("expected (B, {in_channels}, H, W), found {:?}", x.dims()),
        ));
    }
    Ok(())
}

/// The layers shared by `AttnBlock` and `SpatialSelfAttention`.
#[derive(Debug, Clone)]
struct VanillaAttention {
    block: &'static str,
    in_channels: usize,
    norm: crate::layers::GroupNorm,
    q: Projection,
    k: Projection,
    v: Projection,
    proj_out: Projection,
    /// `int(c) ** (-0.5)`.
    scale: f64,
}

impl VanillaAttention {
    fn new(block: &'static str, vb: VarBuilder, cfg: &AttnBlockConfig) -> Result<Self> {
        let c = cfg.in_channels;
        check_channels(block, c)?;
        Ok(Self {
            block,
            in_channels: c,
            norm: group_norm(vb.pp("norm"), block, NORM_GROUPS, c, NORM_EPS)?,
            q: Projection::load(vb.pp("q"), block, c, c, true)?,
            k: Projection::load(vb.pp("k"), block, c, c, true)?,
            v: Projection::load(vb.pp("v"), block, c, c, true)?,
            proj_out: Projection::load(vb.pp("proj_out"), block, c, c, true)?,
            scale: (c as f64).powf(-0.5),
        })
    }

    /// `x`: `(B, C, H, W)` → `(B, C, H, W)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_image(self.block, x, self.in_channels)?;
        let h_ = self.norm.forward(x)?;
        trace::record("norm", &h_);
        let q = self.q.forward_channels(&h_)?;
        let k = self.k.forward_channels(&h_)?;
        let v = self.v.forward_channels(&h_)?;

        // compute attention
        let (b, c, h, w) = q.dims4()?;
        // q: 'b c h w -> b (h w) c', k and v: 'b c h w -> b c (h w)'; one head: (b, 1, hw, c).
        let tokens = |t: &Tensor| split_channels(&t.reshape((b, c, h * w))?, 1);
        let (q, k, v) = (tokens(&q)?, tokens(&k)?, tokens(&v)?);
        trace::record_qkv(&q, &k, &v);
        // w_ = bmm(q, k) * int(c)**(-0.5); softmax(w_, dim=2);
        // h_ = bmm(v, w_.permute(0, 2, 1)): h_[b, c, i] = Σ_j v[b, c, j] w_[b, i, j]
        let h_ = eager_attention(&q, &k, &v, None, Scale::Mul(self.scale))?;
        let h_ = merge_channels(&h_)?.reshape((b, c, h, w))?;
        trace::record("attn", &h_);

        let h_ = self.proj_out.forward_channels(&h_)?;
        trace::record("proj", &h_);
        let out = crate::ops::add(x, &h_)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `ldm.modules.diffusionmodules.model.AttnBlock`.
#[derive(Debug, Clone)]
pub struct AttnBlock(VanillaAttention);

impl AttnBlock {
    pub const BLOCK: &'static str = "ldm.AttnBlock";

    pub fn new(vb: VarBuilder, cfg: &AttnBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Ok(Self(VanillaAttention::new(Self::BLOCK, vb, cfg)?))
    }

    /// The forward with the crate's errors: a wrong input shape is [`Error::Input`].
    pub fn forward_checked(&self, x: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        self.0.forward(x)
    }
}

impl Module for AttnBlock {
    /// `x`: `(B, C, H, W)` → `x + proj_out(attention(norm(x)))`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        self.0.forward(x).map_err(Into::into)
    }
}

/// `ldm.modules.attention.SpatialSelfAttention`.
#[derive(Debug, Clone)]
pub struct SpatialSelfAttention(VanillaAttention);

impl SpatialSelfAttention {
    pub const BLOCK: &'static str = "ldm.SpatialSelfAttention";

    pub fn new(vb: VarBuilder, cfg: &SpatialSelfAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Ok(Self(VanillaAttention::new(Self::BLOCK, vb, cfg)?))
    }

    /// The forward with the crate's errors: a wrong input shape is [`Error::Input`].
    pub fn forward_checked(&self, x: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        self.0.forward(x)
    }
}

impl Module for SpatialSelfAttention {
    /// `x`: `(B, C, H, W)` → `x + proj_out(attention(norm(x)))`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        // q 'b c h w -> b (h w) c', k 'b c h w -> b c (h w)', einsum('bij,bjk->bik', q, k)
        // * int(c)**(-0.5), softmax(dim=2), v 'b c h w -> b c (h w)', w_ 'b i j -> b j i',
        // einsum('bij,bjk->bik', v, w_), 'b c (h w) -> b c h w', proj_out, x + h_:
        // AttnBlock's forward step for step.
        self.0.forward(x).map_err(Into::into)
    }
}

/// `ldm.modules.diffusionmodules.model.LinAttnBlock`: [`LinearAttention`] with one head of
/// `in_channels` channels.
#[derive(Debug, Clone)]
pub struct LinAttnBlock {
    attention: LinearAttention,
    in_channels: usize,
}

impl LinAttnBlock {
    pub const BLOCK: &'static str = "ldm.LinAttnBlock";

    pub fn new(vb: VarBuilder, cfg: &LinAttnBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let c = cfg.in_channels;
        check_channels(Self::BLOCK, c)?;
        // super().__init__(dim=in_channels, heads=1, dim_head=in_channels)
        let inner = LinearAttentionConfig {
            dim: c,
            heads: 1,
            dim_head: c,
        };
        Ok(Self {
            attention: LinearAttention::new(vb, &inner)?,
            in_channels: c,
        })
    }

    /// The forward with the crate's errors: a wrong input shape is [`Error::Input`].
    pub fn forward_checked(&self, x: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        check_image(Self::BLOCK, x, self.in_channels)?;
        Ok(self.attention.forward(x)?)
    }
}

impl Module for LinAttnBlock {
    /// `x`: `(B, C, H, W)` → `(B, C, H, W)`; no norm, no residual.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        self.forward_checked(x).map_err(Into::into)
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

    fn vanilla_weights(c: usize, dev: &Device) -> HashMap<String, Tensor> {
        let mut map = HashMap::new();
        for p in ["q", "k", "v", "proj_out"] {
            map.insert(
                format!("{p}.weight"),
                Tensor::randn(0f32, 0.3, (c, c, 1, 1), dev).unwrap(),
            );
            map.insert(format!("{p}.bias"), Tensor::randn(0f32, 0.3, c, dev).unwrap());
        }
        map.insert("norm.weight".into(), Tensor::randn(1f32, 0.1, c, dev).unwrap());
        map.insert("norm.bias".into(), Tensor::randn(0f32, 0.1, c, dev).unwrap());
        map
    }

    /// A plain f64 re-statement of `AttnBlock.forward` over vectors.
    fn naive_attn_block(map: &HashMap<String, Tensor>, x: &Tensor) -> Vec<f64> {
        let get = |n: &str| {
            map[n]
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        let (b, c, h, w) = x.dims4().unwrap();
        let n = h * w;
        let xs = x
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let (gw, gb) = (get("norm.weight"), get("norm.bias"));
        let per = c / 32;
        let mut out = vec![0.0; xs.len()];
        for bi in 0..b {
            let xb = &xs[bi * c * n..(bi + 1) * c * n];
            let mut hn = vec![0.0; c * n];
            for g in 0..32 {
                let s = &xb[g * per * n..(g + 1) * per * n];
                let mean = s.iter().sum::<f64>() / s.len() as f64;
                let var = s.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / s.len() as f64;
                for ci in g * per..(g + 1) * per {
                    for t in 0..n {
                        hn[ci * n + t] = (xb[ci * n + t] - mean) / (var + 1e-6).sqrt() * gw[ci] + gb[ci];
                    }
                }
            }
            let conv = |p: &str, inp: &[f64]| {
                let (wt, bs) = (get(&format!("{p}.weight")), get(&format!("{p}.bias")));
                let mut o = vec![0.0; c * n];
                for co in 0..c {
                    for t in 0..n {
                        o[co * n + t] = bs[co] + (0..c).map(|ci| wt[co * c + ci] * inp[ci * n + t]).sum::<f64>();
                    }
                }
                o
            };
            let (q, k, v) = (conv("q", &hn), conv("k", &hn), conv("v", &hn));
            let mut att = vec![0.0; c * n];
            for i in 0..n {
                let s: Vec<f64> = (0..n)
                    .map(|j| (0..c).map(|ci| q[ci * n + i] * k[ci * n + j]).sum::<f64>() * (c as f64).powf(-0.5))
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for ci in 0..c {
                    att[ci * n + i] = (0..n).map(|j| v[ci * n + j] * e[j] / z).sum();
                }
            }
            let proj = conv("proj_out", &att);
            for idx in 0..c * n {
                out[bi * c * n + idx] = xb[idx] + proj[idx];
            }
        }
        out
    }

    #[test]
    fn attn_block_matches_a_naive_restatement_and_spatial_self_attention() {
        let dev = Device::Cpu;
        let c = 64;
        let map = vanilla_weights(c, &dev);
        let vb = VarBuilder::from_tensors(map.clone(), DType::F32, &dev);
        let cfg: AttnBlockConfig = from_json(AttnBlock::BLOCK, &json!({"in_channels": c})).unwrap();
        let a = AttnBlock::new(vb.clone(), &cfg).unwrap();
        let s = SpatialSelfAttention::new(vb, &cfg).unwrap();
        let x = Tensor::randn(0f32, 1., (2, c, 3, 5), &dev).unwrap();
        let ya = a.forward(&x).unwrap();
        let ys = s.forward(&x).unwrap();
        assert_eq!(ya.dims(), x.dims());
        assert_eq!(max_diff(&ya, &ys), 0.0);
        let want = Tensor::from_vec(naive_attn_block(&map, &x), x.dims(), &dev).unwrap();
        // f32 against f64, relative to the output's magnitude.
        let scale = want
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        let err = max_diff(&ya.to_dtype(DType::F64).unwrap(), &want) / scale;
        assert!(err < 1e-5, "{err} (max |y| {scale})");
        // f64 weights and input stay f64 throughout.
        let vb64 = VarBuilder::from_tensors(map, DType::F64, &dev);
        let a64 = AttnBlock::new(vb64, &cfg).unwrap();
        let y64 = a64.forward(&x.to_dtype(DType::F64).unwrap()).unwrap();
        let err = max_diff(&y64, &want);
        assert!(err < 1e-12, "{err}");
    }

    #[test]
    fn config_and_input_errors() {
        let dev = Device::Cpu;
        let err = from_json::<AttnBlockConfig>(AttnBlock::BLOCK, &json!({"in_channels": 64, "heads": 2})).unwrap_err();
        assert!(err.to_string().contains("heads"), "{err}");
        // 48 channels: not divisible by the 32 groups of Normalize.
        let vb = VarBuilder::from_tensors(vanilla_weights(48, &dev), DType::F32, &dev);
        let err = AttnBlock::new(vb, &AttnBlockConfig { in_channels: 48 }).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("32 norm groups do not divide 48 channels"),
            "{err}"
        );
        let vb = VarBuilder::from_tensors(vanilla_weights(32, &dev), DType::F32, &dev);
        let err = SpatialSelfAttention::new(vb.clone(), &AttnBlockConfig { in_channels: 0 }).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{err}");
        let a = AttnBlock::new(vb, &AttnBlockConfig { in_channels: 32 }).unwrap();
        for shape in [vec![2, 32, 9], vec![2, 16, 3, 3], vec![1, 32, 2, 2, 2]] {
            let x = Tensor::zeros(shape.as_slice(), DType::F32, &dev).unwrap();
            let err = a.forward_checked(&x).unwrap_err();
            assert!(matches!(err, Error::Input { .. }), "{err}");
            assert!(a.forward(&x).is_err());
        }
    }

    #[test]
    fn lin_attn_block_is_single_head_linear_attention() {
        let dev = Device::Cpu;
        let c = 6;
        let map = HashMap::from([
            (
                "to_qkv.weight".to_string(),
                Tensor::randn(0f32, 0.5, (3 * c, c, 1, 1), &dev).unwrap(),
            ),
            (
                "to_out.weight".to_string(),
                Tensor::randn(0f32, 0.5, (c, c, 1, 1), &dev).unwrap(),
            ),
            ("to_out.bias".to_string(), Tensor::randn(0f32, 0.5, c, &dev).unwrap()),
        ]);
        let vb = VarBuilder::from_tensors(map, DType::F32, &dev);
        let cfg: LinAttnBlockConfig = from_json(LinAttnBlock::BLOCK, &json!({"in_channels": c})).unwrap();
        let block = LinAttnBlock::new(vb.clone(), &cfg).unwrap();
        let linear = LinearAttention::new(
            vb.clone(),
            &LinearAttentionConfig {
                dim: c,
                heads: 1,
                dim_head: c,
            },
        )
        .unwrap();
        let x = Tensor::randn(0f32, 1., (2, c, 4, 3), &dev).unwrap();
        assert_eq!(max_diff(&block.forward(&x).unwrap(), &linear.forward(&x).unwrap()), 0.0);
        let x = Tensor::zeros((2, c, 12), DType::F32, &dev).unwrap();
        assert!(matches!(block.forward_checked(&x).unwrap_err(), Error::Input { .. }));
        // A to_qkv with heads·dim_head ≠ C is a weight-shape error, not a panic.
        let err = LinAttnBlock::new(vb, &LinAttnBlockConfig { in_channels: 4 }).unwrap_err();
        assert!(err.to_string().contains("to_qkv.weight"), "{err}");
    }
}

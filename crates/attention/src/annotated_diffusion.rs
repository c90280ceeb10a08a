//! The Hugging Face "Annotated Diffusion" blog post's blocks (huggingface/blog
//! `annotated-diffusion.md`, a port of lucidrains ≈0.27): `Attention` and `LinearAttention`.
//!
//! No norm inside (the post wraps them in `PreNorm(GroupNorm(1, dim))` and `Residual`),
//! bias-free `to_qkv` 1×1 conv with `[Q | K | V]` channels and `(h c)` heads, `q` scaled
//! before the product. `Attention` subtracts the detached row max before its softmax (a no-op
//! that the core's softmax performs anyway); `LinearAttention` ends in conv 1×1 +
//! `GroupNorm(1, dim)`.

use crate::config::defaults;
use crate::heads::merge_channels;
use crate::layers::{group_norm, FusedQkvConv, Projection};
use crate::ops::{matmul, mul, softmax};
use crate::sdpa::{default_scale, linear_attention};
use crate::Result;
use candle_core::{Module, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `Attention(dim, heads=4, dim_head=32)` and
/// `LinearAttention(dim, heads=4, dim_head=32)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub dim: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub heads: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub dim_head: usize,
}

/// The blog post's `Attention`.
#[derive(Debug, Clone)]
pub struct Attention {
    to_qkv: FusedQkvConv,
    to_out: Projection,
    scale: f64,
}

impl Attention {
    pub const BLOCK: &'static str = "annotated_diffusion.Attention";

    pub fn new(vb: VarBuilder, cfg: &Config) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let hidden = cfg.heads * cfg.dim_head;
        Ok(Self {
            to_qkv: FusedQkvConv::load(vb.pp("to_qkv"), Self::BLOCK, cfg.dim, cfg.heads, cfg.dim_head)?,
            to_out: Projection::load(vb.pp("to_out"), Self::BLOCK, hidden, cfg.dim, true)?,
            scale: default_scale(cfg.dim_head),
        })
    }
}

impl Module for Attention {
    /// `x`: `(B, dim, H, W)` → `(B, dim, H, W)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let (b, _, h, w) = x.dims4()?;
        let [q, k, v] = self.to_qkv.forward(x)?;
        // Stages q, k, v: (B, H, N, D), q before its scale.
        crate::trace::record_qkv_channels(&q, &k, &v);
        crate::sdpa::trace_probs(&q.t()?, &k.t()?, None, crate::sdpa::Scale::Mul(self.scale));
        // q = q * self.scale
        let q = mul(&q, self.scale)?;
        // sim = einsum('b h d i, b h d j -> b h i j', q, k)
        let sim = matmul(&q.t()?, &k)?;
        // sim = sim - sim.amax(dim=-1, keepdim=True).detach(); attn = sim.softmax(dim=-1)
        let sim = sim.broadcast_sub(&sim.max_keepdim(D::Minus1)?)?;
        let attn = softmax(&sim, D::Minus1)?;
        // out = einsum('b h i j, b h d j -> b h i d', attn, v)
        let out = matmul(&attn, &v.t()?)?;
        // 'b h (x y) d -> b (h d) x y'
        let out = merge_channels(&out)?.reshape((b, (), h, w))?;
        crate::trace::record("attn", &out);
        let out = self.to_out.forward_channels(&out)?;
        crate::trace::record("proj", &out);
        crate::trace::record("output", &out);
        Ok(out)
    }
}

/// The blog post's `LinearAttention`.
#[derive(Debug, Clone)]
pub struct LinearAttention {
    to_qkv: FusedQkvConv,
    to_out: Projection,
    out_norm: crate::layers::GroupNorm,
    scale: f64,
}

impl LinearAttention {
    pub const BLOCK: &'static str = "annotated_diffusion.LinearAttention";

    pub fn new(vb: VarBuilder, cfg: &Config) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let hidden = cfg.heads * cfg.dim_head;
        Ok(Self {
            to_qkv: FusedQkvConv::load(vb.pp("to_qkv"), Self::BLOCK, cfg.dim, cfg.heads, cfg.dim_head)?,
            to_out: Projection::load(vb.pp("to_out.0"), Self::BLOCK, hidden, cfg.dim, true)?,
            out_norm: group_norm(vb.pp("to_out.1"), Self::BLOCK, 1, cfg.dim, 1e-5)?,
            scale: default_scale(cfg.dim_head),
        })
    }
}

impl Module for LinearAttention {
    /// `x`: `(B, dim, H, W)` → `(B, dim, H, W)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let (b, _, h, w) = x.dims4()?;
        let [q, k, v] = self.to_qkv.forward(x)?;
        let out = linear_attention(&q, &k, &v, Some(self.scale))?.reshape((b, (), h, w))?;
        crate::trace::record("attn", &out);
        // to_out = Sequential(Conv2d, GroupNorm(1, dim))
        let out = self.out_norm.forward(&self.to_out.forward_channels(&out)?)?;
        crate::trace::record("proj", &out);
        crate::trace::record("output", &out);
        Ok(out)
    }
}

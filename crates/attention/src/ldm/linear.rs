//! CompVis latent-diffusion / Stable Diffusion 1.x `ldm.modules.attention.LinearAttention`
//! (commit a506df5; also `ldm.modules.diffusionmodules.model.LinAttnBlock`, which is
//! `LinearAttention(dim=C, heads=1, dim_head=C)`).
//!
//! `to_qkv` 1×1 conv without bias, split `'b (qkv heads c) h w -> qkv b heads c (h w)'`,
//! softmax of `k` over tokens only: no `q` softmax, no scale, no norm, no residual.

use crate::layers::{FusedQkvConv, Projection};
use crate::sdpa::linear_attention;
use crate::Result;
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

/// Keyword arguments of `LinearAttention(dim, heads=4, dim_head=32)`.
pub type LinearAttentionConfig = crate::annotated_diffusion::Config;

/// `ldm.modules.attention.LinearAttention`.
#[derive(Debug, Clone)]
pub struct LinearAttention {
    to_qkv: FusedQkvConv,
    to_out: Projection,
}

impl LinearAttention {
    pub const BLOCK: &'static str = "ldm.LinearAttention";

    pub fn new(vb: VarBuilder, cfg: &LinearAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let hidden = cfg.heads * cfg.dim_head;
        Ok(Self {
            to_qkv: FusedQkvConv::load(vb.pp("to_qkv"), Self::BLOCK, cfg.dim, cfg.heads, cfg.dim_head)?,
            to_out: Projection::load(vb.pp("to_out"), Self::BLOCK, hidden, cfg.dim, true)?,
        })
    }
}

impl Module for LinearAttention {
    /// `x`: `(B, dim, H, W)` → `(B, dim, H, W)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let (b, _, h, w) = x.dims4()?;
        // '(qkv heads c)' has the same channel order as chunk(3) followed by '(heads c)'.
        let [q, k, v] = self.to_qkv.forward(x)?;
        // k softmax over tokens only: no q softmax, no scale.
        let out = linear_attention(&q, &k, &v, None)?.reshape((b, (), h, w))?;
        crate::trace::record("attn", &out);
        let out = self.to_out.forward_channels(&out)?;
        crate::trace::record("proj", &out);
        crate::trace::record("output", &out);
        Ok(out)
    }
}

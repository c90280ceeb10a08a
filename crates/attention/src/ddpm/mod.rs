//! lucidrains' `denoising-diffusion-pytorch` 2.x (2.0.0 – 2.3.4): `Attention` (the full
//! attention of `Unet.mid_attn`) and `LinearAttention` (the down/up stages).
//!
//! Both normalise with RMSNorm first, project q/k/v with one bias-free 1×1 conv (`to_qkv`,
//! channel layout `[Q | K | V]`, heads `(h c)`), prepend `num_mem_kv` learned memory
//! key/values (`mem_kv`) and have **no residual inside** (`Unet.forward` adds `x` itself).
//!
//! [`mid_block`]: the whole `Unet` bottleneck (`ResnetBlock`, `MidBlock`).

use crate::config::defaults;
use crate::heads::merge_channels;
use crate::layers::{FusedQkvConv, Projection, RmsNorm};
use crate::sdpa::{default_scale, eager_attention, linear_attention, sdpa, Scale};
use crate::trace;
use crate::Result;
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

pub mod mid_block;
pub use mid_block::{MidBlock, MidBlockConfig, ResnetBlock, ResnetBlockConfig};

/// Keyword arguments of `Attention(dim, heads=4, dim_head=32, num_mem_kv=4, flash=False)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionConfig {
    pub dim: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub heads: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub dim_head: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub num_mem_kv: usize,
    /// `Attend(flash=True)`: `F.scaled_dot_product_attention` instead of the einsum/softmax
    /// code. The same math; in f16/bf16 it rounds at other points ([`sdpa`] vs
    /// [`eager_attention`]).
    #[serde(default)]
    pub flash: bool,
}

/// Keyword arguments of `LinearAttention(dim, heads=4, dim_head=32, num_mem_kv=4)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinearAttentionConfig {
    pub dim: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub heads: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub dim_head: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub num_mem_kv: usize,
}

/// Memory key/values `(heads, n, d)` repeated over the batch: `(B, heads, n, d)`.
fn repeat_batch(mem: &Tensor, batch: usize) -> candle_core::Result<Tensor> {
    let (h, n, d) = mem.dims3()?;
    mem.unsqueeze(0)?.broadcast_as((batch, h, n, d))
}

/// `denoising_diffusion_pytorch.Attention`.
#[derive(Debug, Clone)]
pub struct Attention {
    norm: RmsNorm,
    mem_kv: Tensor,
    to_qkv: FusedQkvConv,
    to_out: Projection,
    scale: f64,
    flash: bool,
}

impl Attention {
    pub const BLOCK: &'static str = "denoising_diffusion_pytorch.Attention";

    pub fn new(vb: VarBuilder, cfg: &AttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let hidden = cfg.heads * cfg.dim_head;
        Ok(Self {
            norm: RmsNorm::load(vb.pp("norm"), cfg.dim)?,
            mem_kv: vb.get((2, cfg.heads, cfg.num_mem_kv, cfg.dim_head), "mem_kv")?,
            to_qkv: FusedQkvConv::load(vb.pp("to_qkv"), Self::BLOCK, cfg.dim, cfg.heads, cfg.dim_head)?,
            to_out: Projection::load(vb.pp("to_out"), Self::BLOCK, hidden, cfg.dim, true)?,
            scale: default_scale(cfg.dim_head),
            flash: cfg.flash,
        })
    }
}

impl Module for Attention {
    /// `x`: `(B, dim, H, W)` → `(B, dim, H, W)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let (b, _, h, w) = x.dims4()?;
        let normed = self.norm.forward(x)?;
        trace::record("norm", &normed);
        let [q, k, v] = self.to_qkv.forward(&normed)?;
        // 'b h c n -> b h n c'
        let (q, k, v) = (q.transpose(2, 3)?, k.transpose(2, 3)?, v.transpose(2, 3)?);
        let mk = repeat_batch(&self.mem_kv.get(0)?, b)?;
        let mv = repeat_batch(&self.mem_kv.get(1)?, b)?;
        let k = Tensor::cat(&[&mk, &k], 2)?;
        let v = Tensor::cat(&[&mv, &v], 2)?;
        trace::record_qkv(&q, &k, &v);
        let out = if self.flash {
            // Attend.flash_attn: F.scaled_dot_product_attention(q, k, v)
            sdpa(&q, &k, &v, None, self.scale)?
        } else {
            // Attend (non-flash): einsum(q, k) * scale, softmax, einsum(attn, v).
            eager_attention(&q, &k, &v, None, Scale::Mul(self.scale))?
        };
        let out = merge_channels(&out)?.reshape((b, (), h, w))?;
        trace::record("attn", &out);
        let out = self.to_out.forward_channels(&out)?;
        trace::record("proj", &out);
        trace::record("output", &out);
        Ok(out)
    }
}

/// `denoising_diffusion_pytorch.LinearAttention`.
#[derive(Debug, Clone)]
pub struct LinearAttention {
    norm: RmsNorm,
    mem_kv: Tensor,
    to_qkv: FusedQkvConv,
    to_out: Projection,
    out_norm: RmsNorm,
    scale: f64,
}

impl LinearAttention {
    pub const BLOCK: &'static str = "denoising_diffusion_pytorch.LinearAttention";

    pub fn new(vb: VarBuilder, cfg: &LinearAttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let hidden = cfg.heads * cfg.dim_head;
        Ok(Self {
            norm: RmsNorm::load(vb.pp("norm"), cfg.dim)?,
            // Note the layout (2, heads, dim_head, num_mem_kv), transposed against Attention's.
            mem_kv: vb.get((2, cfg.heads, cfg.dim_head, cfg.num_mem_kv), "mem_kv")?,
            to_qkv: FusedQkvConv::load(vb.pp("to_qkv"), Self::BLOCK, cfg.dim, cfg.heads, cfg.dim_head)?,
            to_out: Projection::load(vb.pp("to_out.0"), Self::BLOCK, hidden, cfg.dim, true)?,
            out_norm: RmsNorm::load(vb.pp("to_out.1"), cfg.dim)?,
            scale: default_scale(cfg.dim_head),
        })
    }
}

impl Module for LinearAttention {
    /// `x`: `(B, dim, H, W)` → `(B, dim, H, W)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let (b, _, h, w) = x.dims4()?;
        let normed = self.norm.forward(x)?;
        trace::record("norm", &normed);
        let [q, k, v] = self.to_qkv.forward(&normed)?;
        let mk = repeat_batch(&self.mem_kv.get(0)?, b)?;
        let mv = repeat_batch(&self.mem_kv.get(1)?, b)?;
        let k = Tensor::cat(&[&mk, &k], 3)?;
        let v = Tensor::cat(&[&mv, &v], 3)?;
        // q softmax over features, k softmax over tokens (memory included), q * scale.
        let out = linear_attention(&q, &k, &v, Some(self.scale))?.reshape((b, (), h, w))?;
        trace::record("attn", &out);
        // to_out = Sequential(Conv2d, RMSNorm)
        let out = self.out_norm.forward(&self.to_out.forward_channels(&out)?)?;
        trace::record("proj", &out);
        trace::record("output", &out);
        Ok(out)
    }
}

//! The bottleneck of lucidrains' `denoising_diffusion_pytorch.Unet` 2.x (2.0.0 – 2.3.4):
//! `mid_block1` → `mid_attn` (+ residual) → `mid_block2`, with RMSNorm ResNet blocks conditioned
//! FiLM-style on the time embedding.
//!
//! lucidrains has no mid-block class; [`MidBlock`] is these lines of `Unet.forward`, with the
//! `Unet`'s own key names (`mid_block1.*`, `mid_attn.*`, `mid_block2.*`):
//!
//! ```text
//! t = time_mlp(time)                 # the input `time_emb` here
//! x = mid_block1(x, t); x = mid_attn(x) + x; x = mid_block2(x, t)
//! ```
//!
//! `ResnetBlock(dim, dim_out, time_emb_dim=None, dropout=0.)`:
//! ```text
//! mlp = Sequential(SiLU(), Linear(time_emb_dim, dim_out * 2))      # keys mlp.1.*
//! block1 = Block(dim, dim_out, dropout); block2 = Block(dim_out, dim_out)
//! res_conv = Conv2d(dim, dim_out, 1) if dim != dim_out else Identity()
//! Block: proj = Conv2d(dim, dim_out, 3, padding=1); norm = RMSNorm(dim_out)  # keys proj.*, norm.g
//!        x = norm(proj(x)); x = x * (scale + 1) + shift (when given); x = silu(x)
//! forward(x, time_emb): scale, shift = mlp(time_emb)[..., None, None].chunk(2, dim=1)
//!                       h = block1(x, (scale, shift)); h = block2(h); return h + res_conv(x)
//! ```

use crate::config::defaults;
use crate::ddpm::{Attention, AttentionConfig};
use crate::layers::{scale_shift, Activation, Conv2d, Projection, RmsNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `Block(dim, dim_out, dropout=0.)`: 3×3 conv, RMSNorm, optional FiLM, SiLU.
#[derive(Debug, Clone)]
struct Block {
    proj: Conv2d,
    norm: RmsNorm,
}

impl Block {
    fn new(vb: VarBuilder, dim: usize, dim_out: usize) -> Result<Self> {
        Ok(Self {
            proj: Conv2d::load(vb.pp("proj"), dim, dim_out, 3, true)?,
            norm: RmsNorm::load(vb.pp("norm"), dim_out)?,
        })
    }

    /// `stages`: the trace names of the conv and norm outputs (`conv1`, `norm1`).
    fn forward(&self, x: &Tensor, film: Option<(&Tensor, &Tensor)>, stages: [&str; 2]) -> candle_core::Result<Tensor> {
        let x = self.proj.forward(x)?;
        trace::record(stages[0], &x);
        if !trace::enabled() {
            // Norm, FiLM and SiLU in one pass (the trace wants the norm's output alone).
            return self.norm.forward_film_silu(&x, film, true);
        }
        let x = self.norm.forward(&x)?;
        trace::record(stages[1], &x);
        let x = match film {
            Some((scale, shift)) => scale_shift(&x, scale, shift)?,
            None => x,
        };
        Activation::Swish.forward(&x)
    }
}

/// Keyword arguments of `ResnetBlock(dim, dim_out, *, time_emb_dim=None, dropout=0.)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetBlockConfig {
    pub dim: usize,
    pub dim_out: usize,
    #[serde(default)]
    pub time_emb_dim: Option<usize>,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
}

/// `denoising_diffusion_pytorch.denoising_diffusion_pytorch.ResnetBlock`.
#[derive(Debug, Clone)]
pub struct ResnetBlock {
    dim: usize,
    mlp: Option<Projection>,
    block1: Block,
    block2: Block,
    res_conv: Option<Conv2d>,
}

impl ResnetBlock {
    pub const BLOCK: &'static str = "denoising_diffusion_pytorch.ResnetBlock";

    pub fn new(vb: VarBuilder, cfg: &ResnetBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        if cfg.dim == 0 || cfg.dim_out == 0 {
            return Err(Error::config(Self::BLOCK, "dim and dim_out must be greater than 0"));
        }
        Ok(Self {
            dim: cfg.dim,
            mlp: match cfg.time_emb_dim {
                Some(t) => Some(Projection::load(vb.pp("mlp.1"), Self::BLOCK, t, 2 * cfg.dim_out, true)?),
                None => None,
            },
            block1: Block::new(vb.pp("block1"), cfg.dim, cfg.dim_out)?,
            block2: Block::new(vb.pp("block2"), cfg.dim_out, cfg.dim_out)?,
            res_conv: if cfg.dim != cfg.dim_out {
                Some(Conv2d::load(vb.pp("res_conv"), cfg.dim, cfg.dim_out, 1, true)?)
            } else {
                None
            },
        })
    }

    /// `forward(x, time_emb=None)`: `x` `(B, dim, H, W)`, `time_emb` `(B, time_emb_dim)` (used
    /// only when the block has an `mlp`, as in PyTorch).
    pub fn forward(&self, x: &Tensor, time_emb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "time_emb", time_emb, &[])?;
        if x.rank() != 4 || x.dim(1)? != self.dim {
            return Err(Error::input(
                Self::BLOCK,
                "x",
                format!("expected (B, {}, H, W), found {:?}", self.dim, x.dims()),
            ));
        }
        let film = match (&self.mlp, time_emb) {
            (Some(mlp), Some(t)) => {
                if t.rank() != 2 || t.dim(0)? != x.dim(0)? {
                    return Err(Error::input(
                        Self::BLOCK,
                        "time_emb",
                        format!("expected (B={}, time_emb_dim), found {:?}", x.dim(0)?, t.dims()),
                    ));
                }
                let t = mlp.forward_tokens(&Activation::Swish.forward(t)?)?;
                trace::record("temb", &t);
                let half = t.dim(1)? / 2;
                Some((t.narrow(1, 0, half)?, t.narrow(1, half, half)?))
            }
            _ => None,
        };
        let h = self
            .block1
            .forward(x, film.as_ref().map(|(s, b)| (s, b)), ["conv1", "norm1"])?;
        let h = self.block2.forward(&h, None, ["conv2", "norm2"])?;
        // res_conv: a 1×1 conv, or nn.Identity when dim == dim_out
        let residual = match &self.res_conv {
            Some(conv) => conv.forward(x)?,
            None => x.clone(),
        };
        trace::record("shortcut", &residual);
        let out = crate::ops::add(&h, &residual)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// The `Unet` arguments that shape its bottleneck: `mid_dim = dim · dim_mults[-1]`,
/// `time_emb_dim = 4 · dim`, `heads = attn_heads[-1]`, `dim_head = attn_dim_head[-1]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MidBlockConfig {
    /// `mid_dim`, the channels at the bottleneck.
    pub dim: usize,
    /// The width of the time embedding after `time_mlp` (`4 · Unet.dim`).
    #[serde(default)]
    pub time_emb_dim: Option<usize>,
    #[serde(default = "defaults::usize::<4>")]
    pub heads: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub dim_head: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub num_mem_kv: usize,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    /// `Unet(flash_attn=True)`: the attention runs through `F.scaled_dot_product_attention`.
    #[serde(default)]
    pub flash: bool,
}

/// `Unet.mid_block1` → `Unet.mid_attn` (+ residual) → `Unet.mid_block2`.
#[derive(Debug, Clone)]
pub struct MidBlock {
    mid_block1: ResnetBlock,
    mid_attn: Attention,
    mid_block2: ResnetBlock,
}

impl MidBlock {
    pub const BLOCK: &'static str = "denoising_diffusion_pytorch.MidBlock";

    /// `vb` at the `Unet`'s prefix (`model.` in a `GaussianDiffusion` state dict,
    /// `ema_model.model.` in its EMA's).
    pub fn new(vb: VarBuilder, cfg: &MidBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let resnet = ResnetBlockConfig {
            dim: cfg.dim,
            dim_out: cfg.dim,
            time_emb_dim: cfg.time_emb_dim,
            dropout: cfg.dropout,
        };
        let attn = AttentionConfig {
            dim: cfg.dim,
            heads: cfg.heads,
            dim_head: cfg.dim_head,
            num_mem_kv: cfg.num_mem_kv,
            flash: cfg.flash,
        };
        Ok(Self {
            mid_block1: ResnetBlock::new(vb.pp("mid_block1"), &resnet)?,
            mid_attn: Attention::new(vb.pp("mid_attn"), &attn)?,
            mid_block2: ResnetBlock::new(vb.pp("mid_block2"), &resnet)?,
        })
    }

    /// `x` `(B, dim, H, W)`, `time_emb` `(B, time_emb_dim)` (the output of `Unet.time_mlp`).
    pub fn forward(&self, x: &Tensor, time_emb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "time_emb", time_emb, &[])?;
        let x = trace::scope("mid_block1", || self.mid_block1.forward(x, time_emb))?;
        let x = crate::ops::add(&trace::scope("mid_attn", || self.mid_attn.forward(&x))?, &x)?;
        let out = trace::scope("mid_block2", || self.mid_block2.forward(&x, time_emb))?;
        trace::record("output", &out);
        Ok(out)
    }
}

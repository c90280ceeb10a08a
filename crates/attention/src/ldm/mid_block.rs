//! The mid block of CompVis latent-diffusion's `ldm/modules/diffusionmodules/model.py` (a506df5;
//! the same in CompVis/stable-diffusion and Stability-AI/stablediffusion): the first-stage
//! VAE `Encoder`/`Decoder` and the DDPM `Model` bottleneck, `mid.block_1` → `mid.attn_1` →
//! `mid.block_2`. ldm has no mid-block class (`self.mid = nn.Module()`); [`MidBlock`] is the
//! forward lines with ldm's key names (`block_1.*`, `attn_1.*`, `block_2.*` under `...mid.`):
//!
//! ```text
//! h = mid.block_1(h, temb); h = mid.attn_1(h); h = mid.block_2(h, temb)
//! ```
//!
//! `attn_1 = make_attn(C, attn_type)`: `"vanilla"` [`AttnBlock`] (residual inside), `"linear"`
//! [`LinAttnBlock`] (no norm, **no residual**), `"none"` identity. The VAE has no time
//! embedding (`temb_ch = 0`, no `temb_proj`).
//!
//! `ResnetBlock(*, in_channels, out_channels=None, conv_shortcut=False, dropout, temb_channels=512)`:
//! ```text
//! h = conv1(swish(norm1(x)));  h += temb_proj(swish(temb))[:, :, None, None]   (when temb is given)
//! h = conv2(dropout(swish(norm2(h))));  return shortcut(x) + h
//! norm = Normalize(C) = GroupNorm(32, C, eps=1e-6); swish(x) = x * torch.sigmoid(x)
//! shortcut: conv_shortcut (3×3) if conv_shortcut else nin_shortcut (1×1), only when in != out
//! ```

use crate::config::defaults;
use crate::cpu_kernels::{ConvExtras, Swish};
use crate::layers::{group_norm, Conv2d, GroupNorm, Projection};
use crate::ldm::vae::{AttnBlock, AttnBlockConfig, LinAttnBlock};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

const NORM_GROUPS: usize = 32;
const NORM_EPS: f64 = 1e-6;

/// ldm's `nonlinearity(x) = x * torch.sigmoid(x)`: two ops, each rounded to the input dtype
/// (the sigmoid computed in at least f32).
fn nonlinearity(x: &Tensor) -> candle_core::Result<Tensor> {
    let s = candle_nn::ops::sigmoid(&crate::ops::upcast(x)?)?.to_dtype(x.dtype())?;
    if crate::ops::is_half(x.dtype()) {
        (crate::ops::upcast(x)? * crate::ops::upcast(&s)?)?.to_dtype(x.dtype())
    } else {
        x * s
    }
}

/// Keyword arguments of `ResnetBlock(*, in_channels, out_channels=None, conv_shortcut=False,
/// dropout, temb_channels=512)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetBlockConfig {
    pub in_channels: usize,
    #[serde(default)]
    pub out_channels: Option<usize>,
    #[serde(default)]
    pub conv_shortcut: bool,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    /// `0`: no `temb_proj` (the VAE).
    #[serde(default = "defaults::usize::<512>")]
    pub temb_channels: usize,
}

/// `ldm.modules.diffusionmodules.model.ResnetBlock`.
#[derive(Debug, Clone)]
pub struct ResnetBlock {
    in_channels: usize,
    norm1: GroupNorm,
    conv1: Conv2d,
    temb_proj: Option<Projection>,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    pub const BLOCK: &'static str = "ldm.ResnetBlock";

    pub fn new(vb: VarBuilder, cfg: &ResnetBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c, out) = (cfg.in_channels, cfg.out_channels.unwrap_or(cfg.in_channels));
        let shortcut = match (c != out, cfg.conv_shortcut) {
            (false, _) => None,
            (true, true) => Some(Conv2d::load(vb.pp("conv_shortcut"), c, out, 3, true)?),
            (true, false) => Some(Conv2d::load(vb.pp("nin_shortcut"), c, out, 1, true)?),
        };
        Ok(Self {
            in_channels: c,
            norm1: group_norm(vb.pp("norm1"), block, NORM_GROUPS, c, NORM_EPS)?,
            conv1: Conv2d::load(vb.pp("conv1"), c, out, 3, true)?,
            temb_proj: match cfg.temb_channels {
                0 => None,
                t => Some(Projection::load(vb.pp("temb_proj"), block, t, out, true)?),
            },
            norm2: group_norm(vb.pp("norm2"), block, NORM_GROUPS, out, NORM_EPS)?,
            conv2: Conv2d::load(vb.pp("conv2"), out, out, 3, true)?,
            shortcut,
        })
    }

    /// `forward(x, temb)`: `x` `(B, in_channels, H, W)`; `temb` `(B, temb_channels)` or `None`
    /// (a `temb` for a block without `temb_proj` is an error, as in PyTorch).
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let block = Self::BLOCK;
        if x.rank() != 4 || x.dim(1)? != self.in_channels {
            return Err(Error::input(
                block,
                "x",
                format!("expected (B, {}, H, W), found {:?}", self.in_channels, x.dims()),
            ));
        }
        let temb = match (temb, &self.temb_proj) {
            (None, _) => None,
            (Some(t), Some(proj)) => {
                if t.rank() != 2 || t.dim(0)? != x.dim(0)? {
                    return Err(Error::input(
                        block,
                        "temb",
                        format!("expected (B={}, temb_channels), found {:?}", x.dim(0)?, t.dims()),
                    ));
                }
                let t = proj.forward_tokens(&nonlinearity(t)?)?;
                trace::record("temb", &t);
                Some(t)
            }
            (Some(_), None) => {
                return Err(Error::input(
                    block,
                    "temb",
                    "given, but the block has no temb_proj (temb_channels is 0)",
                ))
            }
        };
        let h = self
            .norm1
            .forward_swish(x, "norm1", Swish::TimesSigmoid, nonlinearity)?;
        // `conv1(..) + temb_proj(..)[:, :, None, None]`, the add in conv1's write-out (on CUDA
        // in norm2's fused kernel instead).
        let pre_add = temb.as_ref().filter(|t| GroupNorm::fuses_pre_add(&h, t));
        let extras = ConvExtras {
            channel_add: if pre_add.is_some() { None } else { temb.as_ref() },
            ..ConvExtras::default()
        };
        let h = self.conv1.forward_traced(&h, "conv1", extras)?;
        let h = match pre_add {
            Some(t) => self
                .norm2
                .forward_swish_add(&h, t, "norm2", Swish::TimesSigmoid, nonlinearity)?,
            None => self
                .norm2
                .forward_swish(&h, "norm2", Swish::TimesSigmoid, nonlinearity)?,
        };
        let shortcut = match &self.shortcut {
            Some(conv) => {
                let s = conv.forward(x)?;
                trace::record("shortcut", &s);
                s
            }
            None => x.clone(),
        };
        // `x + h`, in conv2's write-out.
        let extras = ConvExtras {
            residual: Some(&shortcut),
            ..ConvExtras::default()
        };
        let out = self.conv2.forward_traced(&h, "conv2", extras)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `make_attn`'s `attn_type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttnType {
    #[default]
    Vanilla,
    Linear,
    None,
}

/// The `Model`/`Encoder`/`Decoder` arguments that shape the mid block: `in_channels = block_in`
/// (`ch · ch_mult[-1]`), `temb_channels = temb_ch` (`4 · ch` for the DDPM `Model`, `0` for the
/// VAE), `attn_type`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MidBlockConfig {
    pub in_channels: usize,
    #[serde(default)]
    pub temb_channels: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub attn_type: AttnType,
}

#[derive(Debug, Clone)]
enum MidAttention {
    /// Boxed: the block is several times the size of the others.
    Vanilla(Box<AttnBlock>),
    Linear(LinAttnBlock),
    Identity,
}

/// `mid.block_1` → `mid.attn_1` → `mid.block_2`.
#[derive(Debug, Clone)]
pub struct MidBlock {
    block_1: ResnetBlock,
    attn_1: MidAttention,
    block_2: ResnetBlock,
}

impl MidBlock {
    pub const BLOCK: &'static str = "ldm.MidBlock";

    /// `vb` at the `mid.` prefix (e.g. `first_stage_model.decoder.mid`).
    pub fn new(vb: VarBuilder, cfg: &MidBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let resnet = ResnetBlockConfig {
            in_channels: cfg.in_channels,
            out_channels: Some(cfg.in_channels),
            conv_shortcut: false,
            dropout: cfg.dropout,
            temb_channels: cfg.temb_channels,
        };
        let attn = AttnBlockConfig {
            in_channels: cfg.in_channels,
        };
        Ok(Self {
            block_1: ResnetBlock::new(vb.pp("block_1"), &resnet)?,
            attn_1: match cfg.attn_type {
                AttnType::Vanilla => MidAttention::Vanilla(Box::new(AttnBlock::new(vb.pp("attn_1"), &attn)?)),
                AttnType::Linear => MidAttention::Linear(LinAttnBlock::new(vb.pp("attn_1"), &attn)?),
                AttnType::None => MidAttention::Identity,
            },
            block_2: ResnetBlock::new(vb.pp("block_2"), &resnet)?,
        })
    }

    /// `x` `(B, in_channels, H, W)`; `temb` `(B, temb_channels)`, `None` for the VAE.
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let h = trace::scope("block_1", || self.block_1.forward(x, temb))?;
        let h = trace::scope("attn_1", || -> Result<Tensor> {
            let h = match &self.attn_1 {
                MidAttention::Vanilla(a) => a.forward_checked(&h)?,
                MidAttention::Linear(a) => a.forward_checked(&h)?,
                MidAttention::Identity => {
                    trace::record("output", &h);
                    h
                }
            };
            Ok(h)
        })?;
        let out = trace::scope("block_2", || self.block_2.forward(&h, temb))?;
        trace::record("output", &out);
        Ok(out)
    }
}

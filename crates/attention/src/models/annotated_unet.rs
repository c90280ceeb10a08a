//! The Hugging Face "Annotated Diffusion" blog post's `Unet` (huggingface/blog
//! `annotated-diffusion.md` at fd0b6566b04f, section "Conditional U-Net"), the whole model, under
//! its own state-dict names (`init_conv`, `time_mlp.1`, `downs.0.2.fn.fn.to_qkv`, `mid_attn.fn.norm`,
//! `ups.1.3.1`, ...), built from the blocks of [`crate::annotated_diffusion`].
//!
//! ```text
//! forward(x, time, x_self_cond=None):
//!   if self_condition: x = cat(x_self_cond or zeros_like(x), x)
//!   x = init_conv(x); r = x                                   # 1×1, padding 0
//!   t = time_mlp(time)        # SinusoidalPositionEmbeddings(dim), Linear, GELU, Linear
//!   for block1, block2, attn, down in downs:
//!     x = block1(x, t); h.append(x); x = block2(x, t); x = attn(x); h.append(x); x = down(x)
//!   x = mid_block1(x, t); x = mid_attn(x); x = mid_block2(x, t)
//!   for block1, block2, attn, up in ups:
//!     x = block1(cat(x, h.pop()), t); x = block2(cat(x, h.pop()), t); x = attn(x); x = up(x)
//!   return final_conv(final_res_block(cat(x, r), t))
//! attn = Residual(PreNorm(dim, LinearAttention(dim))): x + LinearAttention(GroupNorm(1, dim)(x));
//! mid_attn the same with the full Attention(mid_dim); down: pixel-unshuffle 2×2 then a 1×1 conv,
//! up: nearest ×2 then a 3×3 conv (a 3×3 conv at either last stage); resnets: the post's
//! ResnetBlock (weight-standardized convs, GroupNorm(resnet_block_groups)).
//! ```
//!
//! Unlike lucidrains' `Unet` it has one ResNet group count for all blocks, attention heads fixed at
//! 4 × 32, no options for the time features, and `final_res_block(2 · dim, dim)`: the model runs
//! only with `init_dim == dim` (PyTorch's forward fails otherwise; here the load does). Stages are
//! recorded by module path (`downs.0.2`, `downs.0.2/fn/norm`, `mid_block1/block1/proj`). PyTorch's
//! `Unet` does not run in half precision (its time embedding is float32 whatever the weights).

use super::ddpm_unet::{body, per_sample, self_conditioned_input, Attend, Resample, Stage, TimeMlp};
use super::time_embedding::PosEmb;
use crate::annotated_diffusion::{
    Attention, Config as AttentionConfig, LinearAttention, ResnetBlock, ResnetBlockConfig,
};
use crate::layers::{group_norm, Conv2d, GroupNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

const BLOCK: &str = "annotated_diffusion.Unet";

/// Keyword arguments of the post's `Unet.__init__`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AnnotatedUnetConfig {
    pub dim: usize,
    #[serde(default)]
    pub init_dim: Option<usize>,
    #[serde(default)]
    pub out_dim: Option<usize>,
    #[serde(default = "mults")]
    pub dim_mults: Vec<usize>,
    #[serde(default = "three")]
    pub channels: usize,
    #[serde(default)]
    pub self_condition: bool,
    #[serde(default = "four")]
    pub resnet_block_groups: usize,
}

fn mults() -> Vec<usize> {
    vec![1, 2, 4, 8]
}
fn three() -> usize {
    3
}
fn four() -> usize {
    4
}

impl AnnotatedUnetConfig {
    /// `dims = [init_dim, dim * m for m in dim_mults]`, as (in, out) pairs per stage.
    fn in_out(&self) -> Vec<(usize, usize)> {
        let mut dims = vec![self.init_dim.unwrap_or(self.dim)];
        dims.extend(self.dim_mults.iter().map(|m| m * self.dim));
        dims.windows(2).map(|w| (w[0], w[1])).collect()
    }
}

/// `Residual(PreNorm(dim, fn))`: `x + fn(GroupNorm(1, dim)(x))`, keys `fn.norm.*`, `fn.fn.*`.
#[derive(Debug, Clone)]
struct PreNormResidual<A> {
    norm: GroupNorm,
    attn: A,
}

impl<A: Module> PreNormResidual<A> {
    fn new(vb: VarBuilder, dim: usize, attn: impl FnOnce(VarBuilder) -> Result<A>) -> Result<Self> {
        Ok(Self {
            norm: group_norm(vb.pp("fn.norm"), BLOCK, 1, dim, 1e-5)?,
            attn: attn(vb.pp("fn.fn"))?,
        })
    }
}

/// Stages `<path>/fn/norm`, `<path>/fn` (the attention's output) and `<path>`.
impl<A: Module> Attend for PreNormResidual<A> {
    fn attend(&self, path: &str, x: &Tensor) -> Result<Tensor> {
        let out = trace::scope(path, || -> Result<Tensor> {
            let h = self.norm.forward(x)?;
            trace::record("fn/norm", &h);
            let h = trace::scope("fn/fn", || self.attn.forward(&h))?;
            trace::record("fn", &h);
            Ok(crate::ops::add(&h, x)?)
        })?;
        trace::record(path, &out);
        Ok(out)
    }
}

/// One entry of `downs` / `ups`: two resnets, the pre-normed linear attention, the resampling.
type AnnotatedStage = Stage<ResnetBlock, PreNormResidual<LinearAttention>>;

/// The Annotated Diffusion post's `Unet`.
#[derive(Debug, Clone)]
pub struct AnnotatedUnet {
    config: AnnotatedUnetConfig,
    init_conv: Conv2d,
    time_mlp: TimeMlp,
    downs: Vec<AnnotatedStage>,
    mid_block1: ResnetBlock,
    mid_attn: PreNormResidual<Attention>,
    mid_block2: ResnetBlock,
    ups: Vec<AnnotatedStage>,
    final_res_block: ResnetBlock,
    final_conv: Conv2d,
}

impl AnnotatedUnet {
    pub const BLOCK: &'static str = BLOCK;

    /// Build the model from its weights (`vb` at the `Unet`'s keys) and its constructor kwargs.
    pub fn new(vb: VarBuilder, cfg: &AnnotatedUnetConfig) -> Result<Self> {
        crate::validate::constructor(BLOCK, &vb, cfg)?;
        let n = cfg.dim_mults.len();
        if n == 0 || cfg.dim < 4 || cfg.init_dim.is_some_and(|d| d != cfg.dim) {
            return Err(Error::config(
                BLOCK,
                "dim must be at least 4 (its sinusoidal embedding divides by dim / 2 - 1), dim_mults non-empty, \
                 and init_dim (when given) equal to dim (final_res_block takes 2 · dim channels)",
            ));
        }
        let time_dim = cfg.dim * 4;
        let resnet = |vb: VarBuilder, dim, dim_out| {
            let groups = cfg.resnet_block_groups;
            ResnetBlock::new(
                vb,
                &ResnetBlockConfig {
                    dim,
                    dim_out,
                    time_emb_dim: Some(time_dim),
                    groups,
                },
            )
        };
        let linear = |vb: VarBuilder, dim| {
            PreNormResidual::new(vb, dim, |vb| {
                LinearAttention::new(
                    vb,
                    &AttentionConfig {
                        dim,
                        heads: 4,
                        dim_head: 32,
                    },
                )
            })
        };
        let in_out = cfg.in_out();
        let mut downs = Vec::with_capacity(n);
        for (i, &(d_in, d_out)) in in_out.iter().enumerate() {
            let vb = vb.pp("downs").pp(i);
            downs.push(AnnotatedStage {
                block1: resnet(vb.pp(0), d_in, d_in)?,
                block2: resnet(vb.pp(1), d_in, d_in)?,
                attn: linear(vb.pp(2), d_in)?,
                resample: Resample::load(vb, false, i + 1 == n, d_in, d_out)?,
            });
        }
        let mut ups = Vec::with_capacity(n);
        for (i, &(d_in, d_out)) in in_out.iter().rev().enumerate() {
            let vb = vb.pp("ups").pp(i);
            ups.push(AnnotatedStage {
                block1: resnet(vb.pp(0), d_out + d_in, d_out)?,
                block2: resnet(vb.pp(1), d_out + d_in, d_out)?,
                attn: linear(vb.pp(2), d_out)?,
                resample: Resample::load(vb, true, i + 1 == n, d_out, d_in)?,
            });
        }
        let mid = in_out[n - 1].1;
        let input = cfg.channels * if cfg.self_condition { 2 } else { 1 };
        let full = |vb: VarBuilder| {
            Attention::new(
                vb,
                &AttentionConfig {
                    dim: mid,
                    heads: 4,
                    dim_head: 32,
                },
            )
        };
        let sinusoidal = PosEmb::Sinusoidal {
            dim: cfg.dim,
            theta: 10000.0,
        };
        Ok(Self {
            config: cfg.clone(),
            init_conv: Conv2d::load(vb.pp("init_conv"), input, cfg.dim, 1, true)?,
            time_mlp: TimeMlp::load(vb.pp("time_mlp"), BLOCK, sinusoidal, (cfg.dim, time_dim))?,
            downs,
            mid_block1: resnet(vb.pp("mid_block1"), mid, mid)?,
            mid_attn: PreNormResidual::new(vb.pp("mid_attn"), mid, full)?,
            mid_block2: resnet(vb.pp("mid_block2"), mid, mid)?,
            ups,
            final_res_block: resnet(vb.pp("final_res_block"), 2 * cfg.dim, cfg.dim)?,
            final_conv: Conv2d::load(
                vb.pp("final_conv"),
                cfg.dim,
                cfg.out_dim.unwrap_or(cfg.channels),
                1,
                true,
            )?,
        })
    }

    pub fn config(&self) -> &AnnotatedUnetConfig {
        &self.config
    }

    /// `forward(x, time, x_self_cond=None)`: `x` `(B, channels, H, W)` with H and W multiples of
    /// 2^(stages − 1), `time` `(B,)` or `(1,)` (integer or float timesteps).
    pub fn forward(&self, x: &Tensor, time: &Tensor, x_self_cond: Option<&Tensor>) -> Result<Tensor> {
        let shape = (self.config.channels, self.downs.len(), self.config.self_condition);
        let x = self_conditioned_input(BLOCK, shape, x, time, x_self_cond)?;
        let h0 = self.init_conv.forward(&x)?;
        trace::record("init_conv", &h0);
        let t = per_sample(self.time_mlp.forward(time, x.dtype())?, x.dim(0)?)?;
        let mid = (&self.mid_block1, &self.mid_attn, &self.mid_block2);
        let h = body(BLOCK, (&h0, &t), &self.downs, mid, &self.ups, &self.final_res_block)?;
        let out = self.final_conv.forward(&h)?;
        trace::record("final_conv", &out);
        trace::record("output", &out);
        Ok(out)
    }
}

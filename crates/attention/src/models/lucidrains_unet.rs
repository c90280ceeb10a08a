//! lucidrains' `denoising_diffusion_pytorch.Unet` (2.0.0 – 2.3.4), the whole model, under its own
//! state-dict names (`init_conv`, `time_mlp.1`, `downs.0.2`, `mid_attn`, `ups.1.3.1`, ...; in a
//! `Trainer.save` checkpoint behind `model.` in its `model` entry, `ema_model.model.` in `ema`),
//! built from the checked blocks of [`crate::ddpm`].
//!
//! ```text
//! forward(x, time, x_self_cond=None):
//!   if self_condition: x = cat(x_self_cond or zeros_like(x), x)
//!   x = init_conv(x); r = x                               # 7×7
//!   t = time_mlp(time)   # SinusoidalPosEmb(dim, theta) or RandomOrLearnedSinusoidalPosEmb, Linear, GELU, Linear
//!   for block1, block2, attn, down in downs:
//!     x = block1(x, t); h.append(x); x = block2(x, t); x = attn(x) + x; h.append(x); x = down(x)
//!   x = mid_block1(x, t); x = mid_attn(x) + x; x = mid_block2(x, t)
//!   for block1, block2, attn, up in ups:
//!     x = block1(cat(x, h.pop()), t); x = block2(cat(x, h.pop()), t); x = attn(x) + x; x = up(x)
//!   return final_conv(final_res_block(cat(x, r), t))
//! down: pixel-unshuffle 2×2 then a 1×1 conv (a 3×3 conv at the last stage);
//! up: nearest ×2 then a 3×3 conv (a 3×3 conv at the last stage); attn: full `Attention` where
//! `full_attn` says (by default the innermost stage only), else `LinearAttention`.
//! ```
//!
//! Stages are recorded by module path (`init_conv`, `downs.0.1`, `mid_attn`, `ups.1.3`). PyTorch's
//! `Unet` cannot run in half precision (its sinusoidal embedding is float32 whatever the weights);
//! here the embedding is computed in float32 and cast to the run's dtype.

use super::ddpm_unet::{body, per_sample, run, self_conditioned_input, Attend, Resample, TimeMlp};
use super::time_embedding::PosEmb;
use super::unet_2d_condition_config::PerBlock;
use crate::ddpm::{Attention, AttentionConfig, LinearAttention, LinearAttentionConfig, ResnetBlock, ResnetBlockConfig};
use crate::layers::Conv2d;
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

const BLOCK: &str = "denoising_diffusion_pytorch.Unet";

/// Keyword arguments of `Unet.__init__` (denoising-diffusion-pytorch 2.3.4).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LucidrainsUnetConfig {
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
    #[serde(default)]
    pub learned_variance: bool,
    #[serde(default)]
    pub learned_sinusoidal_cond: bool,
    #[serde(default)]
    pub random_fourier_features: bool,
    #[serde(default = "sixteen")]
    pub learned_sinusoidal_dim: usize,
    #[serde(default = "theta")]
    pub sinusoidal_pos_emb_theta: f64,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "dim_head")]
    pub attn_dim_head: PerBlock<usize>,
    #[serde(default = "heads")]
    pub attn_heads: PerBlock<usize>,
    /// Per stage (or one for all); `null`, `false` or `[]`: the innermost stage only.
    #[serde(default)]
    pub full_attn: Option<PerBlock<bool>>,
    #[serde(default)]
    pub flash_attn: bool,
}

fn mults() -> Vec<usize> {
    vec![1, 2, 4, 8]
}
fn three() -> usize {
    3
}
fn sixteen() -> usize {
    16
}
fn theta() -> f64 {
    10000.0
}
fn dim_head() -> PerBlock<usize> {
    PerBlock::One(32)
}
fn heads() -> PerBlock<usize> {
    PerBlock::One(4)
}

impl LucidrainsUnetConfig {
    /// `full_attn` per stage, as `__init__` reads it (a falsy value: the innermost stage only).
    pub fn full_attn_per_stage(&self) -> Result<Vec<bool>> {
        let n = self.dim_mults.len();
        let innermost = (0..n).map(|i| i + 1 == n).collect();
        match &self.full_attn {
            None | Some(PerBlock::One(false)) => Ok(innermost),
            Some(PerBlock::List(v)) if v.is_empty() => Ok(innermost),
            Some(per) => per_stage(per, "full_attn", n),
        }
    }

    fn init_dim(&self) -> usize {
        self.init_dim.unwrap_or(self.dim)
    }

    /// `dims = [init_dim, dim * m for m in dim_mults]`, as (in, out) pairs per stage.
    fn in_out(&self) -> Vec<(usize, usize)> {
        let mut dims = vec![self.init_dim()];
        dims.extend(self.dim_mults.iter().map(|m| m * self.dim));
        dims.windows(2).map(|w| (w[0], w[1])).collect()
    }
}

/// A stage's attention: full where `full_attn` says, else linear.
#[derive(Debug, Clone)]
enum StageAttention {
    Full(Attention),
    Linear(LinearAttention),
}

/// One entry of `downs` / `ups`.
type Stage = super::ddpm_unet::Stage<ResnetBlock, StageAttention>;

/// `cast_tuple(value, num_stages)`: one value for every stage, or one per stage.
fn per_stage<T: Clone>(value: &PerBlock<T>, key: &str, n: usize) -> Result<Vec<T>> {
    match value {
        PerBlock::One(v) => Ok(vec![v.clone(); n]),
        PerBlock::List(v) if v.len() == n => Ok(v.clone()),
        PerBlock::List(v) => Err(Error::config(
            BLOCK,
            format!(
                "`{key}` has {} entries; the Unet takes one per stage ({n}, len(dim_mults))",
                v.len()
            ),
        )),
    }
}

/// `denoising_diffusion_pytorch.Unet`.
#[derive(Debug, Clone)]
pub struct LucidrainsUnet {
    config: LucidrainsUnetConfig,
    init_conv: Conv2d,
    time_mlp: TimeMlp,
    downs: Vec<Stage>,
    mid_block1: ResnetBlock,
    mid_attn: StageAttention,
    mid_block2: ResnetBlock,
    ups: Vec<Stage>,
    final_res_block: ResnetBlock,
    final_conv: Conv2d,
}

struct Parts {
    resnet: ResnetBlockConfig,
    flash: bool,
}

impl Parts {
    fn resnet(&self, vb: VarBuilder, dim: usize, dim_out: usize) -> Result<ResnetBlock> {
        ResnetBlock::new(
            vb,
            &ResnetBlockConfig {
                dim,
                dim_out,
                ..self.resnet.clone()
            },
        )
    }

    fn attention(
        &self,
        vb: VarBuilder,
        dim: usize,
        full: bool,
        heads: usize,
        dim_head: usize,
    ) -> Result<StageAttention> {
        Ok(if full {
            let cfg = AttentionConfig {
                dim,
                heads,
                dim_head,
                num_mem_kv: 4,
                flash: self.flash,
            };
            StageAttention::Full(Attention::new(vb, &cfg)?)
        } else {
            let cfg = LinearAttentionConfig {
                dim,
                heads,
                dim_head,
                num_mem_kv: 4,
            };
            StageAttention::Linear(LinearAttention::new(vb, &cfg)?)
        })
    }
}

impl LucidrainsUnet {
    pub const BLOCK: &'static str = BLOCK;

    /// Build the model from its weights (`vb` at the `Unet`'s keys) and its constructor kwargs.
    pub fn new(vb: VarBuilder, cfg: &LucidrainsUnetConfig) -> Result<Self> {
        crate::validate::constructor(BLOCK, &vb, cfg)?;
        let n = cfg.dim_mults.len();
        if n == 0 || cfg.dim == 0 {
            return Err(Error::config(BLOCK, "dim and dim_mults must be positive / non-empty"));
        }
        let full = cfg.full_attn_per_stage()?;
        let heads = per_stage(&cfg.attn_heads, "attn_heads", n)?;
        let dim_heads = per_stage(&cfg.attn_dim_head, "attn_dim_head", n)?;
        let time_dim = cfg.dim * 4;
        let (pos_emb, fourier_dim) = if cfg.learned_sinusoidal_cond || cfg.random_fourier_features {
            if !cfg.learned_sinusoidal_dim.is_multiple_of(2) {
                return Err(Error::config(BLOCK, "learned_sinusoidal_dim must be even"));
            }
            let weights = vb.pp("time_mlp.0").get(cfg.learned_sinusoidal_dim / 2, "weights")?;
            (PosEmb::Fourier { weights }, cfg.learned_sinusoidal_dim + 1)
        } else {
            (
                PosEmb::Sinusoidal {
                    dim: cfg.dim,
                    theta: cfg.sinusoidal_pos_emb_theta,
                },
                cfg.dim,
            )
        };
        let parts = Parts {
            resnet: ResnetBlockConfig {
                dim: 0,
                dim_out: 0,
                time_emb_dim: Some(time_dim),
                dropout: cfg.dropout,
            },
            flash: cfg.flash_attn,
        };
        let in_out = cfg.in_out();
        let mut downs = Vec::with_capacity(n);
        for (i, &(d_in, d_out)) in in_out.iter().enumerate() {
            let vb = vb.pp("downs").pp(i);
            downs.push(Stage {
                block1: parts.resnet(vb.pp(0), d_in, d_in)?,
                block2: parts.resnet(vb.pp(1), d_in, d_in)?,
                attn: parts.attention(vb.pp(2), d_in, full[i], heads[i], dim_heads[i])?,
                resample: Resample::load(vb, false, i + 1 == n, d_in, d_out)?,
            });
        }
        let mid = in_out[n - 1].1;
        let mut ups = Vec::with_capacity(n);
        for (i, &(d_in, d_out)) in in_out.iter().rev().enumerate() {
            let (vb, s) = (vb.pp("ups").pp(i), n - 1 - i);
            ups.push(Stage {
                block1: parts.resnet(vb.pp(0), d_out + d_in, d_out)?,
                block2: parts.resnet(vb.pp(1), d_out + d_in, d_out)?,
                attn: parts.attention(vb.pp(2), d_out, full[s], heads[s], dim_heads[s])?,
                resample: Resample::load(vb, true, i + 1 == n, d_out, d_in)?,
            });
        }
        let init = cfg.init_dim();
        let input = cfg.channels * if cfg.self_condition { 2 } else { 1 };
        let out = cfg
            .out_dim
            .unwrap_or(cfg.channels * if cfg.learned_variance { 2 } else { 1 });
        Ok(Self {
            config: cfg.clone(),
            init_conv: Conv2d::load(vb.pp("init_conv"), input, init, 7, true)?,
            time_mlp: TimeMlp::load(vb.pp("time_mlp"), BLOCK, pos_emb, (fourier_dim, time_dim))?,
            downs,
            mid_block1: parts.resnet(vb.pp("mid_block1"), mid, mid)?,
            mid_attn: parts.attention(vb.pp("mid_attn"), mid, true, heads[n - 1], dim_heads[n - 1])?,
            mid_block2: parts.resnet(vb.pp("mid_block2"), mid, mid)?,
            ups,
            final_res_block: parts.resnet(vb.pp("final_res_block"), 2 * init, init)?,
            final_conv: Conv2d::load(vb.pp("final_conv"), init, out, 1, true)?,
        })
    }

    pub fn config(&self) -> &LucidrainsUnetConfig {
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

/// `attn(x) + x`, the attention's own output recorded as the stage `path`.
impl Attend for StageAttention {
    fn attend(&self, path: &str, x: &Tensor) -> Result<Tensor> {
        let a = run(path, || {
            Ok(match self {
                StageAttention::Full(a) => a.forward(x)?,
                StageAttention::Linear(a) => a.forward(x)?,
            })
        })?;
        Ok(crate::ops::add(&a, x)?)
    }
}

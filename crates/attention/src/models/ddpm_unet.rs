//! What lucidrains' `Unet` ([`super::LucidrainsUnet`]) and the Annotated Diffusion post's
//! ([`super::AnnotatedUnet`]) share: the input checks and self-conditioning, `time_mlp`, the
//! resampling of each stage, and the body of `forward` (down stages, bottleneck, up stages with
//! their skips, `final_res_block`), over each model's own resnet and attention blocks.

use super::time_embedding::PosEmb;
use crate::layers::{Activation, Conv2d, Projection};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;

/// A stage's ResNet block: `block(x, t)`.
pub(super) trait Resnet {
    fn forward_t(&self, x: &Tensor, t: &Tensor) -> Result<Tensor>;
}

impl Resnet for crate::ddpm::ResnetBlock {
    fn forward_t(&self, x: &Tensor, t: &Tensor) -> Result<Tensor> {
        self.forward(x, Some(t))
    }
}

impl Resnet for crate::annotated_diffusion::ResnetBlock {
    fn forward_t(&self, x: &Tensor, t: &Tensor) -> Result<Tensor> {
        self.forward(x, Some(t))
    }
}

/// A stage's attention with its residual, `x + attn(x)` (however the model wraps it), recorded
/// under the module path `path`.
pub(super) trait Attend {
    fn attend(&self, path: &str, x: &Tensor) -> Result<Tensor>;
}

/// One entry of `downs` / `ups`: two resnets, the attention (with its residual), the resampling.
#[derive(Debug, Clone)]
pub(super) struct Stage<R, A> {
    pub(super) block1: R,
    pub(super) block2: R,
    pub(super) attn: A,
    pub(super) resample: Resample,
}

/// `Unet.forward` from `init_conv`'s output `h0` and `time_mlp`'s `t` (one row per sample) to
/// `final_res_block`'s output: the down stages (each pushing two skips), `mid` (block, attention,
/// block), the up stages (each concatenating two skips), then `final_res_block(cat(h, h0), t)`.
pub(super) fn body<R: Resnet, A: Attend, M: Attend>(
    block: &'static str,
    (h0, t): (&Tensor, &Tensor),
    downs: &[Stage<R, A>],
    (mid_block1, mid_attn, mid_block2): (&R, &M, &R),
    ups: &[Stage<R, A>],
    final_res_block: &R,
) -> Result<Tensor> {
    let mut skips = Vec::with_capacity(2 * downs.len());
    let mut h = h0.clone();
    for (i, stage) in downs.iter().enumerate() {
        let path = |j: usize| format!("downs.{i}.{j}");
        h = run(&path(0), || stage.block1.forward_t(&h, t))?;
        skips.push(h.clone());
        h = run(&path(1), || stage.block2.forward_t(&h, t))?;
        h = stage.attn.attend(&path(2), &h)?;
        skips.push(h.clone());
        h = run(&path(3), || stage.resample.forward(&h))?;
    }
    h = run("mid_block1", || mid_block1.forward_t(&h, t))?;
    h = mid_attn.attend("mid_attn", &h)?;
    h = run("mid_block2", || mid_block2.forward_t(&h, t))?;
    for (i, stage) in ups.iter().enumerate() {
        let path = |j: usize| format!("ups.{i}.{j}");
        let mut pop = || skips.pop().ok_or_else(|| Error::config(block, "a skip missing"));
        let cat = Tensor::cat(&[&h, &pop()?], 1)?;
        h = run(&path(0), || stage.block1.forward_t(&cat, t))?;
        let cat = Tensor::cat(&[&h, &pop()?], 1)?;
        h = run(&path(1), || stage.block2.forward_t(&cat, t))?;
        h = stage.attn.attend(&path(2), &h)?;
        h = run(&path(3), || stage.resample.forward(&h))?;
    }
    let cat = Tensor::cat(&[&h, h0], 1)?;
    run("final_res_block", || final_res_block.forward_t(&cat, t))
}

/// `time_mlp = Sequential(pos_emb, Linear(fourier_dim, time_dim), GELU(), Linear(time_dim, time_dim))`
/// (keys `time_mlp.1`, `time_mlp.3`).
#[derive(Debug, Clone)]
pub(super) struct TimeMlp {
    pos_emb: PosEmb,
    linear_1: Projection,
    linear_2: Projection,
}

impl TimeMlp {
    pub(super) fn load(
        vb: VarBuilder,
        block: &'static str,
        pos_emb: PosEmb,
        (fourier_dim, time_dim): (usize, usize),
    ) -> Result<Self> {
        Ok(Self {
            pos_emb,
            linear_1: Projection::load(vb.pp("1"), block, fourier_dim, time_dim, true)?,
            linear_2: Projection::load(vb.pp("3"), block, time_dim, time_dim, true)?,
        })
    }

    /// `time_mlp(time)` `(B, time_dim)` in `dtype` (the embedding as [`PosEmb::forward`] makes it, cast).
    pub(super) fn forward(&self, time: &Tensor, dtype: DType) -> Result<Tensor> {
        let emb = self.pos_emb.forward(time)?;
        trace::record("time_mlp.0", &emb);
        let h = self.linear_1.forward_tokens(&emb.to_dtype(dtype)?)?;
        trace::record("time_mlp.1", &h);
        let t = self.linear_2.forward_tokens(&Activation::Gelu.forward(&h)?)?;
        trace::record("time_mlp", &t);
        Ok(t)
    }
}

/// A stage's resampling (index 3 of its `ModuleList`), lucidrains' and the Annotated Diffusion
/// post's alike.
#[derive(Debug, Clone)]
pub(super) enum Resample {
    /// `Downsample`: pixel-unshuffle, then `Conv2d(4 · dim, dim_out, 1)` (keys `.1`).
    Down(Conv2d),
    /// `Upsample`: nearest ×2, then `Conv2d(dim, dim_out, 3)` (keys `.1`).
    Up(Conv2d),
    /// The last stage's `Conv2d(dim, dim_out, 3)`.
    Same(Conv2d),
}

impl Resample {
    /// Down stage `!up` or up stage `up` at `vb` (the stage's `ModuleList`); the last stage of
    /// either is the plain 3×3 conv.
    pub(super) fn load(vb: VarBuilder, up: bool, last: bool, dim: usize, dim_out: usize) -> Result<Self> {
        Ok(match (last, up) {
            (true, _) => Resample::Same(Conv2d::load(vb.pp(3), dim, dim_out, 3, true)?),
            (false, false) => Resample::Down(Conv2d::load(vb.pp(3).pp(1), 4 * dim, dim_out, 1, true)?),
            (false, true) => Resample::Up(Conv2d::load(vb.pp(3).pp(1), dim, dim_out, 3, true)?),
        })
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Resample::Down(conv) => {
                let (b, c, h, w) = x.dims4()?;
                let x = x
                    .reshape((b, c, h / 2, 2, w / 2, 2))?
                    .permute((0, 1, 3, 5, 2, 4))?
                    .reshape((b, c * 4, h / 2, w / 2))?;
                conv.forward(&x)?
            }
            Resample::Up(conv) => {
                let (_, _, h, w) = x.dims4()?;
                conv.forward(&x.upsample_nearest2d(2 * h, 2 * w)?)?
            }
            Resample::Same(conv) => conv.forward(x)?,
        })
    }
}

/// What a DDPM `Unet` (lucidrains', the Annotated Diffusion post's) checks of its inputs: `x`
/// `(B, channels, H, W)` with H and W divisible by `2^(stages − 1)`, `time` `(B,)` or `(1,)`, `x_self_cond`
/// like `x` and only where the model is self-conditioned. Returns the input after
/// self-conditioning, `cat(x_self_cond or zeros_like(x), x)`.
pub(super) fn self_conditioned_input(
    block: &'static str,
    (channels, stages, self_condition): (usize, usize, bool),
    x: &Tensor,
    time: &Tensor,
    x_self_cond: Option<&Tensor>,
) -> Result<Tensor> {
    crate::validate::input(block, "x", x, &[4])?;
    crate::validate::optional(block, "x_self_cond", x_self_cond, &[4])?;
    if let Some(s) = x_self_cond {
        crate::validate::same_dtype(block, "x_self_cond", s, "x", x)?;
    }
    let (b, c, h, w) = x.dims4()?;
    let factor = 1usize << stages.saturating_sub(1).min(30);
    if c != channels || h % factor != 0 || w % factor != 0 {
        let expected = format!("expected (B, {channels}, H, W) with H and W divisible by {factor}");
        return Err(Error::input(block, "x", format!("{expected}, found {:?}", x.dims())));
    }
    // (1,) broadcasts over the batch, as PyTorch's `time[:, None] * freqs` then the resnets' FiLM do
    if time.dims() != [b] && time.dims() != [1] {
        let found = time.dims();
        return Err(Error::input(
            block,
            "time",
            format!("expected ({b},) or (1,), found {found:?}"),
        ));
    }
    match (self_condition, x_self_cond) {
        (false, None) => Ok(x.clone()),
        (false, Some(_)) => Err(Error::input(
            block,
            "x_self_cond",
            "given, but the Unet has self_condition = false",
        )),
        (true, Some(s)) if s.dims() != x.dims() => Err(Error::input(
            block,
            "x_self_cond",
            format!("expected {:?}, found {:?}", x.dims(), s.dims()),
        )),
        (true, Some(s)) => Ok(Tensor::cat(&[s, x], 1)?),
        (true, None) => Ok(Tensor::cat(&[&x.zeros_like()?, x], 1)?),
    }
}

/// The time embedding `t` `(1, D)` or `(B, D)` as `(B, D)`: one timestep for the whole batch, as
/// PyTorch broadcasts it in the resnets' scale and shift.
pub(super) fn per_sample(t: Tensor, batch: usize) -> Result<Tensor> {
    Ok(match t.dim(0)? == batch {
        true => t,
        false => t.broadcast_as((batch, t.dim(1)?))?.contiguous()?,
    })
}

/// `f()` in the trace scope `path`, its output recorded as the stage `path`.
pub(super) fn run(path: &str, f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let out = trace::scope(path, f)?;
    trace::record(path, &out);
    Ok(out)
}

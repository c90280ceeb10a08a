//! diffusers' `UNetMidBlock1D` (`models/unets/unet_1d_blocks.py`, 0.42.1; unchanged since 0.7):
//! the bottleneck of `UNet1DModel` with `mid_block_type="UNetMidBlock1D"`, Dance Diffusion's
//! audio U-Net. Its parts are the same file's `Downsample1d("cubic")`, `ResConvBlock`,
//! `SelfAttention1d` and `Upsample1d("cubic")`:
//!
//! ```text
//! forward(h, temb=None):  h = down(h)                   # reflect-pad 3, depthwise cubic kernel, stride 2
//!   for i in 0..6:        h = resnets[i](h); h = attentions[i](h)
//!   return up(h)                                        # reflect-pad 2, depthwise transposed cubic·2, stride 2
//! ResConvBlock(in, mid, out):  skip = conv_skip(x) (1, no bias) if in != out else x
//!   h = gelu(group_norm_1(conv_1(x)))  (Conv1d 5, padding 2; GroupNorm(1, mid))
//!   h = gelu(group_norm_2(conv_2(h)))  (GroupNorm(1, out)); return h + skip
//! SelfAttention1d(c, c // 32 heads):  t = group_norm(x).transpose(1, 2)   (GroupNorm(1, c))
//!   q, k, v = query(t), key(t), value(t) split into heads;  s = d ** -0.25 on q and on k
//!   h = proj_attn(softmax((q·s)(k·s)ᵀ) v merged);  return h.transpose(1, 2) + x
//! ```
//!
//! `temb` is accepted and ignored, as in diffusers. Every GroupNorm has PyTorch's default eps
//! 1e-5 and GELU is the exact (erf) form. The resampling kernels are the state dict's buffers
//! `down.kernel` and `up.kernel` (8 taps), used as stored.

use crate::heads::{merge_tokens, split_tokens};
use crate::layers::{group_norm, Activation, GroupNorm, Projection};
use crate::ops::{mul, upcast};
use crate::sdpa::{eager_attention, Scale};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// The taps of the resampling kernels (`_kernels["cubic"]`, doubled for `Upsample1d`).
const TAPS: usize = 8;

/// PyTorch's default GroupNorm eps.
const EPS: f64 = 1e-5;

/// Keyword arguments of `UNetMidBlock1D(mid_channels, in_channels, out_channels=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNetMidBlock1DConfig {
    pub mid_channels: usize,
    pub in_channels: usize,
    #[serde(default)]
    pub out_channels: Option<usize>,
}

/// `F.pad(x, (left, right), mode="reflect")` on the last dimension of `(B, C, L)`.
fn reflect_pad(x: &Tensor, left: usize, right: usize) -> candle_core::Result<Tensor> {
    let l = x.dim(D::Minus1)?;
    if left >= l || right >= l {
        candle_core::bail!("reflect padding {left}/{right} needs a length above it, found {l}")
    }
    let mut index: Vec<u32> = (1..=left).rev().map(|i| i as u32).collect();
    index.extend((0..l).map(|i| i as u32));
    index.extend((0..right).map(|i| (l - 2 - i) as u32));
    let index = Tensor::new(index, x.device())?;
    // Candle's index_select takes contiguous tensors only: a strided view is copied first.
    x.contiguous()?.index_select(&index, D::Minus1)
}

/// Every second element of the last dimension from `start`, `n` of them (`x` long enough for
/// `start + 2n`).
fn every_second(x: &Tensor, start: usize, n: usize) -> candle_core::Result<Tensor> {
    let (b, c, _) = x.dims3()?;
    x.narrow(D::Minus1, start, 2 * n)?
        .reshape((b, c, n, 2))?
        .narrow(D::Minus1, 0, 1)?
        .squeeze(D::Minus1)
}

/// `Downsample1d`: `conv1d(reflect_pad(x, 3), diag(kernel), stride=2)`, each channel alone, in at
/// least f32 and rounded once (`(B, C, L)` → `(B, C, ⌊L/2⌋)`).
fn downsample(x: &Tensor, kernel: &[f64]) -> candle_core::Result<Tensor> {
    let xp = reflect_pad(&upcast(x)?, 3, 3)?;
    let n = (xp.dim(D::Minus1)? - TAPS) / 2 + 1;
    // One zero past the end, so that every tap's `2n` elements exist (the last is never used).
    let (b, c, _) = xp.dims3()?;
    let xp = Tensor::cat(&[&xp, &Tensor::zeros((b, c, 1), xp.dtype(), xp.device())?], D::Minus1)?;
    let mut acc = (every_second(&xp, 0, n)? * kernel[0])?;
    for (t, &w) in kernel.iter().enumerate().skip(1) {
        acc = (acc + (every_second(&xp, t, n)? * w)?)?;
    }
    acc.to_dtype(x.dtype())
}

/// `Upsample1d`: `conv_transpose1d(reflect_pad(x, 2), diag(kernel), stride=2, padding=7)`, each
/// channel alone (`(B, C, L)` → `(B, C, 2L)`). Output `2m` takes taps 7, 5, 3, 1 of the padded
/// input at `m .. m + 3`, output `2m + 1` taps 6, 4, 2, 0 at `m + 1 .. m + 4`.
fn upsample(x: &Tensor, kernel: &[f64]) -> candle_core::Result<Tensor> {
    let (b, c, l) = x.dims3()?;
    let xp = reflect_pad(&upcast(x)?, 2, 2)?;
    let phase = |taps: [usize; 4], first: usize| -> candle_core::Result<Tensor> {
        let mut acc = (xp.narrow(D::Minus1, first, l)? * kernel[taps[0]])?;
        for (i, &t) in taps.iter().enumerate().skip(1) {
            acc = (acc + (xp.narrow(D::Minus1, first + i, l)? * kernel[t])?)?;
        }
        Ok(acc)
    };
    let even = phase([7, 5, 3, 1], 0)?;
    let odd = phase([6, 4, 2, 0], 1)?;
    Tensor::stack(&[even, odd], D::Minus1)?
        .reshape((b, c, 2 * l))?
        .to_dtype(x.dtype())
}

/// A resampling buffer (`down.kernel`, `up.kernel`): `(8,)`, read as f64 taps.
fn load_kernel(vb: &VarBuilder, name: &str) -> Result<Vec<f64>> {
    Ok(vb.get(TAPS, name)?.to_dtype(candle_core::DType::F64)?.to_vec1()?)
}

/// `nn.Conv1d(in, out, kernel, stride, padding=kernel // 2, bias)`, computed in at least f32 and
/// rounded once, as PyTorch's CPU convolution does in half precision.
#[derive(Debug, Clone)]
pub(crate) struct Conv1d {
    weight: Tensor,
    bias: Option<Tensor>,
    padding: usize,
    stride: usize,
}

impl Conv1d {
    pub(crate) fn load(vb: VarBuilder, c_in: usize, c_out: usize, kernel: usize, bias: bool) -> Result<Self> {
        Ok(Self {
            weight: vb.get((c_out, c_in, kernel), "weight")?,
            bias: if bias { Some(vb.get(c_out, "bias")?) } else { None },
            padding: kernel / 2,
            stride: 1,
        })
    }

    /// The same with `stride`.
    pub(crate) fn strided(self, stride: usize) -> Self {
        Self { stride, ..self }
    }
}

impl Module for Conv1d {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = upcast(x)?.conv1d(&upcast(&self.weight)?, self.padding, self.stride, 1, 1)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(&upcast(b)?.reshape((1, (), 1))?)?,
            None => y,
        };
        y.to_dtype(x.dtype())
    }
}

/// diffusers' `ResConvBlock(in_channels, mid_channels, out_channels, is_last=False)`.
#[derive(Debug, Clone)]
struct ResConvBlock {
    conv_skip: Option<Conv1d>,
    conv_1: Conv1d,
    group_norm_1: GroupNorm,
    conv_2: Conv1d,
    group_norm_2: GroupNorm,
}

impl ResConvBlock {
    fn load(vb: VarBuilder, c_in: usize, c_mid: usize, c_out: usize) -> Result<Self> {
        let block = UNetMidBlock1D::BLOCK;
        Ok(Self {
            conv_skip: match c_in != c_out {
                true => Some(Conv1d::load(vb.pp("conv_skip"), c_in, c_out, 1, false)?),
                false => None,
            },
            conv_1: Conv1d::load(vb.pp("conv_1"), c_in, c_mid, 5, true)?,
            group_norm_1: group_norm(vb.pp("group_norm_1"), block, 1, c_mid, EPS)?,
            conv_2: Conv1d::load(vb.pp("conv_2"), c_mid, c_out, 5, true)?,
            group_norm_2: group_norm(vb.pp("group_norm_2"), block, 1, c_out, EPS)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let residual = match &self.conv_skip {
            Some(conv) => conv.forward(x)?,
            None => x.clone(),
        };
        let h = self.conv_1.forward(x)?;
        trace::record("conv1", &h);
        let h = self.group_norm_1.forward(&h)?;
        trace::record("norm1", &h);
        let h = self.conv_2.forward(&Activation::Gelu.forward(&h)?)?;
        trace::record("conv2", &h);
        let h = self.group_norm_2.forward(&h)?;
        trace::record("norm2", &h);
        if self.conv_skip.is_some() {
            trace::record("shortcut", &residual);
        }
        let out = crate::ops::add(&Activation::Gelu.forward(&h)?, &residual)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// diffusers' `SelfAttention1d(in_channels, n_head)`.
#[derive(Debug, Clone)]
struct SelfAttention1d {
    group_norm: GroupNorm,
    query: Projection,
    key: Projection,
    value: Projection,
    proj_attn: Projection,
    heads: usize,
}

impl SelfAttention1d {
    fn load(vb: VarBuilder, channels: usize, heads: usize) -> Result<Self> {
        let block = UNetMidBlock1D::BLOCK;
        let proj = |name: &str| Projection::load(vb.pp(name), block, channels, channels, true);
        Ok(Self {
            group_norm: group_norm(vb.pp("group_norm"), block, 1, channels, EPS)?,
            query: proj("query")?,
            key: proj("key")?,
            value: proj("value")?,
            proj_attn: proj("proj_attn")?,
            heads,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let normed = self.group_norm.forward(x)?;
        trace::record("norm", &normed);
        // `.transpose(1, 2)`: a strided view, which PyTorch's Linear rounds twice in half precision.
        let tokens = normed.transpose(1, 2)?;
        let split = |p: &Projection| split_tokens(&p.forward_tokens_strided(&tokens)?, self.heads);
        let (q, k, v) = (split(&self.query)?, split(&self.key)?, split(&self.value)?);
        trace::record_qkv(&q, &k, &v);
        // `scale = 1 / sqrt(sqrt(d))` on q and on k, each rounded as PyTorch's multiply.
        let scale = 1.0 / (q.dim(D::Minus1)? as f64).sqrt().sqrt();
        let (qs, ks) = (mul(&q, scale)?, mul(&k, scale)?);
        let attn = merge_tokens(&eager_attention(&qs, &ks, &v, None, Scale::Mul(1.0))?)?;
        trace::record("attn", &attn);
        let h = self.proj_attn.forward_tokens(&attn)?;
        trace::record("proj", &h);
        let out = crate::ops::add(&h.transpose(1, 2)?, x)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `diffusers.models.unets.unet_1d_blocks.UNetMidBlock1D`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock1D {
    in_channels: usize,
    /// `down.kernel` and `up.kernel`: the buffers (`_kernels["cubic"]` and twice it).
    down_kernel: Vec<f64>,
    up_kernel: Vec<f64>,
    resnets: Vec<ResConvBlock>,
    attentions: Vec<SelfAttention1d>,
}

impl UNetMidBlock1D {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock1D";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock1DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c_in, mid) = (cfg.in_channels, cfg.mid_channels);
        let c_out = cfg.out_channels.unwrap_or(c_in);
        // `SelfAttention1d(c, c // 32)` views (B, L, c) as c // 32 heads.
        for c in [mid, c_out] {
            if c < 32 || !c.is_multiple_of(c / 32) {
                return Err(Error::config(
                    block,
                    format!("SelfAttention1d({c}, {c} // 32) needs at least 32 channels, divisible by {c} // 32 heads"),
                ));
            }
        }
        let (vb_res, vb_attn) = (vb.pp("resnets"), vb.pp("attentions"));
        let mut resnets = vec![ResConvBlock::load(vb_res.pp(0), c_in, mid, mid)?];
        for i in 1..5 {
            resnets.push(ResConvBlock::load(vb_res.pp(i), mid, mid, mid)?);
        }
        resnets.push(ResConvBlock::load(vb_res.pp(5), mid, mid, c_out)?);
        let mut attentions = vec![];
        for i in 0..6 {
            let c = if i == 5 { c_out } else { mid };
            attentions.push(SelfAttention1d::load(vb_attn.pp(i), c, c / 32)?);
        }
        Ok(Self {
            in_channels: c_in,
            down_kernel: load_kernel(&vb, "down.kernel")?,
            up_kernel: load_kernel(&vb, "up.kernel")?,
            resnets,
            attentions,
        })
    }

    /// `forward(hidden_states, temb=None)`: `(B, in_channels, L)` → `(B, out_channels, 2·⌊L/2⌋)`,
    /// `L` at least 6 (the reflect padding around the halved length); `temb` is ignored.
    pub fn forward(&self, hidden_states: &Tensor, _temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        let block = Self::BLOCK;
        let dims = hidden_states.dims();
        if dims.len() != 3 || dims[1] != self.in_channels || dims[2] < 6 {
            return Err(Error::input(
                block,
                "hidden_states",
                format!(
                    "expected (B, {}, L) with L >= 6 (the reflect padding), found {dims:?}",
                    self.in_channels
                ),
            ));
        }
        let mut h = trace::scope("down", || -> candle_core::Result<Tensor> {
            let y = downsample(hidden_states, &self.down_kernel)?;
            trace::record("output", &y);
            Ok(y)
        })?;
        for (i, (resnet, attn)) in self.resnets.iter().zip(&self.attentions).enumerate() {
            h = trace::scope_at("resnets", i, || resnet.forward(&h))?;
            h = trace::scope_at("attentions", i, || attn.forward(&h))?;
        }
        let out = trace::scope("up", || -> candle_core::Result<Tensor> {
            let y = upsample(&h, &self.up_kernel)?;
            trace::record("output", &y);
            Ok(y)
        })?;
        trace::record("output", &out);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn bad_channels_and_lengths_are_named_errors() {
        let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
        let cfg = |mid| UNetMidBlock1DConfig {
            mid_channels: mid,
            in_channels: 32,
            out_channels: None,
        };
        let e = UNetMidBlock1D::new(vb.clone(), &cfg(16)).unwrap_err().to_string();
        assert!(e.contains("SelfAttention1d(16"), "{e}");
        let block = UNetMidBlock1D::new(vb, &cfg(32)).unwrap();
        for dims in [vec![2, 32, 4], vec![2, 16, 8], vec![2, 32]] {
            let x = Tensor::zeros(dims.as_slice(), DType::F32, &Device::Cpu).unwrap();
            let e = block.forward(&x, None).unwrap_err().to_string();
            assert!(e.contains("hidden_states") && e.contains(&format!("{dims:?}")), "{e}");
        }
        let x = Tensor::zeros((2, 32, 7), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(block.forward(&x, None).unwrap().dims(), [2, 32, 6]);
    }
}

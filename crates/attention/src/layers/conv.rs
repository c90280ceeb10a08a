//! `nn.Conv2d` on the packed convolution kernels ([`Conv2d`]), with the ops PyTorch applies
//! after it fused into its write-out.

use crate::cpu_kernels::{ConvExtras, PackedConv};
use crate::ops::upcast;
use crate::Result;
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder};

/// `nn.Conv2d(in, out, kernel, stride=1, padding=kernel // 2)` (the 3×3 and 1×1 convs of the
/// ResNet blocks). Keys `weight (out, in, k, k)`, `bias (out,)` when `bias`. f16/bf16: computed
/// in f32 and rounded once, as PyTorch's CPU convolution accumulates. An f32 weight on a CPU
/// with AVX2+FMA or AVX-512 is packed once, here, for the CPU GEMM
/// ([`crate::cpu_kernels::PackedConv`]: no im2col matrix, the unpacked copy dropped).
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// The weight, where it is not packed.
    weight: Option<Tensor>,
    packed: Option<PackedConv>,
    bias: Option<Tensor>,
    padding: usize,
}

impl Conv2d {
    pub fn load(vb: VarBuilder, in_channels: usize, out_channels: usize, kernel: usize, bias: bool) -> Result<Self> {
        let weight = vb.get((out_channels, in_channels, kernel, kernel), "weight")?;
        let packed = PackedConv::new(&weight)?;
        Ok(Self {
            weight: if packed.is_some() { None } else { Some(weight) },
            packed,
            bias: if bias {
                Some(vb.get(out_channels, "bias")?)
            } else {
                None
            },
            padding: kernel / 2,
        })
    }

    /// `conv(x)`, then `+ channel_add[:, :, None, None]`, `residual +` and `/ div`, each as
    /// PyTorch's separate op rounds it (fused into the GEMM's write-out for f32 on the CPU).
    pub fn forward_with(&self, x: &Tensor, extras: ConvExtras) -> candle_core::Result<Tensor> {
        let div = extras.div.filter(|&d| d != 1.0);
        if let Some(p) = self.packed.as_ref().filter(|_| x.dtype() == DType::F32) {
            if let Some(y) = p.forward(x, self.bias.as_ref(), ConvExtras { div, ..extras })? {
                return Ok(y);
            }
        }
        apply_extras(self.conv(x)?, extras)
    }

    /// [`Self::forward_with`], the convolution's own output recorded as the trace stage
    /// `stage` (then nothing is fused: the stage is the output before the extras).
    pub fn forward_traced(&self, x: &Tensor, stage: &str, extras: ConvExtras) -> candle_core::Result<Tensor> {
        if !crate::trace::enabled() {
            return self.forward_with(x, extras);
        }
        let h = self.conv(x)?;
        crate::trace::record(stage, &h);
        apply_extras(h, extras)
    }

    /// The convolution alone, in at least f32, rounded once to the dtype of `x`.
    fn conv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x32 = upcast(x)?;
        if let Some(p) = &self.packed {
            if let Some(y) = p.forward(&x32, self.bias.as_ref(), ConvExtras::default())? {
                return y.to_dtype(x.dtype());
            }
        }
        let weight = match (&self.weight, &self.packed) {
            (Some(w), _) => w.clone(),
            (None, Some(p)) => p.weight()?,
            (None, None) => unreachable!("a Conv2d holds its weight one way or the other"),
        };
        let config = candle_nn::Conv2dConfig {
            padding: self.padding,
            ..Default::default()
        };
        let conv = candle_nn::Conv2d::new(upcast(&weight)?, self.bias.as_ref().map(upcast).transpose()?, config);
        conv.forward(&x32)?.to_dtype(x.dtype())
    }
}

/// `h + channel_add[:, :, None, None]`, `residual + h`, `/ div`, as separate ops.
fn apply_extras(h: Tensor, extras: ConvExtras) -> candle_core::Result<Tensor> {
    let h = match extras.channel_add {
        Some(t) => h.broadcast_add(&t.unsqueeze(2)?.unsqueeze(3)?)?,
        None => h,
    };
    let h = match extras.residual {
        Some(r) => (r + h)?,
        None => h,
    };
    match extras.div.filter(|&d| d != 1.0) {
        Some(d) => crate::ops::div(&h, d),
        None => Ok(h),
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_with(x, ConvExtras::default())
    }
}

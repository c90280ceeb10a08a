//! `nn.Conv2d` on the packed convolution kernels ([`Conv2d`]), with the ops PyTorch applies
//! after it fused into its write-out.
//!
//! On CUDA with the CUDA layers on (`UNET_ATTENTION_CUDA_LAYERS=on`; `cuda_conv_layer`), as
//! PyTorch runs it: the convolution in the input's dtype (no f32 copies of input and weight), on this crate's cuDNN convolution with the feature `cudnn`
//! (`unet_attention::cuda::conv`: f16/bf16 accumulated in f32, f32 strict unless the TF32 mode
//! is on), else on Candle's (im2col and a cuBLAS GEMM, which accumulates f16/bf16 in f32); the
//! bias and the extras then added as separate ops in the input's dtype, as PyTorch adds the bias
//! to cuDNN's output. The weight (and bias) in the input's dtype, where that is not the dtype
//! they were loaded in, is made at the first call and kept (`Copies`). With them off (the
//! default until they have run on a GPU) half inputs are computed in f32 and rounded once, as on
//! the CPU; under `cudnn` on this crate's cuDNN convolution in strict f32.

use crate::cpu_kernels::{ConvExtras, PackedConv};
use crate::ops::{upcast, CastTo};
use crate::Result;
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder};
use std::sync::{Arc, Mutex};

/// `nn.Conv2d(in, out, kernel, stride=1, padding=kernel // 2)` (the 3×3 and 1×1 convs of the
/// ResNet blocks). Keys `weight (out, in, k, k)`, `bias (out,)` when `bias`. f16/bf16: computed
/// in f32 and rounded once, as PyTorch's CPU convolution accumulates. An f32 weight on a CPU
/// with AVX2+FMA or AVX-512 is packed once, here, for the CPU GEMM
/// ([`crate::cpu_kernels::PackedConv`]: no im2col matrix, the unpacked copy dropped). On CUDA:
/// see the module docs.
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// The weight, where it is not packed.
    weight: Option<Tensor>,
    packed: Option<PackedConv>,
    bias: Option<Tensor>,
    padding: usize,
    /// Weight and bias in another dtype or on another device than loaded (CUDA only).
    copies: Copies,
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
            copies: Copies::default(),
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

    /// The convolution alone with its bias: on CUDA [`cuda_conv`]; elsewhere in at least f32,
    /// rounded once to the dtype of `x`.
    fn conv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let weight = || match (&self.weight, &self.packed) {
            (Some(w), _) => Ok(w.clone()),
            (None, Some(p)) => p.weight(),
            (None, None) => candle_core::bail!("a Conv2d holds its weight one way or the other"),
        };
        if let Some(y) = cuda_conv_layer(x, weight, self.bias.as_ref(), [self.padding; 2], &self.copies)? {
            return Ok(y);
        }
        if let Some(p) = &self.packed {
            // (f16 / bf16 images are widened by the GEMM, or run on the AMX bf16 tiles.)
            if let Some(y) = p.forward(x, self.bias.as_ref(), ConvExtras::default())? {
                return y.cast_to(x.dtype());
            }
        }
        let x32 = upcast(x)?;
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
        conv.forward(&x32)?.cast_to(x.dtype())
    }
}

/// A weight and its bias in one dtype.
type DtypeCopy = (DType, Tensor, Option<Tensor>);

/// A weight and its bias in the dtype and on the device of the inputs, made once per dtype.
#[derive(Debug, Clone, Default)]
pub(crate) struct Copies(Arc<Mutex<Vec<DtypeCopy>>>);

impl Copies {
    /// `weight()` and `bias` in `x`'s dtype on `x`'s device: themselves where they already are,
    /// else the copy made at the first call (made again if the device changed).
    pub(crate) fn get(
        &self,
        x: &Tensor,
        weight: impl FnOnce() -> candle_core::Result<Tensor>,
        bias: Option<&Tensor>,
    ) -> candle_core::Result<(Tensor, Option<Tensor>)> {
        let (dtype, device) = (x.dtype(), x.device());
        let w = weight()?;
        let here = |t: &Tensor| t.dtype() == dtype && t.device().same_device(device);
        if here(&w) && bias.is_none_or(here) {
            return Ok((w, bias.cloned()));
        }
        let mut copies = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, w, b)) = copies.iter().find(|c| c.0 == dtype && here(&c.1)) {
            return Ok((w.clone(), b.clone()));
        }
        let to = |t: &Tensor| t.to_device(device)?.to_dtype(dtype);
        let made = (to(&w)?, bias.map(to).transpose()?);
        copies.retain(|c| c.0 != dtype);
        copies.push((dtype, made.0.clone(), made.1.clone()));
        Ok(made)
    }
}

/// A convolution layer's `conv2d(x, weight) + bias[:, None, None]` on CUDA, stride 1, zero
/// padding `(ph, pw)`, in `x`'s dtype: with the CUDA layers on ([`crate::ops::cuda_layers`]) and
/// no trace recorded, computed in that dtype ([`cuda_conv`], the weight's copy in it kept in
/// `copies`); otherwise in f32 and rounded once, as on the CPU, on this crate's cuDNN
/// convolution under `cudnn` (strict f32 unless the TF32 mode is on: Candle's own cuDNN
/// convolution would run f32 in TF32). `None` off CUDA, and off the CUDA layers without `cudnn`
/// (the caller's f32 path, Candle's im2col, then runs).
pub(crate) fn cuda_conv_layer(
    x: &Tensor,
    weight: impl FnOnce() -> candle_core::Result<Tensor>,
    bias: Option<&Tensor>,
    padding: [usize; 2],
    copies: &Copies,
) -> candle_core::Result<Option<Tensor>> {
    if !x.device().is_cuda() {
        return Ok(None);
    }
    if crate::ops::cuda_layers()? && !crate::trace::enabled() {
        let (w, b) = copies.get(x, weight, bias)?;
        return cuda_conv(x, &w, b.as_ref(), padding);
    }
    if !cfg!(feature = "cudnn") {
        return Ok(None);
    }
    let (w, b) = (upcast(&weight()?)?, bias.map(upcast).transpose()?);
    let y = cuda_conv(&upcast(x)?, &w, b.as_ref(), padding)?;
    y.map(|y| y.cast_to(x.dtype())).transpose()
}

/// `conv2d(x, weight) + bias[:, None, None]` on CUDA, stride 1, zero padding `(ph, pw)`, weight
/// and bias already in `x`'s dtype on its device: the convolution in that dtype (see the module
/// docs), the bias added after as its own op. `None` where this does not apply (the caller's f32
/// path runs): not on CUDA, or with `cudnn` a shape the cuDNN convolution declines (Candle's own
/// conv would then run f16 with an f16 accumulator).
pub(crate) fn cuda_conv(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    padding: [usize; 2],
) -> candle_core::Result<Option<Tensor>> {
    if !x.device().is_cuda() {
        return Ok(None);
    }
    #[cfg(feature = "cudnn")]
    let y = match crate::cuda::conv::cudnn_conv2d(x, weight, padding)? {
        Some(y) => y,
        None => return Ok(None),
    };
    #[cfg(not(feature = "cudnn"))]
    let y = {
        let [ph, pw] = padding;
        if ph == pw {
            x.conv2d(weight, ph, 1, 1, 1)?
        } else {
            x.pad_with_zeros(2, ph, ph)?
                .pad_with_zeros(3, pw, pw)?
                .conv2d(weight, 0, 1, 1, 1)?
        }
    };
    Ok(Some(match bias {
        Some(b) => y.broadcast_add(&b.reshape((1, (), 1, 1))?)?,
        None => y,
    }))
}

/// `h + channel_add[:, :, None, None]`, `residual + h`, `/ div`, as separate ops.
fn apply_extras(h: Tensor, extras: ConvExtras) -> candle_core::Result<Tensor> {
    let h = match extras.channel_add {
        Some(t) => h.broadcast_add(&t.unsqueeze(2)?.unsqueeze(3)?)?,
        None => h,
    };
    let h = match extras.residual {
        Some(r) => crate::ops::add(r, &h)?,
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

#[cfg(test)]
mod tests {
    use super::Copies;
    use candle_core::{DType, Device, Tensor};

    /// The weight in the input's dtype is made once and kept; a weight already in it is used as
    /// it is; a new dtype gets its own copy (the CUDA layers' per-call f32 copies are gone).
    #[test]
    fn copies_are_made_once_per_dtype() {
        let dev = Device::Cpu;
        let w = Tensor::arange(0f32, 12., &dev).unwrap().reshape((3, 4)).unwrap();
        let b = Tensor::new(&[1f32, 2., 3.], &dev).unwrap();
        let copies = Copies::default();
        let x16 = Tensor::zeros(4, DType::F16, &dev).unwrap();
        let (w1, b1) = copies.get(&x16, || Ok(w.clone()), Some(&b)).unwrap();
        let (w2, b2) = copies.get(&x16, || Ok(w.clone()), Some(&b)).unwrap();
        assert_eq!((w1.dtype(), b1.as_ref().unwrap().dtype()), (DType::F16, DType::F16));
        assert_eq!(w1.id(), w2.id(), "the second call reuses the copy");
        assert_eq!(b1.unwrap().id(), b2.unwrap().id());
        assert_eq!(
            w1.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap(),
            w.to_vec2::<f32>().unwrap()
        );

        let x32 = Tensor::zeros(4, DType::F32, &dev).unwrap();
        let (w3, _) = copies.get(&x32, || Ok(w.clone()), Some(&b)).unwrap();
        assert_eq!(w3.id(), w.id(), "no copy where the dtype already matches");

        let xb = Tensor::zeros(4, DType::BF16, &dev).unwrap();
        let (w4, _) = copies.get(&xb, || Ok(w.clone()), None).unwrap();
        assert_eq!(w4.dtype(), DType::BF16);
        let (w5, _) = copies.get(&x16, || Ok(w.clone()), Some(&b)).unwrap();
        assert_eq!(w5.id(), w1.id(), "the f16 copy is still there beside the bf16 one");
    }
}

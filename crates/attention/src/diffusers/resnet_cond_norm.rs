//! diffusers' `ResnetBlockCondNorm2D` (`models/resnet.py`, 0.42.1; the same forward since 0.25,
//! when it was split out of `ResnetBlock2D`) with `time_embedding_norm="spatial"`: the ResNet block
//! of the MoVQ decoder (Kandinsky 2.x's `VQModel(norm_type="spatial")`), whose norms are
//! conditioned on the quantized latent `zq` instead of a time embedding.
//!
//! ```text
//! norm1 = SpatialNorm(in, zq); conv1 = Conv2d(in, out, 3, padding=1)
//! norm2 = SpatialNorm(out, zq); conv2 = Conv2d(out, conv_2d_out or out, 3, padding=1)
//! conv_shortcut = Conv2d(in, conv_2d_out, 1, bias=conv_shortcut_bias) when in != conv_2d_out
//! forward(x, zq): h = conv1(act(norm1(x, zq))); h = conv2(dropout(act(norm2(h, zq))))
//!                 return (shortcut(x) + h) / output_scale_factor
//! SpatialNorm(f, zq) = GroupNorm(32, f, eps=1e-6)(f) · conv_y(nearest(zq)) + conv_b(nearest(zq))
//! ```
//!
//! `groups` and `eps` are stored by diffusers but unused with `"spatial"` (SpatialNorm's GroupNorm
//! is always 32 groups, eps 1e-6). `time_embedding_norm="ada_group"` (an `AdaGroupNorm` per norm)
//! is a "not supported" error: no diffusers mid block can build it (`UNetMidBlock2D` hands
//! `"ada_group"` to `ResnetBlock2D`, which raises), and `up`/`down` are not used by mid blocks.

use crate::cpu_kernels::MemoryFormat;
use crate::layers::{Activation, Conv2d, SpatialNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

/// The arguments of `ResnetBlockCondNorm2D(*, in_channels, out_channels=None, conv_shortcut=False,
/// dropout=0.0, temb_channels=512, groups=32, groups_out=None, eps=1e-6, non_linearity="swish",
/// time_embedding_norm="spatial", output_scale_factor=1.0, use_in_shortcut=None,
/// conv_shortcut_bias=True, conv_2d_out_channels=None)` that a mid block sets; `temb_channels` is
/// the channel count of `zq`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResnetBlockCondNorm2DConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub temb_channels: usize,
    pub non_linearity: Activation,
    pub output_scale_factor: f64,
}

/// `diffusers.models.resnet.ResnetBlockCondNorm2D` with `time_embedding_norm="spatial"`.
#[derive(Debug, Clone)]
pub struct ResnetBlockCondNorm2D {
    in_channels: usize,
    temb_channels: usize,
    norm1: SpatialNorm,
    conv1: Conv2d,
    norm2: SpatialNorm,
    conv2: Conv2d,
    conv_shortcut: Option<Conv2d>,
    act: Activation,
    output_scale_factor: f64,
}

impl ResnetBlockCondNorm2D {
    pub const BLOCK: &'static str = "diffusers.ResnetBlockCondNorm2D";

    pub fn new(vb: VarBuilder, cfg: &ResnetBlockCondNorm2DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c_in, c_out, zq) = (cfg.in_channels, cfg.out_channels, cfg.temb_channels);
        if c_in == 0 || c_out == 0 || zq == 0 {
            return Err(Error::config(
                block,
                format!("in_channels, out_channels and temb_channels must be > 0, found {c_in}, {c_out}, {zq}"),
            ));
        }
        for (name, c) in [("in_channels", c_in), ("out_channels", c_out)] {
            if c % 32 != 0 {
                return Err(Error::config(
                    block,
                    format!("{name} {c} is not a multiple of 32 (SpatialNorm's GroupNorm has 32 groups)"),
                ));
            }
        }
        let f = cfg.output_scale_factor;
        if !(f.is_finite() && f != 0.0) {
            return Err(Error::config(
                block,
                format!("output_scale_factor must be finite and non-zero, found {f}"),
            ));
        }
        let conv_shortcut = match c_in != c_out {
            true => Some(Conv2d::load(vb.pp("conv_shortcut"), c_in, c_out, 1, true)?),
            false => None,
        };
        Ok(Self {
            in_channels: c_in,
            temb_channels: zq,
            norm1: SpatialNorm::load(vb.pp("norm1"), block, c_in, zq)?,
            conv1: Conv2d::load(vb.pp("conv1"), c_in, c_out, 3, true)?,
            norm2: SpatialNorm::load(vb.pp("norm2"), block, c_out, zq)?,
            conv2: Conv2d::load(vb.pp("conv2"), c_out, c_out, 3, true)?,
            conv_shortcut,
            act: cfg.non_linearity,
            output_scale_factor: f,
        })
    }

    /// `forward(input_tensor, temb)`: `input_tensor` `(B, in_channels, H, W)`, `temb` the quantized
    /// latent `zq` `(B, temb_channels, h, w)` (nearest-resized to `(H, W)`).
    pub fn forward(&self, input_tensor: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        self.forward_as(input_tensor, temb, MemoryFormat::Contiguous)
    }

    /// [`Self::forward`] of an input PyTorch lays out as `format` (its norms' kernel; the
    /// convolutions keep the layout, so both norms see it).
    pub fn forward_as(&self, input_tensor: &Tensor, temb: Option<&Tensor>, format: MemoryFormat) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "input_tensor", input_tensor, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let zq = self.check_inputs(input_tensor, temb)?;
        let norm = |n: &SpatialNorm, x: &Tensor, stage: &str| -> candle_core::Result<Tensor> {
            let normed = n.forward_as(x, zq, format)?;
            trace::record(stage, &normed);
            self.act.forward(&normed)
        };
        let h = norm(&self.norm1, input_tensor, "norm1")?;
        let h = self.conv1.forward_traced(&h, "conv1", Default::default())?;
        let h = norm(&self.norm2, &h, "norm2")?;
        let shortcut = match &self.conv_shortcut {
            Some(conv) => {
                let s = conv.forward(input_tensor)?;
                trace::record("shortcut", &s);
                s
            }
            None => input_tensor.clone(),
        };
        let extras = crate::cpu_kernels::ConvExtras {
            residual: Some(&shortcut),
            div: Some(self.output_scale_factor),
            ..Default::default()
        };
        let out = self.conv2.forward_traced(&h, "conv2", extras)?;
        trace::record("output", &out);
        Ok(out)
    }

    fn check_inputs<'a>(&self, x: &Tensor, temb: Option<&'a Tensor>) -> Result<&'a Tensor> {
        let block = Self::BLOCK;
        if x.rank() != 4 || x.dim(1)? != self.in_channels {
            return Err(Error::input(
                block,
                "input_tensor",
                format!("expected (B, {}, H, W), found {:?}", self.in_channels, x.dims()),
            ));
        }
        let zq = temb.ok_or_else(|| {
            Error::input(
                block,
                "temb",
                "required: the spatial norms condition on the quantized latent zq",
            )
        })?;
        let batch_ok = matches!(zq.dims().first(), Some(&b) if b == x.dim(0)? || b == 1);
        let shape_ok = zq.rank() == 4 && zq.dim(1)? == self.temb_channels && zq.dim(2)? > 0 && zq.dim(3)? > 0;
        if !shape_ok || !batch_ok {
            return Err(Error::input(
                block,
                "temb",
                format!(
                    "expected zq (B={} or 1, {}, h > 0, w > 0), found {:?}",
                    x.dim(0)?,
                    self.temb_channels,
                    zq.dims()
                ),
            ));
        }
        Ok(zq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn zq_is_required_and_checked() {
        let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
        let cfg = ResnetBlockCondNorm2DConfig {
            in_channels: 32,
            out_channels: 32,
            temb_channels: 4,
            non_linearity: Activation::Swish,
            output_scale_factor: 1.0,
        };
        let block = ResnetBlockCondNorm2D::new(vb.clone(), &cfg).unwrap();
        let x = Tensor::zeros((2, 32, 4, 4), DType::F32, &Device::Cpu).unwrap();
        let e = block.forward(&x, None).unwrap_err().to_string();
        assert!(e.contains("`temb`") && e.contains("zq"), "{e}");
        for dims in [vec![2, 3, 4, 4], vec![3, 4, 4, 4], vec![2, 4, 0, 4], vec![2, 4]] {
            let zq = Tensor::zeros(dims.as_slice(), DType::F32, &Device::Cpu).unwrap();
            let e = block.forward(&x, Some(&zq)).unwrap_err().to_string();
            assert!(e.contains(&format!("found {dims:?}")), "{e}");
        }
        let zq = Tensor::zeros((1, 4, 2, 3), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(block.forward(&x, Some(&zq)).unwrap().dims(), [2, 32, 4, 4]);
        let e = ResnetBlockCondNorm2D::new(vb, &ResnetBlockCondNorm2DConfig { in_channels: 24, ..cfg })
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of 32"), "{e}");
    }
}

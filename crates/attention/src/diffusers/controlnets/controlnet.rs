//! diffusers' `ControlNetModel` bottleneck (`models/controlnets/controlnet.py`, 0.42.1): its
//! `mid_block` and the `controlnet_mid_block` zero convolution whose output is the residual the
//! ControlNet adds to the U-Net's mid block. diffusers has no class for this stretch; the block id
//! `diffusers.ControlNetMidBlock` names it after the two attributes it spans.
//!
//! ```text
//! __init__: mid_block = UNetMidBlock2DCrossAttn(transformer_layers_per_block[-1], in_channels=block_out_channels[-1],
//!                         temb_channels=block_out_channels[0] * 4, resnet_eps=norm_eps, resnet_act_fn=act_fn,
//!                         output_scale_factor=mid_block_scale_factor, resnet_time_scale_shift, cross_attention_dim,
//!                         num_attention_heads=num_attention_heads[-1], resnet_groups=norm_num_groups,
//!                         use_linear_projection, upcast_attention)
//!           (mid_block_type "UNetMidBlock2D": UNetMidBlock2D(..., num_layers=0, add_attention=False))
//!           controlnet_mid_block = zero_module(nn.Conv2d(block_out_channels[-1], block_out_channels[-1], 1))
//! forward:  sample = mid_block(sample, emb, encoder_hidden_states=..., attention_mask=...)
//!           mid_block_res_sample = controlnet_mid_block(sample) * conditioning_scale
//!           if global_pool_conditions: mid_block_res_sample = mean(mid_block_res_sample, dim=(2, 3), keepdim=True)
//! ```
//!
//! `guess_mode` scales the mid residual by `logspace(-1, 0, n)[-1] * conditioning_scale`, and the
//! last entry of that `logspace` is exactly 1.0, so it does not change this block's output. The
//! mid block is the crate's [`UNetMidBlock2DCrossAttn`] / [`UNetMidBlock2D`]; this module only adds
//! the convolution, the scale and the pooling.

use crate::config::defaults;
use crate::cpu_kernels::ConvExtras;
use crate::diffusers::unets::mid_block::{UNetMidBlock2D, UNetMidBlock2DConfig, UNetMidBlock2DCrossAttn};
use crate::diffusers::UNetMidBlock2DCrossAttnConfig;
use crate::layers::Conv2d;
use crate::trace;
use crate::{config, Error, Result};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// The `ControlNetModel` arguments that shape its bottleneck: `mid_block_type` and
/// `global_pool_conditions` as the constructor takes them, and `mid_block`, the keyword
/// arguments `ControlNetModel.__init__` passes to the mid block's class (what
/// [`crate::diffusers::model_config`] derives from a ControlNet `config.json`). The zero
/// convolution is `mid_block`'s `in_channels` square.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlNetMidBlockConfig {
    /// `"UNetMidBlock2DCrossAttn"` (the default, every released ControlNet) or `"UNetMidBlock2D"`.
    #[serde(default = "defaults::cross_attn_mid_block")]
    pub mid_block_type: String,
    /// The mid block's constructor kwargs ([`UNetMidBlock2DCrossAttnConfig`] or
    /// [`UNetMidBlock2DConfig`]).
    pub mid_block: serde_json::Value,
    /// Mean-pool the residual over height and width.
    #[serde(default)]
    pub global_pool_conditions: bool,
}

#[derive(Debug, Clone)]
enum Mid {
    CrossAttn(UNetMidBlock2DCrossAttn),
    Plain(UNetMidBlock2D),
}

/// `ControlNetModel.mid_block` + `controlnet_mid_block` (keys `mid_block.*`,
/// `controlnet_mid_block.weight` / `.bias`, at the ControlNet's top level).
#[derive(Debug, Clone)]
pub struct ControlNetMidBlock {
    mid: Mid,
    controlnet_mid_block: ZeroConv,
    global_pool_conditions: bool,
}

/// diffusers' `zero_module(nn.Conv2d(in_channels, out_channels, 1))` (`ControlNetModel`'s
/// `controlnet_mid_block`, ControlNet-XS's `make_zero_conv`): a 1×1 convolution with a bias,
/// zero-initialised in training and loaded as the checkpoint holds it.
#[derive(Debug, Clone)]
pub(crate) struct ZeroConv(Conv2d);

impl ZeroConv {
    pub(crate) fn load(vb: VarBuilder, in_channels: usize, out_channels: usize) -> Result<Self> {
        Ok(Self(Conv2d::load(vb, in_channels, out_channels, 1, true)?))
    }

    /// `conv(x)`, its output traced as `<name>/output`.
    pub(crate) fn forward(&self, name: &str, x: &Tensor) -> Result<Tensor> {
        trace::scope(name, || -> Result<Tensor> {
            let r = self.0.forward_with(x, ConvExtras::default())?;
            trace::record("output", &r);
            Ok(r)
        })
    }
}

impl ControlNetMidBlock {
    pub const BLOCK: &'static str = "diffusers.ControlNetMidBlock";

    pub fn new(vb: VarBuilder, cfg: &ControlNetMidBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let vb_mid = vb.pp("mid_block");
        let (mid, channels) = match cfg.mid_block_type.as_str() {
            "UNetMidBlock2DCrossAttn" => {
                let c: UNetMidBlock2DCrossAttnConfig =
                    config::from_json(UNetMidBlock2DCrossAttn::BLOCK, &cfg.mid_block)?;
                if c.dual_cross_attention {
                    return Err(Error::config(
                        Self::BLOCK,
                        "dual_cross_attention: ControlNetModel builds its mid block without it (it passes none)",
                    ));
                }
                let channels = c.out_channels.unwrap_or(c.in_channels);
                (Mid::CrossAttn(UNetMidBlock2DCrossAttn::new(vb_mid, &c)?), channels)
            }
            "UNetMidBlock2D" => {
                let c: UNetMidBlock2DConfig = config::from_json(UNetMidBlock2D::BLOCK, &cfg.mid_block)?;
                let channels = c.in_channels;
                (Mid::Plain(UNetMidBlock2D::new(vb_mid, &c)?), channels)
            }
            other => {
                return Err(Error::config(
                    Self::BLOCK,
                    format!(
                        "unknown mid_block_type {other:?}: ControlNetModel builds \"UNetMidBlock2DCrossAttn\" or \
                         \"UNetMidBlock2D\""
                    ),
                ))
            }
        };
        let controlnet_mid_block = ZeroConv::load(vb.pp("controlnet_mid_block"), channels, channels)?;
        Ok(Self {
            mid,
            controlnet_mid_block,
            global_pool_conditions: cfg.global_pool_conditions,
        })
    }

    /// The lines of `ControlNetModel.forward` from the mid block on: `hidden_states`
    /// `(B, C, H, W)` (the down blocks' output), `temb` `(B, temb_channels)`,
    /// `encoder_hidden_states` `(B, S, cross_attention_dim)` and `attention_mask` as
    /// [`UNetMidBlock2DCrossAttn::forward`] takes them (the `UNetMidBlock2D` variant uses neither;
    /// ControlNetModel passes no `encoder_attention_mask`). Returns `(mid_block_res_sample,
    /// sample)`: the scaled (and, with `global_pool_conditions`, pooled `(B, C, 1, 1)`) residual and
    /// the mid block's own output.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        conditioning_scale: f64,
    ) -> Result<(Tensor, Tensor)> {
        let (res, sample) = self.residual(
            hidden_states,
            temb,
            encoder_hidden_states,
            attention_mask,
            conditioning_scale,
        )?;
        trace::record("output", &res);
        Ok((res, sample))
    }

    /// [`Self::forward`] without recording its residual as the stage `output` (inside a whole
    /// `ControlNetModel`, whose output it is not).
    pub(crate) fn residual(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        conditioning_scale: f64,
    ) -> Result<(Tensor, Tensor)> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        let sample = trace::scope("mid_block", || match &self.mid {
            Mid::CrossAttn(m) => m.forward(hidden_states, temb, encoder_hidden_states, attention_mask, None),
            Mid::Plain(m) => m.forward(hidden_states, temb),
        })?;
        let res = self.controlnet_mid_block.forward("controlnet_mid_block", &sample)?;
        let mut res = scale(&res, conditioning_scale)?;
        if self.global_pool_conditions {
            res = mean_hw(&res)?;
        }
        Ok((res, sample))
    }
}

/// Whether PyTorch computes an elementwise op on `dtype` in float32 and rounds once (its CPU
/// "opmath" for half types).
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `x * conditioning_scale` as PyTorch does it with a Python float: in float32 for f16 / bf16
/// (the scalar not rounded to the half type first), rounded once.
pub(crate) fn scale(x: &Tensor, s: f64) -> candle_core::Result<Tensor> {
    if is_half(x.dtype()) {
        x.to_dtype(DType::F32)?.affine(s, 0.0)?.to_dtype(x.dtype())
    } else {
        x.affine(s, 0.0)
    }
}

/// `torch.mean(x, dim=(2, 3), keepdim=True)`: the sum over `H·W` (in float32 for half types, as
/// PyTorch accumulates), divided by `H·W`.
pub(crate) fn mean_hw(x: &Tensor) -> candle_core::Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let acc = if is_half(x.dtype()) {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
    let sum = acc.reshape((b, c, h * w))?.sum_keepdim(2)?;
    (sum / (h * w) as f64)?.reshape((b, c, 1, 1))?.to_dtype(x.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use candle_core::Device;
    use serde_json::json;
    use std::collections::HashMap;

    fn err(value: serde_json::Value) -> String {
        let cfg: ControlNetMidBlockConfig = from_json(ControlNetMidBlock::BLOCK, &value).unwrap();
        let vb = VarBuilder::from_tensors(HashMap::new(), DType::F32, &Device::Cpu);
        ControlNetMidBlock::new(vb, &cfg).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let cfg: ControlNetMidBlockConfig = from_json(
            ControlNetMidBlock::BLOCK,
            &json!({"mid_block": {"in_channels": 8, "temb_channels": 8}}),
        )
        .unwrap();
        assert_eq!(cfg.mid_block_type, "UNetMidBlock2DCrossAttn");
        assert!(!cfg.global_pool_conditions);
        let e = from_json::<ControlNetMidBlockConfig>(
            ControlNetMidBlock::BLOCK,
            &json!({"mid_block": {}, "guess_mode": true}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("guess_mode"), "{e}");
    }

    #[test]
    fn bad_configs_and_missing_weights_are_named() {
        let e = err(json!({"mid_block_type": "UNetMidBlock2DSimpleCrossAttn", "mid_block": {}}));
        assert!(
            e.contains("UNetMidBlock2DSimpleCrossAttn") && e.contains("mid_block_type"),
            "{e}"
        );
        let e = err(json!({"mid_block": {"in_channels": 8, "temb_channels": 8, "dual_cross_attention": true}}));
        assert!(e.contains("dual_cross_attention"), "{e}");
        let e = err(json!({"mid_block": {"in_channels": 8, "temb_channels": 8, "bogus": 1}}));
        assert!(e.contains("bogus"), "{e}");
        let e = err(json!({"mid_block_type": "UNetMidBlock2D",
                           "mid_block": {"in_channels": 8, "temb_channels": 8, "num_layers": 0}}));
        assert!(e.contains("mid_block.resnets.0"), "{e}");
    }

    #[test]
    fn scale_and_pool_round_once_in_half_precision() {
        let dev = Device::Cpu;
        let x = Tensor::arange(0f32, 24.0, &dev).unwrap().reshape((1, 2, 3, 4)).unwrap();
        let m = mean_hw(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(m, vec![5.5, 17.5]);
        let h = x.to_dtype(DType::F16).unwrap();
        let s = scale(&h, 0.7).unwrap();
        assert_eq!(s.dtype(), DType::F16);
        let want = (x.affine(0.7, 0.0).unwrap()).to_dtype(DType::F16).unwrap();
        let d = (s.to_dtype(DType::F32).unwrap() - want.to_dtype(DType::F32).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(d, 0.0);
    }
}

//! diffusers' `ControlNetXSCrossAttnMidBlock2D` (`models/controlnets/controlnet_xs.py`, 0.42.1):
//! the mid block of `UNetControlNetXSModel`, a base U-Net's mid block and a small control
//! stream's, run side by side and joined by two zero convolutions.
//!
//! ```text
//! __init__: base_to_ctrl  = make_zero_conv(base_channels, base_channels)
//!           base_midblock = UNetMidBlock2DCrossAttn(transformer_layers_per_block, in_channels=base_channels,
//!                             temb_channels, resnet_groups=norm_num_groups, cross_attention_dim,
//!                             num_attention_heads=base_num_attention_heads, use_linear_projection, upcast_attention)
//!           ctrl_midblock = UNetMidBlock2DCrossAttn(transformer_layers_per_block,
//!                             in_channels=ctrl_channels + base_channels, out_channels=ctrl_channels, temb_channels,
//!                             resnet_groups=find_largest_factor(gcd(ctrl_channels, ctrl_channels + base_channels),
//!                                                               ctrl_max_norm_num_groups),
//!                             cross_attention_dim, num_attention_heads=ctrl_num_attention_heads,
//!                             use_linear_projection, upcast_attention)
//!           ctrl_to_base  = make_zero_conv(ctrl_channels, base_channels)
//! forward:  if apply_control: h_ctrl = cat([h_ctrl, base_to_ctrl(h_base)], dim=1)
//!           h_base = base_midblock(h_base, **joint_args)
//!           if apply_control:
//!               h_ctrl = ctrl_midblock(h_ctrl, **joint_args)
//!               h_base = h_base + ctrl_to_base(h_ctrl) * conditioning_scale
//!           return h_base, h_ctrl
//! ```
//!
//! The two mid blocks are the crate's [`UNetMidBlock2DCrossAttn`] (the control one with its
//! `out_channels`); the zero convolutions and the half-precision `conditioning_scale` are
//! [`crate::diffusers::controlnets::controlnet`]'s.

use crate::config::defaults;
use crate::diffusers::controlnets::controlnet::{scale, ZeroConv};
use crate::diffusers::unets::mid_block::{UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `ControlNetXSCrossAttnMidBlock2D(base_channels, ctrl_channels,
/// temb_channels=None, norm_num_groups=32, ctrl_max_norm_num_groups=32,
/// transformer_layers_per_block=1, base_num_attention_heads=1, ctrl_num_attention_heads=1,
/// cross_attention_dim=1024, upcast_attention=False, use_linear_projection=True)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlNetXSCrossAttnMidBlock2DConfig {
    pub base_channels: usize,
    pub ctrl_channels: usize,
    #[serde(default)]
    pub temb_channels: Option<usize>,
    #[serde(default = "defaults::usize::<32>")]
    pub norm_num_groups: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub ctrl_max_norm_num_groups: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub transformer_layers_per_block: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub base_num_attention_heads: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub ctrl_num_attention_heads: usize,
    #[serde(default = "defaults::usize::<1024>")]
    pub cross_attention_dim: usize,
    #[serde(default)]
    pub upcast_attention: bool,
    /// `None` (JSON `null`) is falsy in diffusers: conv projections.
    #[serde(default = "defaults::some_yes")]
    pub use_linear_projection: Option<bool>,
}

/// diffusers' `find_largest_factor(number, max_factor)`: the largest factor of `number` not above
/// `max_factor` (`number` itself when `max_factor >= number`); `None` for `max_factor` 0, where
/// diffusers returns `None` and `GroupNorm(None, ...)` fails.
pub fn find_largest_factor(number: usize, max_factor: usize) -> Option<usize> {
    if max_factor >= number {
        return Some(number);
    }
    (1..=max_factor).rev().find(|f| number.is_multiple_of(*f))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl ControlNetXSCrossAttnMidBlock2DConfig {
    /// `resnet_groups` of `ctrl_midblock`: `find_largest_factor(gcd(ctrl, ctrl + base),
    /// ctrl_max_norm_num_groups)`.
    pub fn ctrl_groups(&self) -> Result<usize> {
        let (c, b) = (self.ctrl_channels, self.base_channels);
        find_largest_factor(gcd(c, c + b), self.ctrl_max_norm_num_groups).ok_or_else(|| {
            Error::config(
                ControlNetXSCrossAttnMidBlock2D::BLOCK,
                "ctrl_max_norm_num_groups 0: diffusers' find_largest_factor returns None, and GroupNorm(None) fails",
            )
        })
    }

    /// The kwargs of `base_midblock` (`ctrl: false`) or `ctrl_midblock` (`ctrl: true`), as
    /// `__init__` passes them.
    pub fn mid_block(&self, ctrl: bool) -> Result<UNetMidBlock2DCrossAttnConfig> {
        let block = ControlNetXSCrossAttnMidBlock2D::BLOCK;
        if self.base_channels == 0 || self.ctrl_channels == 0 {
            return Err(Error::config(block, "base_channels and ctrl_channels must be positive"));
        }
        let mut c = UNetMidBlock2DCrossAttnConfig::new(self.base_channels, self.temb_channels);
        c.transformer_layers_per_block =
            crate::diffusers::unets::mid_block::LayersPerBlock::One(self.transformer_layers_per_block);
        c.cross_attention_dim = self.cross_attention_dim;
        c.use_linear_projection = self.use_linear_projection.unwrap_or(false);
        c.upcast_attention = self.upcast_attention;
        if ctrl {
            c.in_channels = self.ctrl_channels + self.base_channels;
            c.out_channels = Some(self.ctrl_channels);
            c.resnet_groups = Some(self.ctrl_groups()?);
            c.num_attention_heads = self.ctrl_num_attention_heads;
        } else {
            c.resnet_groups = Some(self.norm_num_groups);
            c.num_attention_heads = self.base_num_attention_heads;
        }
        Ok(c)
    }
}

/// The arguments `forward` passes to both mid blocks (diffusers' `joint_args`).
#[derive(Debug, Clone, Copy, Default)]
pub struct JointArgs<'a> {
    pub temb: Option<&'a Tensor>,
    pub encoder_hidden_states: Option<&'a Tensor>,
    pub attention_mask: Option<&'a Tensor>,
    pub encoder_attention_mask: Option<&'a Tensor>,
}

/// `diffusers.models.controlnets.controlnet_xs.ControlNetXSCrossAttnMidBlock2D` (keys
/// `base_to_ctrl.*`, `base_midblock.*`, `ctrl_midblock.*`, `ctrl_to_base.*`; in a whole
/// `UNetControlNetXSModel` under `mid_block.`).
#[derive(Debug, Clone)]
pub struct ControlNetXSCrossAttnMidBlock2D {
    base_to_ctrl: ZeroConv,
    base_midblock: UNetMidBlock2DCrossAttn,
    ctrl_midblock: UNetMidBlock2DCrossAttn,
    ctrl_to_base: ZeroConv,
    base_channels: usize,
    ctrl_channels: usize,
}

impl ControlNetXSCrossAttnMidBlock2D {
    pub const BLOCK: &'static str = "diffusers.ControlNetXSCrossAttnMidBlock2D";

    pub fn new(vb: VarBuilder, cfg: &ControlNetXSCrossAttnMidBlock2DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let (base, ctrl) = (cfg.base_channels, cfg.ctrl_channels);
        let (base_cfg, ctrl_cfg) = (cfg.mid_block(false)?, cfg.mid_block(true)?);
        let base_midblock = UNetMidBlock2DCrossAttn::new(vb.pp("base_midblock"), &base_cfg)?;
        let ctrl_midblock = UNetMidBlock2DCrossAttn::new(vb.pp("ctrl_midblock"), &ctrl_cfg)?;
        Ok(Self {
            base_to_ctrl: ZeroConv::load(vb.pp("base_to_ctrl"), base, base)?,
            base_midblock,
            ctrl_midblock,
            ctrl_to_base: ZeroConv::load(vb.pp("ctrl_to_base"), ctrl, base)?,
            base_channels: base,
            ctrl_channels: ctrl,
        })
    }

    /// `forward(hidden_states_base, temb, encoder_hidden_states, hidden_states_ctrl,
    /// conditioning_scale, attention_mask, encoder_attention_mask, apply_control)`:
    /// `hidden_states_base` `(B, base_channels, H, W)`, `hidden_states_ctrl` `(B, ctrl_channels,
    /// H, W)`, `joint` as [`UNetMidBlock2DCrossAttn::forward`] takes them. Returns `(h_base,
    /// h_ctrl)`; with `apply_control` false only the base mid block runs and `h_ctrl` is the input,
    /// as diffusers returns it.
    pub fn forward(
        &self,
        hidden_states_base: &Tensor,
        hidden_states_ctrl: &Tensor,
        joint: &JointArgs,
        conditioning_scale: f64,
        apply_control: bool,
    ) -> Result<(Tensor, Tensor)> {
        crate::validate::input(Self::BLOCK, "hidden_states_base", hidden_states_base, &[])?;
        crate::validate::input(Self::BLOCK, "hidden_states_ctrl", hidden_states_ctrl, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", joint.temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", joint.encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", joint.attention_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", joint.encoder_attention_mask)?;
        let base_mid = |h: &Tensor, m: &UNetMidBlock2DCrossAttn| {
            m.forward(
                h,
                joint.temb,
                joint.encoder_hidden_states,
                joint.attention_mask,
                joint.encoder_attention_mask,
            )
        };
        if !apply_control {
            let h_base = trace::scope("base_midblock", || base_mid(hidden_states_base, &self.base_midblock))?;
            trace::record("output", &h_base);
            return Ok((h_base, hidden_states_ctrl.clone()));
        }
        self.check_streams(hidden_states_base, hidden_states_ctrl)?;
        let to_ctrl = self.base_to_ctrl.forward("base_to_ctrl", hidden_states_base)?;
        let h_ctrl = Tensor::cat(&[hidden_states_ctrl, &to_ctrl], 1)?;
        let h_base = trace::scope("base_midblock", || base_mid(hidden_states_base, &self.base_midblock))?;
        let h_ctrl = trace::scope("ctrl_midblock", || base_mid(&h_ctrl, &self.ctrl_midblock))?;
        let to_base = self.ctrl_to_base.forward("ctrl_to_base", &h_ctrl)?;
        let h_base = (h_base + scale(&to_base, conditioning_scale)?)?;
        trace::record("output", &h_base);
        Ok((h_base, h_ctrl))
    }

    /// Both streams `(B, C, H, W)` with this block's channels and the same `B, H, W` (what
    /// `torch.cat` on dim 1 needs).
    fn check_streams(&self, base: &Tensor, ctrl: &Tensor) -> Result<()> {
        let (b, c, h, w) = base.dims4().map_err(|_| {
            Error::input(
                Self::BLOCK,
                "hidden_states_base",
                format!("expected (B, C, H, W), found {:?}", base.dims()),
            )
        })?;
        if c != self.base_channels {
            return Err(Error::input(
                Self::BLOCK,
                "hidden_states_base",
                format!(
                    "expected {} channels (base_channels), found shape {:?}",
                    self.base_channels,
                    base.dims()
                ),
            ));
        }
        let want = [b, self.ctrl_channels, h, w];
        if ctrl.dims() != want {
            return Err(Error::input(
                Self::BLOCK,
                "hidden_states_ctrl",
                format!(
                    "expected shape {want:?} (ctrl_channels, base's B, H, W), found {:?}",
                    ctrl.dims()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use candle_core::{DType, Device};
    use serde_json::json;
    use std::collections::HashMap;

    fn cfg(value: serde_json::Value) -> Result<ControlNetXSCrossAttnMidBlock2DConfig> {
        from_json(ControlNetXSCrossAttnMidBlock2D::BLOCK, &value)
    }

    #[test]
    fn find_largest_factor_is_diffusers() {
        // find_largest_factor(gcd(16, 16 + 1280), 32) = 16 (SD's ControlNet-XS mid: ctrl 16, base 1280)
        assert_eq!(find_largest_factor(gcd(16, 16 + 1280), 32), Some(16));
        assert_eq!(find_largest_factor(24, 32), Some(24));
        assert_eq!(find_largest_factor(48, 32), Some(24));
        assert_eq!(find_largest_factor(7, 4), Some(1));
        assert_eq!(find_largest_factor(8, 0), None);
    }

    #[test]
    fn defaults_and_mid_block_kwargs() {
        let c = cfg(json!({"base_channels": 16, "ctrl_channels": 8, "temb_channels": 32,
                           "ctrl_max_norm_num_groups": 4, "norm_num_groups": 4}))
        .unwrap();
        assert_eq!(
            (c.cross_attention_dim, c.use_linear_projection, c.upcast_attention),
            (1024, Some(true), false)
        );
        let ctrl = c.mid_block(true).unwrap();
        assert_eq!(
            (ctrl.in_channels, ctrl.out_channels, ctrl.resnet_groups),
            (24, Some(8), Some(4))
        );
        assert!(ctrl.use_linear_projection);
        let base = c.mid_block(false).unwrap();
        assert_eq!(
            (base.in_channels, base.out_channels, base.resnet_groups),
            (16, None, Some(4))
        );
        let e = cfg(json!({"base_channels": 16, "ctrl_channels": 8, "ctrl_groups": 2}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ctrl_groups"), "{e}");
        let e = cfg(json!({"base_channels": 16})).unwrap_err().to_string();
        assert!(e.contains("ctrl_channels"), "{e}");
    }

    #[test]
    fn bad_configs_and_missing_weights_are_named() {
        let vb = || VarBuilder::from_tensors(HashMap::new(), DType::F32, &Device::Cpu);
        let c =
            cfg(json!({"base_channels": 16, "ctrl_channels": 8, "ctrl_max_norm_num_groups": 0, "norm_num_groups": 4}))
                .unwrap();
        let e = ControlNetXSCrossAttnMidBlock2D::new(vb(), &c).unwrap_err().to_string();
        assert!(e.contains("ctrl_max_norm_num_groups"), "{e}");
        let c = cfg(
            json!({"base_channels": 16, "ctrl_channels": 8, "ctrl_num_attention_heads": 3,
                           "norm_num_groups": 4}),
        )
        .unwrap();
        let e = ControlNetXSCrossAttnMidBlock2D::new(vb(), &c).unwrap_err().to_string();
        assert!(e.contains('3') && e.contains('8'), "{e}");
        let c = cfg(json!({"base_channels": 16, "ctrl_channels": 8, "norm_num_groups": 4,
                           "ctrl_max_norm_num_groups": 4, "temb_channels": 8}))
        .unwrap();
        let e = ControlNetXSCrossAttnMidBlock2D::new(vb(), &c).unwrap_err().to_string();
        assert!(e.contains("base_midblock.resnets.0"), "{e}");
    }
}

//! The mid blocks of diffusers' `UNet1DModel` for the Diffuser planning models
//! (`models/unets/unet_1d_blocks.py`, 0.42.1; the same since 0.8): [`MidResTemporalBlock1D`]
//! (the trajectory U-Net) and [`ValueFunctionMidBlock1D`] (the value function). Neither has
//! attention: they are stacks of `ResidualTemporalBlock1D` (`models/resnet.py`) with strided or
//! nearest-upsampling 1-D convolutions.
//!
//! ```text
//! ResidualTemporalBlock1D(in, out, embed_dim, kernel_size=5):
//!   conv_in = Conv1dBlock(in, out, 5); conv_out = Conv1dBlock(out, out, 5)   # Conv1d, GroupNorm(8), Mish
//!   time_emb = Linear(embed_dim, out); residual_conv = Conv1d(in, out, 1) if in != out else Identity
//!   forward(x, t) = conv_out(conv_in(x) + time_emb(mish(t))[:, :, None]) + residual_conv(x)
//! MidResTemporalBlock1D(in, out, embed_dim, num_layers=1, add_downsample=False, add_upsample=False,
//!                       non_linearity=None):
//!   resnets = [RTB(in, out), RTB(out, out) × num_layers]; then upsample (nearest ×2, Conv1d 3)
//!   or downsample (Conv1d 3, stride 2) when added. `non_linearity` is built and never applied.
//! ValueFunctionMidBlock1D(in, out, embed_dim):
//!   res1 = RTB(in, in // 2); down1 = Downsample1D(out // 2, use_conv=True)
//!   res2 = RTB(in // 2, in // 4); down2 = Downsample1D(out // 4, use_conv=True)
//! ```

use crate::config::defaults;
use crate::diffusers::unets::mid_block_1d::Conv1d;
use crate::layers::{group_norm, Activation, GroupNorm, Projection};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `Conv1dBlock`'s GroupNorm groups and PyTorch's default eps.
const GROUPS: usize = 8;
const EPS: f64 = 1e-5;

/// diffusers' `ResidualTemporalBlock1D(inp_channels, out_channels, embed_dim, kernel_size=5)`.
#[derive(Debug, Clone)]
struct ResidualTemporalBlock1D {
    conv_in: (Conv1d, GroupNorm),
    conv_out: (Conv1d, GroupNorm),
    time_emb: Projection,
    residual_conv: Option<Conv1d>,
    embed_dim: usize,
}

impl ResidualTemporalBlock1D {
    fn load(vb: VarBuilder, block: &'static str, c_in: usize, c_out: usize, embed_dim: usize) -> Result<Self> {
        let conv_block = |vb: VarBuilder, c_in: usize| -> Result<(Conv1d, GroupNorm)> {
            Ok((
                Conv1d::load(vb.pp("conv1d"), c_in, c_out, 5, true)?,
                group_norm(vb.pp("group_norm"), block, GROUPS, c_out, EPS)?,
            ))
        };
        Ok(Self {
            conv_in: conv_block(vb.pp("conv_in"), c_in)?,
            conv_out: conv_block(vb.pp("conv_out"), c_out)?,
            time_emb: Projection::load(vb.pp("time_emb"), block, embed_dim, c_out, true)?,
            residual_conv: match c_in != c_out {
                true => Some(Conv1d::load(vb.pp("residual_conv"), c_in, c_out, 1, true)?),
                false => None,
            },
            embed_dim,
        })
    }

    /// `Conv1dBlock`: conv, GroupNorm (on the `(B, C, 1, L)` view, traced so), Mish.
    fn conv_block(block: &(Conv1d, GroupNorm), x: &Tensor, stage: &str) -> candle_core::Result<Tensor> {
        let h = block.0.forward(x)?;
        trace::record(&format!("conv{stage}"), &h);
        let h = block.1.forward(&h)?;
        trace::record_with(&format!("norm{stage}"), || h.unsqueeze(2));
        Activation::Mish.forward(&h)
    }

    fn forward(&self, x: &Tensor, t: &Tensor) -> candle_core::Result<Tensor> {
        let t = self.time_emb.forward_tokens(&Activation::Mish.forward(t)?)?;
        trace::record("temb", &t);
        let h = Self::conv_block(&self.conv_in, x, "1")?;
        let h = Self::conv_block(&self.conv_out, &h.broadcast_add(&t.unsqueeze(D::Minus1)?)?, "2")?;
        let residual = match &self.residual_conv {
            Some(conv) => {
                let r = conv.forward(x)?;
                trace::record("shortcut", &r);
                r
            }
            None => x.clone(),
        };
        let out = crate::ops::add(&h, &residual)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `Downsample1D(c, use_conv=True)` (Conv1d 3, stride 2, padding 1) or `Upsample1D(c,
/// use_conv=True)` (nearest ×2, then Conv1d 3, padding 1).
#[derive(Debug, Clone)]
enum Resample {
    Down(Conv1d),
    Up(Conv1d),
}

impl Resample {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = match self {
            Resample::Down(conv) => conv.forward(x)?,
            Resample::Up(conv) => {
                let (b, c, l) = x.dims3()?;
                let doubled = Tensor::stack(&[x, x], D::Minus1)?.reshape((b, c, 2 * l))?;
                conv.forward(&doubled)?
            }
        };
        trace::record("output", &y);
        Ok(y)
    }
}

/// The inputs every 1-D temporal mid block checks: `name` `(B, channels, L)` and `temb`
/// `(B, embed_dim)`.
fn check_inputs(
    block: &'static str,
    name: &str,
    x: &Tensor,
    temb: Option<&Tensor>,
    channels: usize,
    embed_dim: usize,
) -> Result<Tensor> {
    if x.rank() != 3 || x.dim(1)? != channels || x.dim(2)? == 0 {
        return Err(Error::input(
            block,
            name,
            format!("expected (B, {channels}, L > 0), found {:?}", x.dims()),
        ));
    }
    let t = temb.ok_or_else(|| Error::input(block, "temb", "required: (B, embed_dim)"))?;
    if t.dims() != [x.dim(0)?, embed_dim] {
        return Err(Error::input(
            block,
            "temb",
            format!("expected ({}, {embed_dim}), found {:?}", x.dim(0)?, t.dims()),
        ));
    }
    Ok(t.clone())
}

fn check_groups(block: &'static str, channels: &[usize]) -> Result<()> {
    match channels.iter().find(|&&c| c == 0 || c % GROUPS != 0) {
        Some(c) => Err(Error::config(
            block,
            format!("{c} channels: Conv1dBlock's GroupNorm needs a positive multiple of {GROUPS}"),
        )),
        None => Ok(()),
    }
}

/// Keyword arguments of `MidResTemporalBlock1D(in_channels, out_channels, embed_dim,
/// num_layers=1, add_downsample=False, add_upsample=False, non_linearity=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MidResTemporalBlock1DConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub embed_dim: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub num_layers: usize,
    #[serde(default)]
    pub add_downsample: bool,
    #[serde(default)]
    pub add_upsample: bool,
    /// Built by diffusers and never applied in its forward; accepted for that reason.
    #[serde(default)]
    pub non_linearity: Option<Activation>,
}

/// `diffusers.models.unets.unet_1d_blocks.MidResTemporalBlock1D`.
#[derive(Debug, Clone)]
pub struct MidResTemporalBlock1D {
    resnets: Vec<ResidualTemporalBlock1D>,
    resample: Option<Resample>,
    in_channels: usize,
}

impl MidResTemporalBlock1D {
    pub const BLOCK: &'static str = "diffusers.MidResTemporalBlock1D";

    pub fn new(vb: VarBuilder, cfg: &MidResTemporalBlock1DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c_in, c_out, e) = (cfg.in_channels, cfg.out_channels, cfg.embed_dim);
        check_groups(block, &[c_out])?;
        if cfg.add_downsample && cfg.add_upsample {
            return Err(Error::config(
                block,
                "Block cannot downsample and upsample (as diffusers raises)",
            ));
        }
        let vb_res = vb.pp("resnets");
        let mut resnets = vec![ResidualTemporalBlock1D::load(vb_res.pp(0), block, c_in, c_out, e)?];
        for i in 1..=cfg.num_layers {
            resnets.push(ResidualTemporalBlock1D::load(vb_res.pp(i), block, c_out, c_out, e)?);
        }
        let conv = |name: &str| Conv1d::load(vb.pp(name).pp("conv"), c_out, c_out, 3, true);
        let resample = match (cfg.add_upsample, cfg.add_downsample) {
            (true, _) => Some(Resample::Up(conv("upsample")?)),
            (_, true) => Some(Resample::Down(conv("downsample")?.strided(2))),
            _ => None,
        };
        Ok(Self {
            resnets,
            resample,
            in_channels: c_in,
        })
    }

    /// `forward(hidden_states, temb)`: `(B, in_channels, L)`, `temb` `(B, embed_dim)`.
    pub fn forward(&self, hidden_states: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let e = self.resnets[0].embed_dim;
        let t = check_inputs(Self::BLOCK, "hidden_states", hidden_states, temb, self.in_channels, e)?;
        let mut h = hidden_states.clone();
        for (i, resnet) in self.resnets.iter().enumerate() {
            h = trace::scope_at("resnets", i, || resnet.forward(&h, &t))?;
        }
        if let Some(r) = &self.resample {
            let name = if matches!(r, Resample::Up(_)) {
                "upsample"
            } else {
                "downsample"
            };
            h = trace::scope(name, || r.forward(&h))?;
        }
        trace::record("output", &h);
        Ok(h)
    }
}

/// Keyword arguments of `ValueFunctionMidBlock1D(in_channels, out_channels, embed_dim)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ValueFunctionMidBlock1DConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub embed_dim: usize,
}

/// `diffusers.models.unets.unet_1d_blocks.ValueFunctionMidBlock1D`.
#[derive(Debug, Clone)]
pub struct ValueFunctionMidBlock1D {
    res1: ResidualTemporalBlock1D,
    down1: Resample,
    res2: ResidualTemporalBlock1D,
    down2: Resample,
    in_channels: usize,
}

impl ValueFunctionMidBlock1D {
    pub const BLOCK: &'static str = "diffusers.ValueFunctionMidBlock1D";

    pub fn new(vb: VarBuilder, cfg: &ValueFunctionMidBlock1DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c, o, e) = (cfg.in_channels, cfg.out_channels, cfg.embed_dim);
        check_groups(block, &[c / 2, c / 4])?;
        // Downsample1D(out // 2) after a resnet producing in // 2: the two must agree.
        if o / 2 != c / 2 || o / 4 != c / 4 {
            return Err(Error::config(
                block,
                format!("out_channels {o} must halve and quarter like in_channels {c} (diffusers' downsamplers take out // 2, out // 4)"),
            ));
        }
        let down = |name: &str, ch: usize| -> Result<Resample> {
            Ok(Resample::Down(
                Conv1d::load(vb.pp(name).pp("conv"), ch, ch, 3, true)?.strided(2),
            ))
        };
        Ok(Self {
            res1: ResidualTemporalBlock1D::load(vb.pp("res1"), block, c, c / 2, e)?,
            down1: down("down1", o / 2)?,
            res2: ResidualTemporalBlock1D::load(vb.pp("res2"), block, c / 2, c / 4, e)?,
            down2: down("down2", o / 4)?,
            in_channels: c,
        })
    }

    /// `forward(x, temb)`: `(B, in_channels, L)`, `temb` `(B, embed_dim)` → `(B, in // 4, ⌈⌈L/2⌉/2⌉)`.
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let t = check_inputs(Self::BLOCK, "x", x, temb, self.in_channels, self.res1.embed_dim)?;
        let h = trace::scope("res1", || self.res1.forward(x, &t))?;
        let h = trace::scope("down1", || self.down1.forward(&h))?;
        let h = trace::scope("res2", || self.res2.forward(&h, &t))?;
        let h = trace::scope("down2", || self.down2.forward(&h))?;
        trace::record("output", &h);
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn bad_configs_and_inputs_are_named_errors() {
        let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
        let cfg = MidResTemporalBlock1DConfig {
            in_channels: 16,
            out_channels: 12,
            embed_dim: 8,
            num_layers: 1,
            add_downsample: false,
            add_upsample: false,
            non_linearity: None,
        };
        let e = MidResTemporalBlock1D::new(vb.clone(), &cfg).unwrap_err().to_string();
        assert!(e.contains("12 channels"), "{e}");
        let both = MidResTemporalBlock1DConfig {
            out_channels: 16,
            add_downsample: true,
            add_upsample: true,
            ..cfg
        };
        let e = MidResTemporalBlock1D::new(vb.clone(), &both).unwrap_err().to_string();
        assert!(e.contains("cannot downsample and upsample"), "{e}");
        let value = ValueFunctionMidBlock1DConfig {
            in_channels: 32,
            out_channels: 32,
            embed_dim: 8,
        };
        let block = ValueFunctionMidBlock1D::new(vb, &value).unwrap();
        let x = Tensor::zeros((2, 32, 8), DType::F32, &Device::Cpu).unwrap();
        let e = block.forward(&x, None).unwrap_err().to_string();
        assert!(e.contains("`temb`") && e.contains("required"), "{e}");
        let t = Tensor::zeros((2, 7), DType::F32, &Device::Cpu).unwrap();
        let e = block.forward(&x, Some(&t)).unwrap_err().to_string();
        assert!(e.contains("expected (2, 8), found [2, 7]"), "{e}");
        let e = block
            .forward(&x.narrow(1, 0, 16).unwrap(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`x`") && e.contains("(B, 32, L > 0)"), "{e}");
    }
}

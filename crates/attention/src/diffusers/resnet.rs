//! diffusers' `ResnetBlock2D` (`models/resnet.py`, 0.42.1; the same forward since 0.17), the
//! ResNet block of every diffusers U-Net and VAE mid block.
//!
//! ```text
//! norm1 = GroupNorm(groups, in, eps); conv1 = Conv2d(in, out, 3, padding=1)
//! time_emb_proj = Linear(temb, out) ["default"] | Linear(temb, 2·out) ["scale_shift"] | None
//! norm2 = GroupNorm(groups_out or groups, out, eps); conv2 = Conv2d(out, conv_2d_out or out, 3, padding=1)
//! conv_shortcut = Conv2d(in, conv_2d_out, 1, bias=conv_shortcut_bias) when in != conv_2d_out
//! forward(x, temb): h = conv1(act(norm1(x)))
//!   temb = time_emb_proj(act(temb))[:, :, None, None]            (no act with skip_time_act)
//!   "default": h = norm2(h + temb)   "scale_shift": h = norm2(h) * (1 + scale) + shift
//!   h = conv2(dropout(act(h)));  return (shortcut(x) + h) / output_scale_factor
//! ```
//!
//! `up`/`down` resampling and `kernel` are not used by mid blocks and are rejected.

use crate::config::defaults;
use crate::cpu_kernels::{ConvExtras, MemoryFormat, Swish};
use crate::layers::{group_norm, scale_shift, Activation, Conv2d, GroupNorm, Projection};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `time_embedding_norm` of `ResnetBlock2D`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeEmbeddingNorm {
    /// The time embedding is added before `norm2`.
    #[default]
    Default,
    /// The time embedding is `(scale, shift)` applied after `norm2`.
    ScaleShift,
}

/// Keyword arguments of `ResnetBlock2D(*, in_channels, out_channels=None, conv_shortcut=False,
/// dropout=0.0, temb_channels=512, groups=32, groups_out=None, pre_norm=True, eps=1e-6,
/// non_linearity="swish", skip_time_act=False, time_embedding_norm="default", kernel=None,
/// output_scale_factor=1.0, use_in_shortcut=None, up=False, down=False, conv_shortcut_bias=True,
/// conv_2d_out_channels=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetBlock2DConfig {
    pub in_channels: usize,
    #[serde(default)]
    pub out_channels: Option<usize>,
    /// Stored by diffusers but not used: the shortcut is always a 1×1 conv.
    #[serde(default)]
    pub conv_shortcut: bool,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    /// `None` (JSON `null`): no `time_emb_proj`, the block takes no time embedding.
    #[serde(default = "defaults::some::<512>")]
    pub temb_channels: Option<usize>,
    #[serde(default = "defaults::usize::<32>")]
    pub groups: usize,
    #[serde(default)]
    pub groups_out: Option<usize>,
    /// Ignored by diffusers (always pre-norm).
    #[serde(default = "defaults::yes")]
    pub pre_norm: bool,
    #[serde(default = "defaults::eps_1e6")]
    pub eps: f64,
    #[serde(default = "swish")]
    pub non_linearity: Activation,
    #[serde(default)]
    pub skip_time_act: bool,
    #[serde(default)]
    pub time_embedding_norm: TimeEmbeddingNorm,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default = "defaults::one_f")]
    pub output_scale_factor: f64,
    #[serde(default)]
    pub use_in_shortcut: Option<bool>,
    #[serde(default)]
    pub up: bool,
    #[serde(default)]
    pub down: bool,
    #[serde(default = "defaults::yes")]
    pub conv_shortcut_bias: bool,
    #[serde(default)]
    pub conv_2d_out_channels: Option<usize>,
}

/// `"swish"`, the default `non_linearity` / `resnet_act_fn` of diffusers' resnets and mid blocks
/// (here and not in `crate::config::defaults`, which sits below the layer of [`Activation`]).
pub(crate) fn swish() -> Activation {
    Activation::Swish
}

impl ResnetBlock2DConfig {
    /// `ResnetBlock2D(in_channels=...)` with every other argument at its diffusers default.
    pub fn new(in_channels: usize) -> Self {
        Self {
            in_channels,
            out_channels: None,
            conv_shortcut: false,
            dropout: 0.0,
            temb_channels: defaults::some::<512>(),
            groups: defaults::usize::<32>(),
            groups_out: None,
            pre_norm: defaults::yes(),
            eps: defaults::eps_1e6(),
            non_linearity: swish(),
            skip_time_act: false,
            time_embedding_norm: TimeEmbeddingNorm::default(),
            kernel: None,
            output_scale_factor: defaults::one_f(),
            use_in_shortcut: None,
            up: false,
            down: false,
            conv_shortcut_bias: defaults::yes(),
            conv_2d_out_channels: None,
        }
    }
}

/// `diffusers.models.resnet.ResnetBlock2D`.
#[derive(Debug, Clone)]
pub struct ResnetBlock2D {
    in_channels: usize,
    norm1: GroupNorm,
    conv1: Conv2d,
    time_emb_proj: Option<Projection>,
    norm2: GroupNorm,
    conv2: Conv2d,
    conv_shortcut: Option<Conv2d>,
    act: Activation,
    skip_time_act: bool,
    time_embedding_norm: TimeEmbeddingNorm,
    output_scale_factor: f64,
}

impl ResnetBlock2D {
    pub const BLOCK: &'static str = "diffusers.ResnetBlock2D";

    pub fn new(vb: VarBuilder, cfg: &ResnetBlock2DConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        if cfg.up || cfg.down || cfg.kernel.is_some() {
            return Err(Error::unsupported(
                block,
                "up/down resampling (and `kernel`) are not implemented; mid blocks do not use them",
            ));
        }
        if cfg.in_channels == 0 {
            return Err(Error::config(block, "in_channels must be greater than 0"));
        }
        if !(cfg.output_scale_factor.is_finite() && cfg.output_scale_factor != 0.0) {
            return Err(Error::config(
                block,
                format!(
                    "output_scale_factor must be finite and non-zero, found {}",
                    cfg.output_scale_factor
                ),
            ));
        }
        let out = cfg.out_channels.unwrap_or(cfg.in_channels);
        let conv_2d_out = cfg.conv_2d_out_channels.unwrap_or(out);
        let time_emb_proj = match cfg.temb_channels {
            Some(t) => {
                let width = match cfg.time_embedding_norm {
                    TimeEmbeddingNorm::Default => out,
                    TimeEmbeddingNorm::ScaleShift => 2 * out,
                };
                Some(Projection::load(vb.pp("time_emb_proj"), block, t, width, true)?)
            }
            None => None,
        };
        let use_in_shortcut = cfg.use_in_shortcut.unwrap_or(cfg.in_channels != conv_2d_out);
        Ok(Self {
            in_channels: cfg.in_channels,
            norm1: group_norm(vb.pp("norm1"), block, cfg.groups, cfg.in_channels, cfg.eps)?,
            conv1: Conv2d::load(vb.pp("conv1"), cfg.in_channels, out, 3, true)?,
            time_emb_proj,
            norm2: group_norm(
                vb.pp("norm2"),
                block,
                cfg.groups_out.unwrap_or(cfg.groups),
                out,
                cfg.eps,
            )?,
            conv2: Conv2d::load(vb.pp("conv2"), out, conv_2d_out, 3, true)?,
            conv_shortcut: if use_in_shortcut {
                Some(Conv2d::load(
                    vb.pp("conv_shortcut"),
                    cfg.in_channels,
                    conv_2d_out,
                    1,
                    cfg.conv_shortcut_bias,
                )?)
            } else {
                None
            },
            act: cfg.non_linearity,
            skip_time_act: cfg.skip_time_act,
            time_embedding_norm: cfg.time_embedding_norm,
            output_scale_factor: cfg.output_scale_factor,
        })
    }

    /// `time_emb_proj(act(temb))` `(B, C or 2·C)`, checked against the input; `None` without a
    /// `time_emb_proj` (a given `temb` is then ignored, as in diffusers).
    fn time_embedding(&self, input_tensor: &Tensor, temb: Option<&Tensor>) -> Result<Option<Tensor>> {
        let block = Self::BLOCK;
        let Some(proj) = &self.time_emb_proj else {
            return Ok(None);
        };
        let temb = temb.ok_or_else(|| {
            Error::input(
                block,
                "temb",
                "required: the block has a time_emb_proj (temb_channels is set)",
            )
        })?;
        if temb.rank() != 2 || temb.dim(0)? != input_tensor.dim(0)? {
            return Err(Error::input(
                block,
                "temb",
                format!(
                    "expected (B={}, temb_channels), found {:?}",
                    input_tensor.dim(0)?,
                    temb.dims()
                ),
            ));
        }
        let temb = if self.skip_time_act {
            temb.clone()
        } else {
            self.act.forward(temb)?
        };
        let temb = proj.forward_tokens(&temb)?;
        trace::record("temb", &temb);
        Ok(Some(temb))
    }

    /// Whether the block has a `time_emb_proj` (and so needs `temb`).
    pub fn takes_temb(&self) -> bool {
        self.time_emb_proj.is_some()
    }

    /// `forward(input_tensor, temb)`: `input_tensor` `(B, in_channels, H, W)`, `temb`
    /// `(B, temb_channels)`, required when the block has a `time_emb_proj`, ignored otherwise
    /// (as in diffusers).
    pub fn forward(&self, input_tensor: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        self.forward_as(input_tensor, temb, MemoryFormat::Contiguous)
    }

    /// [`Self::forward`] of an input PyTorch lays out as `format`: both norms then take that
    /// layout's kernel (`conv1` and the time-embedding add keep it), as does the output.
    pub fn forward_as(&self, input_tensor: &Tensor, temb: Option<&Tensor>, format: MemoryFormat) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "input_tensor", input_tensor, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        let block = Self::BLOCK;
        if input_tensor.rank() != 4 || input_tensor.dim(1)? != self.in_channels {
            return Err(Error::input(
                block,
                "input_tensor",
                format!(
                    "expected (B, {}, H, W), found {:?}",
                    self.in_channels,
                    input_tensor.dims()
                ),
            ));
        }
        let swish = |norm: &GroupNorm, x: &Tensor, stage: &str| -> candle_core::Result<Tensor> {
            match self.act {
                Activation::Swish => norm.forward_swish_as(x, format, stage, Swish::Silu, |y| self.act.forward(y)),
                act => {
                    let normed = norm.forward_as(x, format)?;
                    trace::record(stage, &normed);
                    act.forward(&normed)
                }
            }
        };
        let temb = self.time_embedding(input_tensor, temb)?;
        let h = swish(&self.norm1, input_tensor, "norm1")?;
        // "default": `norm2(conv1(..) + temb)`, the add in conv1's write-out.
        let (add, scale_shift_temb) = match (self.time_embedding_norm, &temb) {
            (TimeEmbeddingNorm::Default, Some(t)) => (Some(t), None),
            (TimeEmbeddingNorm::ScaleShift, Some(t)) => (None, Some(t)),
            (TimeEmbeddingNorm::ScaleShift, None) => {
                return Err(Error::input(
                    block,
                    "temb",
                    "required when time_embedding_norm is scale_shift",
                ))
            }
            (TimeEmbeddingNorm::Default, None) => (None, None),
        };
        // On CUDA with a swish the add goes to norm2's fused kernel instead.
        let pre_add = add.filter(|t| self.act == Activation::Swish && GroupNorm::fuses_pre_add(&h, t));
        let extras = ConvExtras {
            channel_add: if pre_add.is_some() { None } else { add },
            ..ConvExtras::default()
        };
        let h = self.conv1.forward_traced(&h, "conv1", extras)?;
        let h = match scale_shift_temb {
            Some(temb) => {
                let normed = self.norm2.forward_as(&h, format)?;
                trace::record("norm2", &normed);
                let half = temb.dim(1)? / 2;
                let (scale, shift) = (temb.narrow(1, 0, half)?, temb.narrow(1, half, half)?);
                self.act.forward(&scale_shift(&normed, &scale, &shift)?)?
            }
            None => match pre_add {
                Some(t) => {
                    let act = |y: &Tensor| self.act.forward(y);
                    self.norm2
                        .forward_swish_add_as(&h, t, format, "norm2", Swish::Silu, act)?
                }
                None => swish(&self.norm2, &h, "norm2")?,
            },
        };
        let shortcut = match &self.conv_shortcut {
            Some(conv) => {
                let s = conv.forward(input_tensor)?;
                trace::record("shortcut", &s);
                s
            }
            None => input_tensor.clone(),
        };
        // `(shortcut + conv2(..)) / output_scale_factor`, in conv2's write-out.
        let extras = ConvExtras {
            residual: Some(&shortcut),
            div: Some(self.output_scale_factor),
            ..ConvExtras::default()
        };
        let out = self.conv2.forward_traced(&h, "conv2", extras)?;
        trace::record("output", &out);
        Ok(out)
    }
}

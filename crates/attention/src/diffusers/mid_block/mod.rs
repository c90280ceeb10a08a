//! diffusers' U-Net and VAE mid blocks (`models/unets/unet_2d_blocks.py`, 0.42.1; key names
//! stable since 0.17):
//!
//! * [`UNetMidBlock2D`]: `resnets.0`, then `attentions.i` (an [`Attention`](crate::diffusers::Attention) with a GroupNorm,
//!   the residual inside and `upcast_softmax`) and `resnets.(i+1)` per layer. The mid block of
//!   `UNet2DModel` and of `AutoencoderKL`'s encoder and decoder (`temb` None there).
//! * [`UNetMidBlock2DCrossAttn`]: the same with a
//!   [`Transformer2DModel`](crate::diffusers::Transformer2DModel) per layer, the mid block
//!   of `UNet2DConditionModel` (SD 1.x, 2.x, XL); with `dual_cross_attention=True` (Versatile
//!   Diffusion's image U-Net) a
//!   [`DualTransformer2DModel`](crate::diffusers::DualTransformer2DModel) per layer instead (`attentions.i.transformers.{0,1}`).
//!
//! ```text
//! forward(h, temb): h = resnets[0](h, temb)
//!                   for attn, resnet in zip(attentions, resnets[1:]): h = attn(h, ...); h = resnet(h, temb)
//! ```
//!
//! This module holds what both blocks (and the other diffusers mid blocks) share: the resnet
//! config helpers and the serde defaults; `mid_block_2d` holds [`UNetMidBlock2D`] and
//! `cross_attn` [`UNetMidBlock2DCrossAttn`].

mod cross_attn;
mod mid_block_2d;

pub use cross_attn::{LayersPerBlock, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig};
pub use mid_block_2d::{UNetMidBlock2D, UNetMidBlock2DConfig};

use crate::diffusers::resnet::{ResnetBlock2DConfig, TimeEmbeddingNorm};
use crate::layers::Activation;
use crate::{Error, Result};

/// `resnet_time_scale_shift` as the mid blocks with `ResnetBlock2D`s take it. `"spatial"` and
/// `"ada_group"` reach `ResnetBlock2D`, which diffusers refuses for them (only `UNetMidBlock2D`
/// builds `ResnetBlockCondNorm2D`, and only for `"spatial"`).
pub(super) fn time_norm(block: &'static str, name: &str) -> Result<TimeEmbeddingNorm> {
    match name {
        "default" => Ok(TimeEmbeddingNorm::Default),
        "scale_shift" => Ok(TimeEmbeddingNorm::ScaleShift),
        "spatial" | "ada_group" => Err(Error::config(
            block,
            format!(
                "resnet_time_scale_shift {name:?} makes this block build ResnetBlock2D(time_embedding_norm={name:?}), \
                 which diffusers refuses (\"please use ResnetBlockCondNorm2D\"); only UNetMidBlock2D takes \"spatial\""
            ),
        )),
        other => Err(Error::config(
            block,
            format!("unknown resnet_time_scale_shift {other:?}; expected \"default\" or \"scale_shift\""),
        )),
    }
}

/// The `ResnetBlock2D(...)` every diffusers mid block constructs: `in_channels → out_channels`, the
/// block-wide time embedding, eps, activation, time norm, dropout and output scale.
#[allow(clippy::too_many_arguments)]
pub(super) fn resnet_config(
    in_channels: usize,
    out_channels: usize,
    groups: usize,
    groups_out: Option<usize>,
    temb_channels: Option<usize>,
    eps: f64,
    act: Activation,
    norm: TimeEmbeddingNorm,
    dropout: f64,
    output_scale_factor: f64,
    pre_norm: bool,
) -> ResnetBlock2DConfig {
    ResnetBlock2DConfig {
        in_channels,
        out_channels: Some(out_channels),
        conv_shortcut: false,
        dropout,
        temb_channels,
        groups,
        groups_out,
        pre_norm,
        eps,
        non_linearity: act,
        skip_time_act: false,
        time_embedding_norm: norm,
        kernel: None,
        output_scale_factor,
        use_in_shortcut: None,
        up: false,
        down: false,
        conv_shortcut_bias: true,
        conv_2d_out_channels: None,
    }
}

pub(super) fn default_shift() -> String {
    "default".into()
}
pub(super) fn one() -> usize {
    1
}
pub(super) fn groups_32() -> Option<usize> {
    Some(32)
}

/// A config from the constructor's required arguments, every other field at its default (the
/// serde defaults of the config: one source for both).
pub(super) fn from_required<T: serde::de::DeserializeOwned>(in_channels: usize, temb_channels: Option<usize>) -> T {
    let args = serde_json::json!({ "in_channels": in_channels, "temb_channels": temb_channels });
    serde_json::from_value(args).expect("the required arguments and defaults form a config")
}

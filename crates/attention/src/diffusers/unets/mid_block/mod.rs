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
//! This module holds what both blocks (and the other diffusers mid blocks) share: the shared
//! keyword arguments (`kwargs`: [`ResnetKwargs`], [`TransformerKwargs`], [`TimeScaleShift`] and
//! the macro declaring the configs) and the resnet/attention loop (`stack`); `mid_block_2d`
//! holds [`UNetMidBlock2D`] and `cross_attn` [`UNetMidBlock2DCrossAttn`].

mod cross_attn;
mod kwargs;
mod mid_block_2d;
mod stack;

pub use cross_attn::{UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig};
pub(crate) use kwargs::mid_block_config;
pub use kwargs::{ResnetKwargs, TimeScaleShift, TransformerKwargs};
pub use mid_block_2d::{UNetMidBlock2D, UNetMidBlock2DConfig};
pub(crate) use stack::{MidStack, Step};

use serde::Deserialize;

/// `transformer_layers_per_block`: one count for every layer, or one per layer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum LayersPerBlock {
    One(usize),
    PerLayer(Vec<usize>),
}

impl Default for LayersPerBlock {
    fn default() -> Self {
        LayersPerBlock::One(1)
    }
}

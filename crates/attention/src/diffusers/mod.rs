//! Hugging Face diffusers (0.42.1): the `Attention` class with its default processors, and the
//! Stable Diffusion transformer bottleneck (`FeedForward`/`GEGLU`, `BasicTransformerBlock`,
//! `Transformer2DModel`, Versatile Diffusion's `DualTransformer2DModel`), the ResNet blocks and the U-Net / VAE mid blocks (`ResnetBlock2D`, `ResnetBlockCondNorm2D`,
//! `UNetMidBlock2D`, `UNetMidBlock2DCrossAttn`, `UNetMidBlock2DSimpleCrossAttn`), the video U-Nets'
//! `UNetMidBlock3DCrossAttn` with its temporal layers (`TemporalConvLayer`, `TransformerTemporalModel`),
//! AnimateDiff's `UNetMidBlockCrossAttnMotion` (motion modules with `SinusoidalPositionalEmbedding`), the
//! `ControlNetModel` bottleneck (`ControlNetMidBlock`: its mid block and `controlnet_mid_block`),
//! `UNetControlNetXSModel`'s `ControlNetXSCrossAttnMidBlock2D`
//! and their configs from a model's `config.json`; Stable Video Diffusion's
//! `UNetMidBlockSpatioTemporal` and `MidBlockTemporalDecoder` (`SpatioTemporalResBlock`,
//! `AlphaBlender`, `TransformerSpatioTemporalModel`).
//!
//! Grouped as diffusers' own `models/` is: `unets/` (the mid blocks of `unets/unet_*_blocks.py`
//! and `unet_motion_model.py`, and the typed [`MidBlock`] over them), `transformers/`
//! (`transformers/transformer_2d.py`, `dual_transformer_2d.py`, `transformer_temporal.py`, and
//! `attention.py`'s `BasicTransformerBlock`), `controlnets/`; `attention/` (`attention_processor.py`),
//! `feed_forward`, `resnet`, `resnet_cond_norm`, `spatio_temporal` and `embeddings` sit at the top,
//! as their files do in `models/`. Every block and config is also re-exported here.

pub mod attention;
pub mod controlnets;
pub mod embeddings;
pub mod feed_forward;
pub mod model_config;
mod model_keys;
pub mod resnet;
pub mod resnet_cond_norm;
pub mod spatio_temporal;
pub mod transformers;
pub mod unets;

pub use attention::{Attention, AttentionConfig, Processor};
pub use controlnets::controlnet::{ControlNetMidBlock, ControlNetMidBlockConfig};
pub use controlnets::controlnet_xs::{
    ControlNetXSCrossAttnMidBlock2D, ControlNetXSCrossAttnMidBlock2DConfig, JointArgs,
};
pub use embeddings::SinusoidalPositionalEmbedding;
pub use feed_forward::{FeedForward, FeedForwardConfig, Geglu, GegluConfig};
pub use resnet::{ResnetBlock2D, ResnetBlock2DConfig};
pub use resnet_cond_norm::{ResnetBlockCondNorm2D, ResnetBlockCondNorm2DConfig};
pub use spatio_temporal::{AlphaBlender, MergeStrategy, SpatioTemporalResBlock, SpatioTemporalResBlockSpec};
pub use transformers::dual_transformer::{DualMix, DualTransformer2DModel, DualTransformer2DModelConfig};
pub use transformers::temporal::{
    TemporalConvLayer, TemporalConvLayerConfig, TransformerTemporalModel, TransformerTemporalModelConfig,
};
pub use transformers::transformer::{
    BasicTransformerBlock, BasicTransformerBlockConfig, Transformer2DModel, Transformer2DModelConfig,
};
pub use transformers::transformer_spatio_temporal::{
    TransformerSpatioTemporalModel, TransformerSpatioTemporalModelConfig,
};
pub use unets::any_mid_block::{MidBlock, MidBlockConfig};
pub use unets::mid_block::{
    UNetMidBlock2D, UNetMidBlock2DConfig, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig,
};
pub use unets::mid_block_1d::{UNetMidBlock1D, UNetMidBlock1DConfig};
pub use unets::mid_block_1d_temporal::{
    MidResTemporalBlock1D, MidResTemporalBlock1DConfig, ValueFunctionMidBlock1D, ValueFunctionMidBlock1DConfig,
};
pub use unets::mid_block_3d::{UNetMidBlock3DCrossAttn, UNetMidBlock3DCrossAttnConfig};
pub use unets::mid_block_motion::{UNetMidBlockCrossAttnMotion, UNetMidBlockCrossAttnMotionConfig};
pub use unets::mid_block_simple_cross::{UNetMidBlock2DSimpleCrossAttn, UNetMidBlock2DSimpleCrossAttnConfig};
pub use unets::mid_block_spatio_temporal::{
    MidBlockTemporalDecoder, MidBlockTemporalDecoderConfig, UNetMidBlockSpatioTemporal,
    UNetMidBlockSpatioTemporalConfig,
};

#[cfg(test)]
mod defaults_tests;

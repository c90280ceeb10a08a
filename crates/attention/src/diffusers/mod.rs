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

pub mod any_mid_block;
pub mod attention;
pub mod controlnet;
pub mod controlnet_xs;
pub mod dual_transformer;
pub mod embeddings;
pub mod feed_forward;
pub mod mid_block;
pub mod mid_block_1d;
pub mod mid_block_1d_temporal;
pub mod mid_block_3d;
pub mod mid_block_motion;
pub mod mid_block_simple_cross;
pub mod mid_block_spatio_temporal;
pub mod model_config;
mod model_keys;
pub mod resnet;
pub mod resnet_cond_norm;
pub mod spatio_temporal;
pub mod temporal;
pub mod transformer;
pub mod transformer_spatio_temporal;

pub use any_mid_block::{MidBlock, MidBlockConfig};
pub use attention::{Attention, AttentionConfig, Processor};
pub use controlnet::{ControlNetMidBlock, ControlNetMidBlockConfig};
pub use controlnet_xs::{ControlNetXSCrossAttnMidBlock2D, ControlNetXSCrossAttnMidBlock2DConfig, JointArgs};
pub use dual_transformer::{DualMix, DualTransformer2DModel, DualTransformer2DModelConfig};
pub use embeddings::SinusoidalPositionalEmbedding;
pub use feed_forward::{FeedForward, FeedForwardConfig, Geglu, GegluConfig};
pub use mid_block::{UNetMidBlock2D, UNetMidBlock2DConfig, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig};
pub use mid_block_1d::{UNetMidBlock1D, UNetMidBlock1DConfig};
pub use mid_block_1d_temporal::{
    MidResTemporalBlock1D, MidResTemporalBlock1DConfig, ValueFunctionMidBlock1D, ValueFunctionMidBlock1DConfig,
};
pub use mid_block_3d::{UNetMidBlock3DCrossAttn, UNetMidBlock3DCrossAttnConfig};
pub use mid_block_motion::{UNetMidBlockCrossAttnMotion, UNetMidBlockCrossAttnMotionConfig};
pub use mid_block_simple_cross::{UNetMidBlock2DSimpleCrossAttn, UNetMidBlock2DSimpleCrossAttnConfig};
pub use mid_block_spatio_temporal::{
    MidBlockTemporalDecoder, MidBlockTemporalDecoderConfig, UNetMidBlockSpatioTemporal,
    UNetMidBlockSpatioTemporalConfig,
};
pub use resnet::{ResnetBlock2D, ResnetBlock2DConfig};
pub use resnet_cond_norm::{ResnetBlockCondNorm2D, ResnetBlockCondNorm2DConfig};
pub use spatio_temporal::{AlphaBlender, MergeStrategy, SpatioTemporalResBlock, SpatioTemporalResBlockSpec};
pub use temporal::{
    TemporalConvLayer, TemporalConvLayerConfig, TransformerTemporalModel, TransformerTemporalModelConfig,
};
pub use transformer::{
    BasicTransformerBlock, BasicTransformerBlockConfig, Transformer2DModel, Transformer2DModelConfig,
};
pub use transformer_spatio_temporal::{TransformerSpatioTemporalModel, TransformerSpatioTemporalModelConfig};

#[cfg(test)]
mod defaults_tests;

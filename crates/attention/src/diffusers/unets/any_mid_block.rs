//! Every diffusers mid block behind two typed enums: [`MidBlockConfig`] (the block's config,
//! by block type) and [`MidBlock`] (the built block). [`MidBlockSpec::typed`] turns what
//! [`crate::diffusers::model_config::mid_blocks`] reads from a model's `config.json` into a
//! `MidBlockConfig`, and [`MidBlockSpec::build`] builds the block under its prefix, so a model
//! folder gives its mid block in one call (`unet_parity::model::mid_block` reads the folder).
//!
//! ```no_run
//! use unet_attention::diffusers::{model_config, MidBlock};
//! # fn f(vb: candle_nn::VarBuilder, x: &candle_core::Tensor, temb: &candle_core::Tensor,
//! #      context: &candle_core::Tensor) -> Result<(), Box<dyn std::error::Error>> {
//! let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("unet/config.json")?)?;
//! let spec = &model_config::mid_blocks(&json, None, false)?[0];
//! match spec.build(vb)? {
//!     MidBlock::UNetMidBlock2DCrossAttn(mid) => {
//!         let _y = mid.forward(x, Some(temb), Some(context), None, None)?;
//!     }
//!     other => println!("a {} mid block", other.block_id()),
//! }
//! # Ok(())
//! # }
//! ```

use crate::config;
use crate::diffusers::model_config::MidBlockSpec;
use crate::diffusers::{
    ControlNetMidBlock, ControlNetMidBlockConfig, ControlNetXSCrossAttnMidBlock2D,
    ControlNetXSCrossAttnMidBlock2DConfig, MidBlockTemporalDecoder, MidBlockTemporalDecoderConfig,
    MidResTemporalBlock1D, MidResTemporalBlock1DConfig, UNetMidBlock1D, UNetMidBlock1DConfig, UNetMidBlock2D,
    UNetMidBlock2DConfig, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig, UNetMidBlock2DSimpleCrossAttn,
    UNetMidBlock2DSimpleCrossAttnConfig, UNetMidBlock3DCrossAttn, UNetMidBlock3DCrossAttnConfig,
    UNetMidBlockCrossAttnMotion, UNetMidBlockCrossAttnMotionConfig, UNetMidBlockSpatioTemporal,
    UNetMidBlockSpatioTemporalConfig, ValueFunctionMidBlock1D, ValueFunctionMidBlock1DConfig,
};
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

/// One declaration per mid block: the enum variant, the block type and its config type.
macro_rules! mid_blocks {
    ($($variant:ident: $block:ty, $config:ty;)*) => {
        /// A diffusers mid block's config, by block type (each one deserializes from the PyTorch
        /// constructor's kwargs and serializes back to them).
        #[derive(Debug, Clone, serde::Serialize)]
        #[serde(untagged)]
        pub enum MidBlockConfig {
            $($variant($config),)*
        }

        /// A built diffusers mid block, by block type: match on it to call the block's own
        /// `forward`, which takes the PyTorch forward's arguments.
        // Built once per model and held: variants of a few hundred bytes each cost nothing, and
        // boxing them would put a `Box` in every match arm users write.
        #[allow(clippy::large_enum_variant)]
        pub enum MidBlock {
            $($variant($block),)*
        }

        impl MidBlockConfig {
            /// The block id (`diffusers.UNetMidBlock2DCrossAttn`, ...) and kwargs of a spec,
            /// typed. Unknown kwargs are refused, naming the block and the key.
            pub fn from_block_id(block: &str, kwargs: &serde_json::Value) -> Result<Self> {
                $(if block == <$block>::BLOCK {
                    return Ok(Self::$variant(config::from_json(<$block>::BLOCK, kwargs)?));
                })*
                Err(Error::unsupported(
                    "mid block",
                    format!("block id `{block}`; known: {}", [$(<$block>::BLOCK),*].join(", ")),
                ))
            }

            /// The block id this config builds.
            pub fn block_id(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => <$block>::BLOCK,)*
                }
            }
        }

        impl MidBlock {
            /// Build the block from its config, with `vb` at the block's own prefix.
            pub fn new(vb: VarBuilder, cfg: &MidBlockConfig) -> Result<Self> {
                Ok(match cfg {
                    $(MidBlockConfig::$variant(c) => Self::$variant(<$block>::new(vb, c)?),)*
                })
            }

            /// The block id (`diffusers.UNetMidBlock2D`, ...).
            pub fn block_id(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => <$block>::BLOCK,)*
                }
            }
        }
    };
}

mid_blocks! {
    UNetMidBlock2D: UNetMidBlock2D, UNetMidBlock2DConfig;
    UNetMidBlock2DCrossAttn: UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig;
    UNetMidBlock2DSimpleCrossAttn: UNetMidBlock2DSimpleCrossAttn, UNetMidBlock2DSimpleCrossAttnConfig;
    ControlNetMidBlock: ControlNetMidBlock, ControlNetMidBlockConfig;
    ControlNetXSCrossAttnMidBlock2D: ControlNetXSCrossAttnMidBlock2D, ControlNetXSCrossAttnMidBlock2DConfig;
    UNetMidBlock1D: UNetMidBlock1D, UNetMidBlock1DConfig;
    MidResTemporalBlock1D: MidResTemporalBlock1D, MidResTemporalBlock1DConfig;
    ValueFunctionMidBlock1D: ValueFunctionMidBlock1D, ValueFunctionMidBlock1DConfig;
    UNetMidBlock3DCrossAttn: UNetMidBlock3DCrossAttn, UNetMidBlock3DCrossAttnConfig;
    UNetMidBlockSpatioTemporal: UNetMidBlockSpatioTemporal, UNetMidBlockSpatioTemporalConfig;
    MidBlockTemporalDecoder: MidBlockTemporalDecoder, MidBlockTemporalDecoderConfig;
    UNetMidBlockCrossAttnMotion: UNetMidBlockCrossAttnMotion, UNetMidBlockCrossAttnMotionConfig;
}

impl MidBlock {
    /// The image U-Net / VAE forward: `hidden_states`, `temb`, `encoder_hidden_states`, for the
    /// blocks whose PyTorch forward needs nothing more (`UNetMidBlock2D`,
    /// `UNetMidBlock2DCrossAttn`, `UNetMidBlock2DSimpleCrossAttn`, the 1-D blocks). A missing
    /// argument the block needs is an error naming it (the blocks' own check); the video and
    /// ControlNet blocks, which
    /// take frame counts, masks or two streams, are an error saying to call their own `forward`.
    pub fn forward(&self, hidden_states: &Tensor, temb: Option<&Tensor>, context: Option<&Tensor>) -> Result<Tensor> {
        let block = self.block_id();
        let unused = |what: &str| {
            Error::input(
                block,
                "encoder_hidden_states",
                format!("this block takes no {what}; pass None"),
            )
        };
        match self {
            Self::UNetMidBlock2DCrossAttn(b) => b.forward(hidden_states, temb, context, None, None),
            Self::UNetMidBlock2DSimpleCrossAttn(b) => b.forward(hidden_states, temb, context, None, None),
            _ if context.is_some() => Err(unused("cross-attention context")),
            Self::UNetMidBlock2D(b) => b.forward(hidden_states, temb),
            Self::UNetMidBlock1D(b) => b.forward(hidden_states, temb),
            Self::MidResTemporalBlock1D(b) => b.forward(hidden_states, temb),
            Self::ValueFunctionMidBlock1D(b) => b.forward(hidden_states, temb),
            other => Err(Error::unsupported(
                other.block_id(),
                "MidBlock::forward: this block's forward takes more arguments (frames, masks, a second stream); \
                 match on the MidBlock and call the block's own forward",
            )),
        }
    }
}

impl MidBlockSpec {
    /// The spec's config, typed.
    pub fn typed(&self) -> Result<MidBlockConfig> {
        MidBlockConfig::from_block_id(self.block, &self.config)
    }

    /// Build the block, `vb` being the whole model's `VarBuilder` (the spec's prefix is applied
    /// here).
    pub fn build(&self, vb: VarBuilder) -> Result<MidBlock> {
        let vb = if self.prefix.is_empty() { vb } else { vb.pp(self.prefix) };
        MidBlock::new(vb, &self.typed()?)
    }
}

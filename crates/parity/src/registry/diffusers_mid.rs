use super::{BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::diffusers::{
    ControlNetMidBlock, MidResTemporalBlock1D, ResnetBlock2D, UNetMidBlock1D, UNetMidBlock2D, UNetMidBlock2DCrossAttn,
    UNetMidBlock2DSimpleCrossAttn, UNetMidBlock3DCrossAttn, UNetMidBlockCrossAttnMotion, ValueFunctionMidBlock1D,
};
use unet_attention::diffusers::{ControlNetXSCrossAttnMidBlock2D, JointArgs};
use unet_attention::diffusers::{MidBlockTemporalDecoder, UNetMidBlockSpatioTemporal};
use unet_attention::Result;

impl Runnable for ResnetBlock2D {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("input_tensor")?, inputs.get("temb"))?])
    }
}

/// The 1-D mid blocks: `forward(hidden_states, temb)`.
macro_rules! hidden_temb_runnable {
    ($($block:ty),*) => {$(
        impl Runnable for $block {
            fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
                Ok(vec![self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?])
            }
        }
    )*};
}

hidden_temb_runnable!(UNetMidBlock1D, MidResTemporalBlock1D);

/// `ValueFunctionMidBlock1D.forward(x, temb)`.
impl Runnable for ValueFunctionMidBlock1D {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("temb"))?])
    }
}

impl Runnable for UNetMidBlock2D {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![
            self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?
        ])
    }
}

/// The cross-attention mid blocks share the forward signature `(hidden_states, temb,
/// encoder_hidden_states, attention_mask, encoder_attention_mask)`.
macro_rules! cross_attn_runnable {
    ($($block:ty),*) => {$(
        impl Runnable for $block {
            fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
                let out = self.forward(
                    inputs.required("hidden_states")?,
                    inputs.get("temb"),
                    inputs.get("encoder_hidden_states"),
                    inputs.get("attention_mask"),
                    inputs.get("encoder_attention_mask"),
                )?;
                Ok(vec![out])
            }
        }
    )*};
}

cross_attn_runnable!(UNetMidBlock2DCrossAttn, UNetMidBlock2DSimpleCrossAttn);

/// `ControlNetModel`'s mid block and `controlnet_mid_block`: outputs `mid_block_res_sample`,
/// then the mid block's `sample`.
impl Runnable for ControlNetMidBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let (res, sample) = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("temb"),
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
            inputs.number("conditioning_scale", 1.0)?,
        )?;
        Ok(vec![res, sample])
    }
}

/// `UNetControlNetXSModel`'s mid block: outputs `h_base`, `h_ctrl`.
impl Runnable for ControlNetXSCrossAttnMidBlock2D {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let joint = JointArgs {
            temb: inputs.get("temb"),
            encoder_hidden_states: inputs.get("encoder_hidden_states"),
            attention_mask: inputs.get("attention_mask"),
            encoder_attention_mask: inputs.get("encoder_attention_mask"),
        };
        let (h_base, h_ctrl) = self.forward(
            inputs.required("hidden_states_base")?,
            inputs.required("hidden_states_ctrl")?,
            &joint,
            inputs.number("conditioning_scale", 1.0)?,
            inputs.flag("apply_control", true)?,
        )?;
        Ok(vec![h_base, h_ctrl])
    }
}

/// The video U-Nets' mid block: `num_frames` from `parity.kwargs` (1 when absent, the
/// forward's default).
impl Runnable for UNetMidBlock3DCrossAttn {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("temb"),
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
            inputs.count("num_frames", 1)?,
        )?;
        Ok(vec![out])
    }
}

/// AnimateDiff's mid block: the cross-attention inputs, `num_frames` from `parity.kwargs` (1 when
/// absent, the forward's default).
impl Runnable for UNetMidBlockCrossAttnMotion {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("temb"),
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
            inputs.get("encoder_attention_mask"),
            inputs.count("num_frames", 1)?,
        )?;
        Ok(vec![out])
    }
}

/// Stable Video Diffusion's U-Net mid block: `num_frames` from `image_only_indicator`'s last dim.
impl Runnable for UNetMidBlockSpatioTemporal {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("temb"),
            inputs.get("encoder_hidden_states"),
            inputs.get("image_only_indicator"),
        )?;
        Ok(vec![out])
    }
}

/// Stable Video Diffusion's VAE decoder mid block.
impl Runnable for MidBlockTemporalDecoder {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(inputs.required("hidden_states")?, inputs.get("image_only_indicator"))?;
        Ok(vec![out])
    }
}

/// Their inputs, in forward order.
const CROSS_ATTN_INPUTS: &[&str] = &[
    "hidden_states",
    "temb",
    "encoder_hidden_states",
    "attention_mask",
    "encoder_attention_mask",
];

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: ResnetBlock2D::BLOCK,
            pytorch: "diffusers.models.resnet.ResnetBlock2D (diffusers 0.17 – 0.42.1; time_embedding_norm default / scale_shift)",
            inputs: &["input_tensor", "temb"],
            kwargs: &[],
            build: from_config!(ResnetBlock2D),
        },
        BlockInfo {
            id: UNetMidBlock2D::BLOCK,
            pytorch: "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2D (diffusers 0.22 – 0.42.1; UNet2DModel and AutoencoderKL mid blocks)",
            inputs: &["hidden_states", "temb"],
            kwargs: &[],
            build: from_config!(UNetMidBlock2D),
        },
        BlockInfo {
            id: UNetMidBlock1D::BLOCK,
            pytorch: "diffusers.models.unets.unet_1d_blocks.UNetMidBlock1D (diffusers 0.7 – 0.42.1; UNet1DModel mid block, Dance Diffusion: cubic Downsample1d, 6 ResConvBlock + SelfAttention1d, cubic Upsample1d)",
            inputs: &["hidden_states", "temb"],
            kwargs: &[],
            build: from_config!(UNetMidBlock1D),
        },
        BlockInfo {
            id: MidResTemporalBlock1D::BLOCK,
            pytorch: "diffusers.models.unets.unet_1d_blocks.MidResTemporalBlock1D (diffusers 0.8 – 0.42.1; UNet1DModel mid block of the Diffuser trajectory U-Net: ResidualTemporalBlock1D stack, optional Downsample1D / Upsample1D)",
            inputs: &["hidden_states", "temb"],
            kwargs: &[],
            build: from_config!(MidResTemporalBlock1D),
        },
        BlockInfo {
            id: ValueFunctionMidBlock1D::BLOCK,
            pytorch: "diffusers.models.unets.unet_1d_blocks.ValueFunctionMidBlock1D (diffusers 0.8 – 0.42.1; UNet1DModel mid block of the Diffuser value function: two ResidualTemporalBlock1D, each followed by a strided Conv1d)",
            inputs: &["x", "temb"],
            kwargs: &[],
            build: from_config!(ValueFunctionMidBlock1D),
        },
        BlockInfo {
            id: UNetMidBlock2DCrossAttn::BLOCK,
            pytorch: "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DCrossAttn (diffusers 0.28 – 0.42.1; UNet2DConditionModel mid block, SD 1.x / 2.x / XL; dual_cross_attention: Versatile Diffusion's DualTransformer2DModel attentions, mix_ratio / condition_lengths / transformer_index_for_condition as optional config keys)",
            inputs: CROSS_ATTN_INPUTS,
            kwargs: &[],
            build: from_config!(UNetMidBlock2DCrossAttn),
        },
        BlockInfo {
            id: UNetMidBlock2DSimpleCrossAttn::BLOCK,
            pytorch: "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DSimpleCrossAttn (diffusers 0.42.1; UNet2DConditionModel mid block of DeepFloyd IF, Kandinsky 2.1 / 2.2, UnCLIP; AttnAddedKVProcessor2_0 / AttnAddedKVProcessor)",
            inputs: CROSS_ATTN_INPUTS,
            kwargs: &[],
            build: from_config!(UNetMidBlock2DSimpleCrossAttn),
        },
        BlockInfo {
            id: ControlNetMidBlock::BLOCK,
            pytorch: "diffusers.models.controlnets.controlnet.ControlNetModel (diffusers 0.42.1) mid_block (UNetMidBlock2DCrossAttn / UNetMidBlock2D) + controlnet_mid_block (1x1 Conv2d), times conditioning_scale, global_pool_conditions; outputs mid_block_res_sample, sample",
            inputs: &["hidden_states", "temb", "encoder_hidden_states", "attention_mask"],
            kwargs: &["conditioning_scale"],
            build: from_config!(ControlNetMidBlock),
        },
        BlockInfo {
            id: ControlNetXSCrossAttnMidBlock2D::BLOCK,
            pytorch: "diffusers.models.controlnets.controlnet_xs.ControlNetXSCrossAttnMidBlock2D (diffusers 0.42.1; UNetControlNetXSModel mid block: base_to_ctrl zero conv concatenated into the control stream, base_midblock and ctrl_midblock (UNetMidBlock2DCrossAttn, the control one with out_channels), ctrl_to_base zero conv added to the base stream times conditioning_scale; outputs h_base, h_ctrl)",
            inputs: &["hidden_states_base", "temb", "encoder_hidden_states", "hidden_states_ctrl", "attention_mask", "encoder_attention_mask"],
            kwargs: &["conditioning_scale", "apply_control"],
            build: from_config!(ControlNetXSCrossAttnMidBlock2D),
        },
        BlockInfo {
            id: UNetMidBlock3DCrossAttn::BLOCK,
            pytorch: "diffusers.models.unets.unet_3d_blocks.UNetMidBlock3DCrossAttn (diffusers 0.42.1; UNet3DConditionModel / I2VGenXLUNet mid block: ResnetBlock2D + TemporalConvLayer, Transformer2DModel + TransformerTemporalModel; attention_mask taken and unused, as in diffusers)",
            inputs: &["hidden_states", "temb", "encoder_hidden_states", "attention_mask"],
            kwargs: &["num_frames"],
            build: from_config!(UNetMidBlock3DCrossAttn),
        },
        BlockInfo {
            id: UNetMidBlockCrossAttnMotion::BLOCK,
            pytorch: "diffusers.models.unets.unet_motion_model.UNetMidBlockCrossAttnMotion (diffusers 0.42.1; UNetMotionModel mid block, AnimateDiff: ResnetBlock2D, Transformer2DModel, AnimateDiffTransformer3D motion modules with a sinusoidal positional embedding over num_frames)",
            inputs: CROSS_ATTN_INPUTS,
            kwargs: &["num_frames"],
            build: from_config!(UNetMidBlockCrossAttnMotion),
        },
        BlockInfo {
            id: UNetMidBlockSpatioTemporal::BLOCK,
            pytorch: "diffusers.models.unets.unet_3d_blocks.UNetMidBlockSpatioTemporal (diffusers 0.42.1; UNetSpatioTemporalConditionModel mid block, Stable Video Diffusion: SpatioTemporalResBlock (ResnetBlock2D + Conv3d (3, 1, 1) TemporalResnetBlock + AlphaBlender), TransformerSpatioTemporalModel; num_frames from image_only_indicator)",
            inputs: &["hidden_states", "temb", "encoder_hidden_states", "image_only_indicator"],
            kwargs: &[],
            build: from_config!(UNetMidBlockSpatioTemporal),
        },
        BlockInfo {
            id: MidBlockTemporalDecoder::BLOCK,
            pytorch: "diffusers.models.unets.unet_3d_blocks.MidBlockTemporalDecoder (diffusers 0.42.1; AutoencoderKLTemporalDecoder decoder mid block, Stable Video Diffusion's VAE: SpatioTemporalResBlock without temb, learned switched AlphaBlender, one VAE-style Attention)",
            inputs: &["hidden_states", "image_only_indicator"],
            kwargs: &[],
            build: from_config!(MidBlockTemporalDecoder),
        },
    ]
}

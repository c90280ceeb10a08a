use super::{entry, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::diffusers::{
    ControlNetMidBlock, ControlNetXSCrossAttnMidBlock2D, JointArgs, MidBlockTemporalDecoder, MidResTemporalBlock1D,
    ResnetBlock2D, UNetMidBlock1D, UNetMidBlock2D, UNetMidBlock2DCrossAttn, UNetMidBlock2DSimpleCrossAttn,
    UNetMidBlock3DCrossAttn, UNetMidBlockCrossAttnMotion, UNetMidBlockSpatioTemporal, ValueFunctionMidBlock1D,
};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        entry::<ResnetBlock2D>(),
        entry::<UNetMidBlock2D>(),
        entry::<UNetMidBlock1D>(),
        entry::<MidResTemporalBlock1D>(),
        entry::<ValueFunctionMidBlock1D>(),
        entry::<UNetMidBlock2DCrossAttn>(),
        entry::<UNetMidBlock2DSimpleCrossAttn>(),
        entry::<ControlNetMidBlock>(),
        entry::<ControlNetXSCrossAttnMidBlock2D>(),
        entry::<UNetMidBlock3DCrossAttn>(),
        entry::<UNetMidBlockCrossAttnMotion>(),
        entry::<UNetMidBlockSpatioTemporal>(),
        entry::<MidBlockTemporalDecoder>(),
    ]
}

/// The inputs of the cross-attention mid blocks, in forward order.
const CROSS_ATTN_INPUTS: &[&str] = &[
    "hidden_states",
    "temb",
    "encoder_hidden_states",
    "attention_mask",
    "encoder_attention_mask",
];

impl Registered for ResnetBlock2D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "diffusers.models.resnet.ResnetBlock2D (diffusers 0.17 – 0.42.1; time_embedding_norm default / scale_shift)";
    const INPUTS: &'static [&'static str] = &["input_tensor", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("input_tensor")?, inputs.get("temb"))?])
    }
}

impl Registered for UNetMidBlock2D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2D (diffusers 0.22 – 0.42.1; UNet2DModel and AutoencoderKL mid blocks)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![
            self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?
        ])
    }
}

impl Registered for UNetMidBlock1D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_1d_blocks.UNetMidBlock1D (diffusers 0.7 – 0.42.1; UNet1DModel mid block, Dance Diffusion: cubic Downsample1d, 6 ResConvBlock + SelfAttention1d, cubic Upsample1d)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![
            self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?
        ])
    }
}

impl Registered for MidResTemporalBlock1D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_1d_blocks.MidResTemporalBlock1D (diffusers 0.8 – 0.42.1; UNet1DModel mid block of the Diffuser trajectory U-Net: ResidualTemporalBlock1D stack, optional Downsample1D / Upsample1D)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![
            self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?
        ])
    }
}

/// `ValueFunctionMidBlock1D.forward(x, temb)`.
impl Registered for ValueFunctionMidBlock1D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_1d_blocks.ValueFunctionMidBlock1D (diffusers 0.8 – 0.42.1; UNet1DModel mid block of the Diffuser value function: two ResidualTemporalBlock1D, each followed by a strided Conv1d)";
    const INPUTS: &'static [&'static str] = &["x", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("temb"))?])
    }
}

impl Registered for UNetMidBlock2DCrossAttn {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DCrossAttn (diffusers 0.28 – 0.42.1; UNet2DConditionModel mid block, SD 1.x / 2.x / XL; dual_cross_attention: Versatile Diffusion's DualTransformer2DModel attentions, mix_ratio / condition_lengths / transformer_index_for_condition as optional config keys)";
    const INPUTS: &'static [&'static str] = CROSS_ATTN_INPUTS;

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

impl Registered for UNetMidBlock2DSimpleCrossAttn {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DSimpleCrossAttn (diffusers 0.42.1; UNet2DConditionModel mid block of DeepFloyd IF, Kandinsky 2.1 / 2.2, UnCLIP; AttnAddedKVProcessor2_0 / AttnAddedKVProcessor)";
    const INPUTS: &'static [&'static str] = CROSS_ATTN_INPUTS;

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

/// `ControlNetModel`'s mid block and `controlnet_mid_block`: outputs `mid_block_res_sample`,
/// then the mid block's `sample`.
impl Registered for ControlNetMidBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.controlnets.controlnet.ControlNetModel (diffusers 0.42.1) mid_block (UNetMidBlock2DCrossAttn / UNetMidBlock2D) + controlnet_mid_block (1x1 Conv2d), times conditioning_scale, global_pool_conditions; outputs mid_block_res_sample, sample";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb", "encoder_hidden_states", "attention_mask"];
    const KWARGS: &'static [&'static str] = &["conditioning_scale"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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
impl Registered for ControlNetXSCrossAttnMidBlock2D {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.controlnets.controlnet_xs.ControlNetXSCrossAttnMidBlock2D (diffusers 0.42.1; UNetControlNetXSModel mid block: base_to_ctrl zero conv concatenated into the control stream, base_midblock and ctrl_midblock (UNetMidBlock2DCrossAttn, the control one with out_channels), ctrl_to_base zero conv added to the base stream times conditioning_scale; outputs h_base, h_ctrl)";
    const INPUTS: &'static [&'static str] = &[
        "hidden_states_base",
        "temb",
        "encoder_hidden_states",
        "hidden_states_ctrl",
        "attention_mask",
        "encoder_attention_mask",
    ];
    const KWARGS: &'static [&'static str] = &["conditioning_scale", "apply_control"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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
impl Registered for UNetMidBlock3DCrossAttn {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_3d_blocks.UNetMidBlock3DCrossAttn (diffusers 0.42.1; UNet3DConditionModel / I2VGenXLUNet mid block: ResnetBlock2D + TemporalConvLayer, Transformer2DModel + TransformerTemporalModel; attention_mask taken and unused, as in diffusers)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb", "encoder_hidden_states", "attention_mask"];
    const KWARGS: &'static [&'static str] = &["num_frames"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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
impl Registered for UNetMidBlockCrossAttnMotion {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_motion_model.UNetMidBlockCrossAttnMotion (diffusers 0.42.1; UNetMotionModel mid block, AnimateDiff: ResnetBlock2D, Transformer2DModel, AnimateDiffTransformer3D motion modules with a sinusoidal positional embedding over num_frames)";
    const INPUTS: &'static [&'static str] = CROSS_ATTN_INPUTS;
    const KWARGS: &'static [&'static str] = &["num_frames"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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
impl Registered for UNetMidBlockSpatioTemporal {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_3d_blocks.UNetMidBlockSpatioTemporal (diffusers 0.42.1; UNetSpatioTemporalConditionModel mid block, Stable Video Diffusion: SpatioTemporalResBlock (ResnetBlock2D + Conv3d (3, 1, 1) TemporalResnetBlock + AlphaBlender), TransformerSpatioTemporalModel; num_frames from image_only_indicator)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "temb", "encoder_hidden_states", "image_only_indicator"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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
impl Registered for MidBlockTemporalDecoder {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_3d_blocks.MidBlockTemporalDecoder (diffusers 0.42.1; AutoencoderKLTemporalDecoder decoder mid block, Stable Video Diffusion's VAE: SpatioTemporalResBlock without temb, learned switched AlphaBlender, one VAE-style Attention)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "image_only_indicator"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(inputs.required("hidden_states")?, inputs.get("image_only_indicator"))?;
        Ok(vec![out])
    }
}

use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::ldm::mid_block::MidBlock;
use unet_attention::ldm::vae::{AttnBlock, LinAttnBlock, SpatialSelfAttention};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        entry::<AttnBlock>(),
        entry::<SpatialSelfAttention>(),
        entry::<LinAttnBlock>(),
        entry::<MidBlock>(),
    ]
}

impl Registered for AttnBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "ldm.modules.diffusionmodules.model.AttnBlock (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, \
                      SD 2.x cf1d67a; SD 1.x/2.x VAE mid.attn_1)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for SpatialSelfAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "ldm.modules.attention.SpatialSelfAttention (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, \
                      SD 2.x cf1d67a)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for LinAttnBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "ldm.modules.diffusionmodules.model.LinAttnBlock = LinearAttention(dim=C, heads=1, dim_head=C) \
                      (CompVis latent-diffusion a506df5 = stable-diffusion 1.x; make_attn(.., \"linear\"))";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for MidBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "ldm.modules.diffusionmodules.model Encoder/Decoder/Model mid: block_1 (ResnetBlock) → attn_1 \
                      (make_attn vanilla / linear / none) → block_2 (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, SD 2.x cf1d67a)";
    const INPUTS: &'static [&'static str] = &["x", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("temb"))?])
    }
}

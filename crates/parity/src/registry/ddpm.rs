use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::ddpm::{Attention, LinearAttention, MidBlock};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<Attention>(), entry::<LinearAttention>(), entry::<MidBlock>()]
}

impl Registered for Attention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "denoising_diffusion_pytorch.Attention (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for LinearAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "denoising_diffusion_pytorch.LinearAttention (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4)";
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
    const PYTORCH: &'static str =
        "denoising_diffusion_pytorch.Unet bottleneck: mid_block1 (ResnetBlock, RMSNorm + FiLM) → mid_attn (+ x) → \
                      mid_block2 (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4; keys of the Unet)";
    const INPUTS: &'static [&'static str] = &["x", "time_emb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("time_emb"))?])
    }
}

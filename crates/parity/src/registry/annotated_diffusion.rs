use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::annotated_diffusion::{Attention, LinearAttention};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<Attention>(), entry::<LinearAttention>()]
}

impl Registered for Attention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "Attention of the Hugging Face Annotated Diffusion blog post (huggingface/blog annotated-diffusion.md @ fd0b656)";
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
    const PYTORCH: &'static str = "LinearAttention of the Hugging Face Annotated Diffusion blog post (huggingface/blog annotated-diffusion.md @ fd0b656)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::fastai::{SelfAttention, SelfAttentionMultiHead};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<SelfAttention>(), entry::<SelfAttentionMultiHead>()]
}

impl Registered for SelfAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "fast.ai course22p2 nbs/27_attention.ipynb SelfAttention (GroupNorm or BatchNorm2d + fused qkv) @ df93232";
    // The GroupNorm class names its input `x`, the BatchNorm2d/fused-qkv class `inp`: one tensor
    // input under either name.
    const INPUTS: &'static [&'static str] = &["x", "inp"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for SelfAttentionMultiHead {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "fast.ai course22p2 nbs/27_attention.ipynb SelfAttentionMultiHead @ df93232";
    const INPUTS: &'static [&'static str] = &["inp"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::ldm::transformer::{BasicTransformerBlock, CrossAttention, SpatialTransformer};
use unet_attention::ldm::LinearAttention;
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        entry::<LinearAttention>(),
        entry::<CrossAttention>(),
        entry::<BasicTransformerBlock>(),
        entry::<SpatialTransformer>(),
    ]
}

impl Registered for LinearAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "ldm.modules.attention.LinearAttention (CompVis latent-diffusion a506df5 = stable-diffusion 1.x)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[4])
    }
}

impl Registered for CrossAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "ldm.modules.attention.CrossAttention (CompVis latent-diffusion a506df5 / SD 1.x; Stability stablediffusion cf1d67a / SD 2.x)";
    const INPUTS: &'static [&'static str] = &["x", "context", "mask"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(
            inputs.required("x")?,
            inputs.get("context"),
            inputs.get("mask"),
        )?])
    }
}

impl Registered for BasicTransformerBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "ldm.modules.attention.BasicTransformerBlock (SD 1.x a506df5; SD 2.x cf1d67a with disable_self_attn)";
    const INPUTS: &'static [&'static str] = &["x", "context"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("context"))?])
    }
}

/// `context` is one tensor, or a list `context.0`, `context.1`, ... with one per transformer
/// block (SD 2.x's `context_dim` per depth).
impl Registered for SpatialTransformer {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "ldm.modules.attention.SpatialTransformer (SD 1.x conv projections a506df5; SD 2.x cf1d67a use_linear, context_dim per depth, disable_self_attn)";
    const INPUTS: &'static [&'static str] = &["x", "context", "context.*"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let x = inputs.required("x")?;
        let list = inputs.list("context");
        if list.is_empty() {
            Ok(vec![self.forward(x, inputs.get("context"))?])
        } else {
            Ok(vec![self.forward_per_block(x, &list)?])
        }
    }
}

use super::{single, BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::ldm::transformer::{BasicTransformerBlock, CrossAttention, SpatialTransformer};
use unet_attention::ldm::LinearAttention;
use unet_attention::Result;

impl Runnable for CrossAttention {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(
            inputs.required("x")?,
            inputs.get("context"),
            inputs.get("mask"),
        )?])
    }
}

impl Runnable for BasicTransformerBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("context"))?])
    }
}

impl Runnable for SpatialTransformer {
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

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: LinearAttention::BLOCK,
            pytorch: "ldm.modules.attention.LinearAttention (CompVis latent-diffusion a506df5 = stable-diffusion 1.x)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(LinearAttention::BLOCK, vb, cfg, &["x"], &[4], LinearAttention::new),
        },
        BlockInfo {
            id: CrossAttention::BLOCK,
            pytorch: "ldm.modules.attention.CrossAttention (CompVis latent-diffusion a506df5 / SD 1.x; Stability stablediffusion cf1d67a / SD 2.x)",
            inputs: &["x", "context", "mask"],
            kwargs: &[],
            build: from_config!(CrossAttention),
        },
        BlockInfo {
            id: BasicTransformerBlock::BLOCK,
            pytorch: "ldm.modules.attention.BasicTransformerBlock (SD 1.x a506df5; SD 2.x cf1d67a with disable_self_attn)",
            inputs: &["x", "context"],
            kwargs: &[],
            build: from_config!(BasicTransformerBlock),
        },
        BlockInfo {
            id: SpatialTransformer::BLOCK,
            pytorch: "ldm.modules.attention.SpatialTransformer (SD 1.x conv projections a506df5; SD 2.x cf1d67a use_linear, context_dim per depth, disable_self_attn)",
            inputs: &["x", "context", "context.*"],
            kwargs: &[],
            build: from_config!(SpatialTransformer),
        },
    ]
}

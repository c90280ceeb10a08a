use super::{BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use unet_attention::openai::{AttentionBlock, AttentionBlockConfig, MiddleBlock};
use unet_attention::Result;

impl Runnable for MiddleBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let (x, emb) = (inputs.required("x")?, inputs.required("emb")?);
        let list = inputs.list("context");
        if list.is_empty() {
            Ok(vec![self.forward(x, emb, inputs.get("context"))?])
        } else {
            Ok(vec![self.forward_per_block(x, emb, &list)?])
        }
    }
}

/// `AttentionBlock` takes `(B, C, *spatial)` of any spatial rank ≥ 1.
struct Block(AttentionBlock);

impl Runnable for Block {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.0.forward_checked(inputs.required("x")?)?])
    }
}

fn build(vb: VarBuilder, config: &serde_json::Value) -> Result<Box<dyn Runnable>> {
    let cfg: AttentionBlockConfig = unet_attention::config::from_json(AttentionBlock::BLOCK, config)?;
    Ok(Box::new(Block(AttentionBlock::new(vb, &cfg)?)))
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
        id: AttentionBlock::BLOCK,
        pytorch:
            "openai AttentionBlock (guided-diffusion 22e0df8 unet.py = ldm openaimodel.py a506df5 / SD 2.x cf1d67a; \
                  QKVAttentionLegacy / QKVAttention; improved-diffusion 1bc7bbb = legacy order)",
        inputs: &["x"],
        kwargs: &[],
        build,
    },
        BlockInfo {
            id: MiddleBlock::BLOCK,
            pytorch: "openai UNetModel.middle_block = TimestepEmbedSequential(ResBlock, AttentionBlock | SpatialTransformer, \
                      ResBlock) (guided-diffusion 22e0df8; ldm openaimodel.py a506df5 / SD 2.x cf1d67a)",
            inputs: &["x", "emb", "context", "context.*"],
            kwargs: &[],
            build: from_config!(MiddleBlock),
        },
    ]
}

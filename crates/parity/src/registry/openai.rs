use super::{entry, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::openai::{AttentionBlock, MiddleBlock};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<AttentionBlock>(), entry::<MiddleBlock>()]
}

/// `AttentionBlock` takes `(B, C, *spatial)` of any spatial rank ≥ 1.
impl Registered for AttentionBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "openai AttentionBlock (guided-diffusion 22e0df8 unet.py = ldm openaimodel.py a506df5 / SD 2.x cf1d67a; \
                  QKVAttentionLegacy / QKVAttention; improved-diffusion 1bc7bbb = legacy order)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward_checked(inputs.required("x")?)?])
    }
}

/// `context` is one tensor, or a list `context.0`, `context.1`, ... with one per transformer
/// block.
impl Registered for MiddleBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "openai UNetModel.middle_block = TimestepEmbedSequential(ResBlock, AttentionBlock | SpatialTransformer, \
                      ResBlock) (guided-diffusion 22e0df8; ldm openaimodel.py a506df5 / SD 2.x cf1d67a)";
    const INPUTS: &'static [&'static str] = &["x", "emb", "context", "context.*"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

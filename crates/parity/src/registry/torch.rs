use super::{entry, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::torch::{MultiheadAttention, MultiheadAttentionArgs};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<MultiheadAttention>()]
}

/// `MultiheadAttention.forward(query, key, value, key_padding_mask, need_weights, attn_mask,
/// average_attn_weights, is_causal)`; a missing `key` is the `query`, a missing `value` the `key`.
/// Outputs the attention output, then the weights when `need_weights`.
impl Registered for MultiheadAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "torch.nn.MultiheadAttention (torch 2.15.0)";
    const INPUTS: &'static [&'static str] = &["query", "key", "value", "key_padding_mask", "attn_mask"];
    const KWARGS: &'static [&'static str] = &["need_weights", "average_attn_weights", "is_causal"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let query = inputs.required("query")?;
        let args = MultiheadAttentionArgs {
            key: inputs.get("key"),
            value: inputs.get("value"),
            key_padding_mask: inputs.get("key_padding_mask"),
            need_weights: inputs.flag("need_weights", true)?,
            attn_mask: inputs.get("attn_mask"),
            average_attn_weights: inputs.flag("average_attn_weights", true)?,
            is_causal: inputs.flag("is_causal", false)?,
        };
        let (out, weights) = self.forward(query, args)?;
        Ok(std::iter::once(out).chain(weights).collect())
    }
}

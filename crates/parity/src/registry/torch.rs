use super::{BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::torch::{MultiheadAttention, MultiheadAttentionArgs, MultiheadAttentionConfig};
use unet_attention::Result;

/// `MultiheadAttention.forward(query, key, value, key_padding_mask, need_weights, attn_mask,
/// average_attn_weights, is_causal)`; a missing `key` is the `query`, a missing `value` the `key`.
struct Mha(MultiheadAttention);

impl Runnable for Mha {
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
        let (out, weights) = self.0.forward(query, args)?;
        Ok(std::iter::once(out).chain(weights).collect())
    }
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![BlockInfo {
        id: MultiheadAttention::BLOCK,
        pytorch: "torch.nn.MultiheadAttention (torch 2.15.0)",
        inputs: &["query", "key", "value", "key_padding_mask", "attn_mask"],
        kwargs: &["need_weights", "average_attn_weights", "is_causal"],
        build: |vb, cfg| {
            let cfg: MultiheadAttentionConfig = unet_attention::config::from_json(MultiheadAttention::BLOCK, cfg)?;
            Ok(Box::new(Mha(MultiheadAttention::new(vb, &cfg)?)))
        },
    }]
}

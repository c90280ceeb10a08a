use super::{BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::diffusers::{Attention, AttentionConfig};
use unet_attention::Result;

/// `Attention.forward(hidden_states, encoder_hidden_states, attention_mask, temb=...)`: `temb`
/// travels through `cross_attention_kwargs` to the processor (the `spatial_norm` zq map).
impl Runnable for Attention {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let hidden_states = inputs.required("hidden_states")?;
        let out = self.forward_with_temb(
            hidden_states,
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
            inputs.get("temb"),
        )?;
        Ok(vec![out])
    }
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![BlockInfo {
        id: Attention::BLOCK,
        pytorch: "diffusers.models.attention_processor.Attention with AttnProcessor2_0 / AttnProcessor / \
                  AttnAddedKVProcessor2_0 / AttnAddedKVProcessor (diffusers 0.42.1)",
        inputs: &["hidden_states", "encoder_hidden_states", "attention_mask", "temb"],
        kwargs: &[],
        build: |vb, cfg| {
            let cfg: AttentionConfig = unet_attention::config::from_json(Attention::BLOCK, cfg)?;
            Ok(Box::new(Attention::new(vb, &cfg)?))
        },
    }]
}

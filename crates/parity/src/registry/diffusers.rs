use super::{BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::diffusers::{Attention, AttentionConfig};
use unet_attention::Result;

impl Runnable for Attention {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let hidden_states = inputs.required("hidden_states")?;
        let out = self.forward(
            hidden_states,
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
        )?;
        Ok(vec![out])
    }
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![BlockInfo {
        id: Attention::BLOCK,
        pytorch: "diffusers.models.attention_processor.Attention with AttnProcessor2_0 / AttnProcessor (diffusers 0.17 – 0.42.1)",
        inputs: &["hidden_states", "encoder_hidden_states", "attention_mask"],
        kwargs: &[],
        build: |vb, cfg| {
            let cfg: AttentionConfig = unet_attention::config::from_json(Attention::BLOCK, cfg)?;
            Ok(Box::new(Attention::new(vb, &cfg)?))
        },
    }]
}

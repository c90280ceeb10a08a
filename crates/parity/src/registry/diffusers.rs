use super::{entry, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::diffusers::Attention;
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<Attention>()]
}

/// `Attention.forward(hidden_states, encoder_hidden_states, attention_mask, temb=...)`: `temb`
/// travels through `cross_attention_kwargs` to the processor (the `spatial_norm` zq map).
impl Registered for Attention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "diffusers.models.attention_processor.Attention with AttnProcessor2_0 / AttnProcessor / \
                  AttnAddedKVProcessor2_0 / AttnAddedKVProcessor (diffusers 0.42.1)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "encoder_hidden_states", "attention_mask", "temb"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

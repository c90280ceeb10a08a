use super::{single, BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::diffusers::feed_forward::{FeedForward, Geglu};
use unet_attention::diffusers::transformer::{BasicTransformerBlock, Transformer2DModel};
use unet_attention::diffusers::DualTransformer2DModel;
use unet_attention::Result;

impl Runnable for BasicTransformerBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("attention_mask"),
            inputs.get("encoder_hidden_states"),
            inputs.get("encoder_attention_mask"),
        )?;
        Ok(vec![out])
    }
}

impl Runnable for Transformer2DModel {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        // `return_dict` only changes the Python return type.
        inputs.flag("return_dict", true)?;
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.get("encoder_hidden_states"),
            inputs.get("attention_mask"),
            inputs.get("encoder_attention_mask"),
        )?;
        Ok(vec![out])
    }
}

impl Runnable for DualTransformer2DModel {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        inputs.flag("return_dict", true)?;
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.required("encoder_hidden_states")?,
            inputs.get("attention_mask"),
        )?;
        Ok(vec![out])
    }
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: FeedForward::BLOCK,
            pytorch: "diffusers.models.attention.FeedForward (diffusers 0.42.1; geglu, gelu, gelu-approximate, geglu-approximate, swiglu, linear-silu)",
            inputs: &["hidden_states"],
            kwargs: &[],
            build: |vb, cfg| single(FeedForward::BLOCK, vb, cfg, &["hidden_states"], &[2, 3, 4], FeedForward::new),
        },
        BlockInfo {
            id: Geglu::BLOCK,
            pytorch: "diffusers.models.activations.GEGLU (diffusers 0.42.1; exact erf GELU on the gate half)",
            inputs: &["hidden_states"],
            kwargs: &[],
            build: |vb, cfg| single(Geglu::BLOCK, vb, cfg, &["hidden_states"], &[2, 3, 4], Geglu::new),
        },
        BlockInfo {
            id: BasicTransformerBlock::BLOCK,
            pytorch: "diffusers.models.attention.BasicTransformerBlock (diffusers 0.42.1, norm_type \"layer_norm\")",
            inputs: &["hidden_states", "attention_mask", "encoder_hidden_states", "encoder_attention_mask"],
            kwargs: &[],
            build: from_config!(BasicTransformerBlock),
        },
        BlockInfo {
            id: Transformer2DModel::BLOCK,
            pytorch: "diffusers.models.transformers.transformer_2d.Transformer2DModel (diffusers 0.42.1, continuous input; conv or linear proj_in/proj_out)",
            inputs: &["hidden_states", "encoder_hidden_states", "attention_mask", "encoder_attention_mask"],
            kwargs: &["return_dict"],
            build: from_config!(Transformer2DModel),
        },
        BlockInfo {
            id: DualTransformer2DModel::BLOCK,
            pytorch: "diffusers.models.transformers.dual_transformer_2d.DualTransformer2DModel (diffusers 0.42.1, continuous input; Versatile Diffusion; mix_ratio / condition_lengths / transformer_index_for_condition as optional config keys; attention_mask ignored as diffusers ignores it)",
            inputs: &["hidden_states", "encoder_hidden_states", "attention_mask"],
            kwargs: &["return_dict"],
            build: from_config!(DualTransformer2DModel),
        },
    ]
}

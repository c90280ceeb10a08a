use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::diffusers::feed_forward::{FeedForward, Geglu};
use unet_attention::diffusers::transformers::transformer::{BasicTransformerBlock, Transformer2DModel};
use unet_attention::diffusers::DualTransformer2DModel;
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        entry::<FeedForward>(),
        entry::<Geglu>(),
        entry::<BasicTransformerBlock>(),
        entry::<Transformer2DModel>(),
        entry::<DualTransformer2DModel>(),
    ]
}

impl Registered for FeedForward {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.attention.FeedForward (diffusers 0.42.1; geglu, gelu, gelu-approximate, geglu-approximate, swiglu, linear-silu)";
    const INPUTS: &'static [&'static str] = &["hidden_states"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[2, 3, 4])
    }
}

impl Registered for Geglu {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "diffusers.models.activations.GEGLU (diffusers 0.42.1; exact erf GELU on the gate half)";
    const INPUTS: &'static [&'static str] = &["hidden_states"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[2, 3, 4])
    }
}

impl Registered for BasicTransformerBlock {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str =
        "diffusers.models.attention.BasicTransformerBlock (diffusers 0.42.1, norm_type \"layer_norm\")";
    const INPUTS: &'static [&'static str] = &[
        "hidden_states",
        "attention_mask",
        "encoder_hidden_states",
        "encoder_attention_mask",
    ];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

impl Registered for Transformer2DModel {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.transformers.transformer_2d.Transformer2DModel (diffusers 0.42.1, continuous input; conv or linear proj_in/proj_out)";
    const INPUTS: &'static [&'static str] = &[
        "hidden_states",
        "encoder_hidden_states",
        "attention_mask",
        "encoder_attention_mask",
    ];
    const KWARGS: &'static [&'static str] = &["return_dict"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

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

impl Registered for DualTransformer2DModel {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.transformers.dual_transformer_2d.DualTransformer2DModel (diffusers 0.42.1, continuous input; Versatile Diffusion; mix_ratio / condition_lengths / transformer_index_for_condition as optional config keys; attention_mask ignored as diffusers ignores it)";
    const INPUTS: &'static [&'static str] = &["hidden_states", "encoder_hidden_states", "attention_mask"];
    const KWARGS: &'static [&'static str] = &["return_dict"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        // `return_dict` only changes the Python return type.
        inputs.flag("return_dict", true)?;
        let out = self.forward(
            inputs.required("hidden_states")?,
            inputs.required("encoder_hidden_states")?,
            inputs.get("attention_mask"),
        )?;
        Ok(vec![out])
    }
}

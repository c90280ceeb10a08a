//! Whole models (`unet_attention::models`), checked end to end on whole-model bundles
//! (`weights/whole/`, written by `scripts/export_whole.py`).

use super::{entry, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::models::{
    AddedCond, AnnotatedUnet, AutoencoderKL, ControlNetArgs, ControlNetModel, ForwardArgs, LdmUNetConfig, LdmVaeConfig,
    LucidrainsUnet, UNet2DConditionModel, UNet2DModel,
};
use unet_attention::{Error, Result};

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        entry::<UNet2DConditionModel>(),
        entry::<UNet2DModel>(),
        entry::<AutoencoderKL>(),
        entry::<LdmUNet>(),
        entry::<LdmAutoencoderKL>(),
        entry::<ControlNetModel>(),
        entry::<ControlNetPair>(),
        entry::<LucidrainsUnet>(),
        entry::<AnnotatedUnet>(),
    ]
}

/// The U-Nets' `timestep`: a number in `parity.kwargs`, required.
fn timestep(inputs: &Inputs, block: &'static str) -> Result<f64> {
    if !inputs.kwargs.contains_key("timestep") {
        return Err(Error::input(block, "timestep", "required (parity.kwargs)"));
    }
    inputs.number("timestep", 0.0)
}

/// SDXL's added conditions (`added_cond_kwargs`), both or neither.
fn added_cond<'a>(inputs: &'a Inputs, block: &'static str) -> Result<Option<AddedCond<'a>>> {
    match (inputs.get("text_embeds"), inputs.get("time_ids")) {
        (Some(text_embeds), Some(time_ids)) => Ok(Some(AddedCond { text_embeds, time_ids })),
        (None, None) => Ok(None),
        _ => Err(Error::input(
            block,
            "added_cond_kwargs",
            "text_embeds and time_ids go together",
        )),
    }
}

/// `UNet2DConditionModel.forward(sample, timestep, encoder_hidden_states, added_cond_kwargs=
/// {"text_embeds", "time_ids"})`, the timestep a number (`parity.kwargs`).
impl Registered for UNet2DConditionModel {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_2d_condition.UNet2DConditionModel (diffusers 0.42.1; SD 1.x / 2.x / XL: CrossAttnDownBlock2D, DownBlock2D, UNetMidBlock2DCrossAttn, CrossAttnUpBlock2D, UpBlock2D, addition_embed_type text_time; added_cond_kwargs text_embeds / time_ids as inputs)";
    const INPUTS: &'static [&'static str] = &[
        "sample",
        "encoder_hidden_states",
        "text_embeds",
        "time_ids",
        "attention_mask",
        "encoder_attention_mask",
    ];
    const KWARGS: &'static [&'static str] = &["timestep"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let timestep = timestep(inputs, Self::BLOCK)?;
        let args = ForwardArgs {
            added_cond: added_cond(inputs, Self::BLOCK)?,
            attention_mask: inputs.get("attention_mask"),
            encoder_attention_mask: inputs.get("encoder_attention_mask"),
            controlnet: None,
        };
        let out = self.forward_with(
            inputs.required("sample")?,
            timestep,
            inputs.required("encoder_hidden_states")?,
            args,
        )?;
        Ok(vec![out])
    }
}

/// `UNet2DModel.forward(sample, timestep)`, the timestep a number (`parity.kwargs`).
impl Registered for UNet2DModel {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.unets.unet_2d.UNet2DModel (diffusers 0.42.1; DDPM / LDM unconditional U-Net: DownBlock2D, AttnDownBlock2D, UNetMidBlock2D, AttnUpBlock2D, UpBlock2D; positional time embedding, the timestep truncated to an integer)";
    const INPUTS: &'static [&'static str] = &["sample"];
    const KWARGS: &'static [&'static str] = &["timestep"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let timestep = timestep(inputs, Self::BLOCK)?;
        Ok(vec![self.forward(inputs.required("sample")?, timestep)?])
    }
}

/// `AutoencoderKL.forward(sample, sample_posterior=False)`: `decode(encode(sample).mode())`.
impl Registered for AutoencoderKL {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL (diffusers 0.42.1; DownEncoderBlock2D, UpDecoderBlock2D; forward with sample_posterior=False: decode(encode(sample).latent_dist.mode()))";
    const INPUTS: &'static [&'static str] = &["sample"];
    const KWARGS: &'static [&'static str] = &[];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("sample")?)?])
    }
}

/// ldm's `UNetModel` (SD 1.x / 2.x), weights under its own names (a single file's
/// `model.diffusion_model.*`): our `UNet2DConditionModel` built through the single-file key map,
/// the config the original one (`unet_config.params`).
pub struct LdmUNet(UNet2DConditionModel, LdmUNetConfig);

/// `UNetModel.forward(x, timesteps, context)` with `timesteps = full((batch,), timestep)`; for
/// SDXL (sgm's `UNetModel`, whose `y` its conditioner makes from the pooled text embedding and the
/// size / crop conditions) the conditions as diffusers takes them, `text_embeds` and `time_ids`.
impl Registered for LdmUNet {
    const ID: &'static str = "ldm.UNetModel";
    const PYTORCH: &'static str = "ldm.modules.diffusionmodules.openaimodel.UNetModel (stable-diffusion-sdkit 2.1.5 = Stability stablediffusion cf1d67a; SD 1.x / 2.x single-file checkpoints, model.diffusion_model.*) and sgm's UNetModel (SDXL single files: num_classes sequential, label_emb; conditions as text_embeds / time_ids); run as diffusers' UNet2DConditionModel through from_single_file's key map";
    const INPUTS: &'static [&'static str] = &["x", "context", "text_embeds", "time_ids"];
    const KWARGS: &'static [&'static str] = &["timestep"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        let config: LdmUNetConfig = read.config(Self::ID, config)?;
        Ok(Self(UNet2DConditionModel::from_ldm(vb, &config)?, config))
    }

    /// Stages recorded under ldm's module paths (`input_blocks.1.0/in_layers.0`), as the bundle's.
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let timestep = timestep(inputs, Self::ID)?;
        let cfg = self.1.clone();
        let out = unet_attention::trace::renaming(
            move |stage| unet_attention::models::single_file::unet_stage(stage, &cfg),
            || {
                let args = ForwardArgs {
                    added_cond: added_cond(inputs, Self::ID)?,
                    ..ForwardArgs::default()
                };
                self.0
                    .forward_with(inputs.required("x")?, timestep, inputs.required("context")?, args)
            },
        )?;
        Ok(vec![out])
    }
}

/// ldm's `AutoencoderKL` (SD 1.x / 2.x first stage), weights under its own names (a single file's
/// `first_stage_model.*`).
pub struct LdmAutoencoderKL(AutoencoderKL, LdmVaeConfig);

/// `AutoencoderKL.forward(input, sample_posterior=False)[0]`: `decode(encode(input).mode())`.
impl Registered for LdmAutoencoderKL {
    const ID: &'static str = "ldm.AutoencoderKL";
    const PYTORCH: &'static str = "ldm.models.autoencoder.AutoencoderKL (stable-diffusion-sdkit 2.1.5; SD 1.x / 2.x single-file checkpoints, first_stage_model.*; config {ddconfig, embed_dim, scale_factor}; run as diffusers' AutoencoderKL through from_single_file's key map)";
    const INPUTS: &'static [&'static str] = &["sample"];
    const KWARGS: &'static [&'static str] = &[];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        let config: LdmVaeConfig = read.config(Self::ID, config)?;
        Ok(Self(AutoencoderKL::from_ldm(vb, &config)?, config))
    }

    /// Stages recorded under ldm's module paths (`encoder.down.0.block.0/norm1`), as the bundle's.
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let cfg = self.1.clone();
        let out = unet_attention::trace::renaming(
            move |stage| unet_attention::models::single_file::vae_stage(stage, &cfg),
            || self.0.forward(inputs.required("sample")?),
        )?;
        Ok(vec![out])
    }
}

/// `ControlNetModel.forward(sample, timestep, encoder_hidden_states, controlnet_cond,
/// conditioning_scale)`: the down residuals (`down_0`, ...) then `mid`.
impl Registered for ControlNetModel {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "diffusers.models.controlnets.controlnet.ControlNetModel (diffusers 0.42.1; SD 1.x / 2.x ControlNets: controlnet_cond_embedding, the U-Net's down blocks and UNetMidBlock2DCrossAttn, zero convolutions; conditioning_scale, guess_mode, rgb / bgr, global_pool_conditions; SDXL ControlNets' text_time with text_embeds / time_ids)";
    const INPUTS: &'static [&'static str] = &[
        "sample",
        "encoder_hidden_states",
        "controlnet_cond",
        "text_embeds",
        "time_ids",
    ];
    const KWARGS: &'static [&'static str] = &["timestep", "conditioning_scale", "guess_mode"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let timestep = timestep(inputs, Self::BLOCK)?;
        let args = ControlNetArgs {
            conditioning_scale: inputs.number("conditioning_scale", 1.0)?,
            guess_mode: inputs.flag("guess_mode", false)?,
            added_cond: added_cond(inputs, Self::BLOCK)?,
        };
        let out = self.forward_with(
            inputs.required("sample")?,
            timestep,
            inputs.required("encoder_hidden_states")?,
            inputs.required("controlnet_cond")?,
            args,
        )?;
        Ok(out.down.into_iter().chain(std::iter::once(out.mid)).collect())
    }
}

/// A ControlNet and the U-Net it drives (`StableDiffusionControlNetPipeline`'s two calls per
/// step), weights under `controlnet.` and `unet.`, config `{"controlnet": ..., "unet": ...}`.
pub struct ControlNetPair {
    controlnet: ControlNetModel,
    unet: UNet2DConditionModel,
}

/// `unet(sample, t, ehs, down_block_additional_residuals=down, mid_block_additional_residual=mid)`
/// with `down, mid = controlnet(sample, t, ehs, controlnet_cond, conditioning_scale)`.
impl Registered for ControlNetPair {
    const ID: &'static str = "diffusers.ControlNetPair";
    const PYTORCH: &'static str = "diffusers 0.42.1 ControlNetModel.forward, then UNet2DConditionModel.forward with its residuals (down_block_additional_residuals, mid_block_additional_residual): one step of StableDiffusionControlNetPipeline";
    const INPUTS: &'static [&'static str] = &["sample", "encoder_hidden_states", "controlnet_cond"];
    const KWARGS: &'static [&'static str] = &["timestep", "conditioning_scale"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        let part = |key: &str| {
            config
                .get(key)
                .ok_or_else(|| Error::config(Self::ID, format!("the config needs `{key}` (that model's config)")))
        };
        Ok(Self {
            controlnet: ControlNetModel::new(vb.pp("controlnet"), &read.config(Self::ID, part("controlnet")?)?)?,
            unet: UNet2DConditionModel::new(vb.pp("unet"), &read.config(Self::ID, part("unet")?)?)?,
        })
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let timestep = timestep(inputs, Self::ID)?;
        let (sample, context) = (inputs.required("sample")?, inputs.required("encoder_hidden_states")?);
        let control = unet_attention::trace::scope("controlnet", || {
            self.controlnet.forward(
                sample,
                timestep,
                context,
                inputs.required("controlnet_cond")?,
                inputs.number("conditioning_scale", 1.0)?,
            )
        })?;
        let args = ForwardArgs {
            controlnet: Some(control.residuals()),
            ..ForwardArgs::default()
        };
        let out = unet_attention::trace::scope("unet", || self.unet.forward_with(sample, timestep, context, args))?;
        Ok(vec![out])
    }
}

/// A DDPM `Unet`'s `x`, `time` and optional `x_self_cond` (lucidrains', the Annotated Diffusion post's).
fn ddpm_inputs(inputs: &Inputs) -> Result<(&Tensor, &Tensor, Option<&Tensor>)> {
    Ok((
        inputs.required("x")?,
        inputs.required("time")?,
        inputs.get("x_self_cond"),
    ))
}

/// lucidrains' `Unet.forward(x, time, x_self_cond=None)`, `time` a `(B,)` tensor.
impl Registered for LucidrainsUnet {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "denoising_diffusion_pytorch.denoising_diffusion_pytorch.Unet (denoising-diffusion-pytorch 2.0.0 – 2.3.4; dim_mults, attn_heads / attn_dim_head per stage, full_attn, flash_attn, self_condition, learned / random Fourier time features, learned_variance; Trainer.save checkpoints: prefix model. in `model`, ema_model.model. in `ema`)";
    const INPUTS: &'static [&'static str] = &["x", "time", "x_self_cond"];
    const KWARGS: &'static [&'static str] = &[];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let (x, time, x_self_cond) = ddpm_inputs(inputs)?;
        Ok(vec![self.forward(x, time, x_self_cond)?])
    }
}

/// The Annotated Diffusion post's `Unet.forward(x, time, x_self_cond=None)`, `time` a `(B,)` tensor.
impl Registered for AnnotatedUnet {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "the Hugging Face blog post \"The Annotated Diffusion Model\" (huggingface/blog annotated-diffusion.md at fd0b6566b04f), its Unet (dim, init_dim, out_dim, dim_mults, channels, self_condition, resnet_block_groups; WeightStandardizedConv2d as published, PreNorm GroupNorm(1, dim), LinearAttention per stage, Attention in the middle)";
    const INPUTS: &'static [&'static str] = &["x", "time", "x_self_cond"];
    const KWARGS: &'static [&'static str] = &[];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let (x, time, x_self_cond) = ddpm_inputs(inputs)?;
        Ok(vec![self.forward(x, time, x_self_cond)?])
    }
}

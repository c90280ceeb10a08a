//! Checking *your* Candle port with `unet_parity::port`: candle-transformers 0.11.1's Stable
//! Diffusion parts (its public `ResnetBlock2D`, `SpatialTransformer`, `AttentionBlock`), put
//! together the way its `UNetMidBlock2DCrossAttn` / `UNetMidBlock2D` put them together, checked
//! against diffusers on two committed bundles: the mid blocks of the tiny SD-1.5-layout
//! `UNet2DConditionModel` and of the `AutoencoderKL` decoder in `weights/models/`, exported with
//! module-path stages (`scripts/export_own.py --trace modules`), so each part's output is a stage.
//!
//! ```sh
//! cargo run --example check_your_port --features candle-transformers
//! ```
//!
//! It prints PASS/FAIL per output, the stage table and the first divergent stage:
//! `attentions.0` in both (the U-Net's GEGLU uses the tanh GELU where diffusers uses erf; the
//! VAE attention mixes the batch entries of a transposed view on the CPU). README.md ("Check your
//! own port") walks through it.

use anyhow::Result;
use candle_transformers::models::stable_diffusion::{attention::*, resnet::*};
use unet_parity::port::{record, PortCheck};

fn main() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/own/modules");

    // The U-Net's mid block: 16 channels, 4 groups, eps 1e-5, 2 heads of 8, a 24-wide context.
    let check = PortCheck::open(root.join("diffusers_sd1_mid_block.safetensors"))?;
    let vb = check.var_builder()?;
    let res = ResnetBlock2DConfig {
        temb_channels: Some(32),
        groups: 4,
        eps: 1e-5,
        ..Default::default()
    };
    let attn = SpatialTransformerConfig {
        num_groups: 4,
        context_dim: Some(24),
        ..Default::default()
    };
    let resnet0 = ResnetBlock2D::new(vb.pp("resnets.0"), 16, res)?;
    let transformer = SpatialTransformer::new(vb.pp("attentions.0"), 16, 2, 8, false, attn)?;
    let resnet1 = ResnetBlock2D::new(vb.pp("resnets.1"), 16, res)?;
    let report = check.run(|inputs| {
        let (temb, context) = (inputs.get("temb")?, inputs.get("encoder_hidden_states")?);
        let h = resnet0.forward(inputs.get("hidden_states")?, Some(temb))?;
        record("resnets.0", &h);
        let h = transformer.forward(&h, Some(context))?;
        record("attentions.0", &h);
        anyhow::Ok(resnet1.forward(&h, Some(temb))?)
    })?;
    println!("{report}");

    // The VAE decoder's mid block: no time embedding, eps 1e-6, one head over the 16 channels.
    let check = PortCheck::open(root.join("diffusers_vae_decoder_mid_block.safetensors"))?;
    let vb = check.var_builder()?;
    let res = ResnetBlock2DConfig {
        temb_channels: None,
        groups: 4,
        eps: 1e-6,
        ..Default::default()
    };
    let attn = AttentionBlockConfig {
        num_head_channels: Some(16),
        num_groups: 4,
        eps: 1e-6,
        rescale_output_factor: 1.0,
    };
    let resnet0 = ResnetBlock2D::new(vb.pp("resnets.0"), 16, res)?;
    let attention = AttentionBlock::new(vb.pp("attentions.0"), 16, attn)?;
    let resnet1 = ResnetBlock2D::new(vb.pp("resnets.1"), 16, res)?;
    let report = check.run(|inputs| {
        let h = resnet0.forward(inputs.get("hidden_states")?, None)?;
        record("resnets.0", &h);
        let h = candle_core::Module::forward(&attention, &h)?;
        record("attentions.0", &h);
        anyhow::Ok(resnet1.forward(&h, None)?)
    })?;
    println!("{report}");
    Ok(())
}

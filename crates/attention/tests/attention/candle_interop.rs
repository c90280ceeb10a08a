//! The blocks inside Candle code, as a user writes it: functions returning `candle_core::Result`
//! load a mid block from a whole diffusers checkpoint (`vb.pp("mid_block")`), with a config made
//! from the PyTorch constructor's required arguments, and run it, with `?` alone (no error
//! conversion of their own). The outputs are held against PyTorch's (the committed reference
//! bundles of those checkpoints' mid blocks), so the test fails if a default or a weight name is
//! wrong.

use crate::common::weights;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use unet_attention::diffusers::{
    UNetMidBlock2D, UNetMidBlock2DConfig, UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig,
};

/// The whole checkpoint of `model`, as a Candle user maps it.
fn checkpoint(model: &str) -> candle_core::Result<VarBuilder<'static>> {
    let file = weights(&format!("models/{model}/diffusion_pytorch_model.safetensors"));
    // SAFETY: the committed file is not modified while mapped.
    unsafe { VarBuilder::from_mmaped_safetensors(&[file], DType::F32, &Device::Cpu) }
}

/// Max |ours − PyTorch's f32 output| and PyTorch's own f32 error against its float64 run.
fn errors(ours: &Tensor, reference: &std::collections::HashMap<String, Tensor>) -> candle_core::Result<(f32, f32)> {
    let torch = &reference["parity.output.output"];
    let f64_out = reference["parity.output.output.float64"].to_dtype(DType::F32)?;
    let max = |t: Tensor| -> candle_core::Result<f32> { t.abs()?.flatten_all()?.max(0)?.to_scalar() };
    Ok((max((ours - torch)?)?, max((torch - &f64_out)?)?))
}

/// diffusers' `UNet2DModel` mid block (16 channels, heads of 8, 4 groups, eps 1e-5).
fn unet2d_mid() -> candle_core::Result<(Tensor, (f32, f32))> {
    let vb = checkpoint("diffusers_unet2d")?;
    let mut cfg = UNetMidBlock2DConfig::new(16, Some(32));
    (cfg.attention_head_dim, cfg.resnet_groups, cfg.resnet_eps) = (Some(8), Some(4), 1e-5);
    let block = UNetMidBlock2D::new(vb.pp("mid_block"), &cfg)?;
    let r = candle_core::safetensors::load(weights("mid/unet_mid_block_2d_unet2d_ref.safetensors"), &Device::Cpu)?;
    let y = block.forward(&r["parity.input.hidden_states"], Some(&r["parity.input.temb"]))?;
    let err = errors(&y, &r)?;
    Ok((y, err))
}

/// An SD-1.5-layout `UNet2DConditionModel`'s mid block (2 heads, 24-wide context).
fn sd1_mid() -> candle_core::Result<(Tensor, (f32, f32))> {
    let vb = checkpoint("diffusers_sd1")?;
    let mut cfg = UNetMidBlock2DCrossAttnConfig::new(16, Some(32));
    (cfg.num_attention_heads, cfg.cross_attention_dim) = (2, 24);
    (cfg.resnet_groups, cfg.resnet_eps) = (Some(4), 1e-5);
    let block = UNetMidBlock2DCrossAttn::new(vb.pp("mid_block"), &cfg)?;
    let path = weights("mid/unet_mid_block_2d_cross_attn_sd1_ref.safetensors");
    let r = candle_core::safetensors::load(path, &Device::Cpu)?;
    let (x, temb, context) = (
        &r["parity.input.hidden_states"],
        &r["parity.input.temb"],
        &r["parity.input.encoder_hidden_states"],
    );
    let y = block.forward(x, Some(temb), Some(context), None, None)?;
    let err = errors(&y, &r)?;
    Ok((y, err))
}

/// A bad input comes back through `?` as a Candle error that still names the block (the first
/// resnet) and what it found.
fn run_with_bad_input() -> candle_core::Result<Tensor> {
    let vb = checkpoint("diffusers_unet2d")?;
    let mut cfg = UNetMidBlock2DConfig::new(16, Some(32));
    (cfg.attention_head_dim, cfg.resnet_groups) = (Some(8), Some(4));
    let block = UNetMidBlock2D::new(vb.pp("mid_block"), &cfg)?;
    let x = Tensor::zeros((1, 15, 8, 8), DType::F32, &Device::Cpu)?;
    Ok(block.forward(&x, None)?)
}

#[test]
fn mid_blocks_run_in_candle_code_with_question_marks() {
    for (name, run) in [
        ("UNetMidBlock2D", unet2d_mid as fn() -> _),
        ("UNetMidBlock2DCrossAttn", sd1_mid),
    ] {
        let (y, (ours, torch_f32)) = run().unwrap();
        assert_eq!((y.rank(), y.dim(1).unwrap()), (4, 16), "{name}");
        // Within 2× PyTorch's own f32 error, or 1e-5 (the parity rule's f32 tolerance).
        assert!(
            ours <= (2.0 * torch_f32).max(1e-5),
            "{name}: {ours} vs PyTorch's own {torch_f32}"
        );
    }
    let err = run_with_bad_input().unwrap_err().to_string();
    assert!(err.contains("ResnetBlock2D") && err.contains("[1, 15, 8, 8]"), "{err}");
}

#[test]
fn configs_from_required_arguments_take_the_pytorch_defaults() {
    let vae = UNetMidBlock2DConfig::new(512, None);
    assert_eq!((vae.num_layers, vae.resnet_groups, vae.resnet_eps), (1, Some(32), 1e-6));
    assert_eq!((vae.attention_head_dim, vae.output_scale_factor), (Some(1), 1.0));
    let sd = UNetMidBlock2DCrossAttnConfig::new(1280, Some(1280));
    assert_eq!((sd.cross_attention_dim, sd.num_attention_heads), (1280, 1));
    assert_eq!((sd.resnet_groups, sd.use_linear_projection), (Some(32), false));
}

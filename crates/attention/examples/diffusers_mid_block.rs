//! Build a diffusers U-Net / VAE mid block from a model folder (`config.json` +
//! `diffusion_pytorch_model.safetensors`) and run it.
//!
//! ```sh
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_sd1
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_if
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_controlnet
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_unet3d
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_svd
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_svd_vae
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_i2vgen_xl
//! cargo run --release -p unet-attention --example diffusers_mid_block -- weights/models/diffusers_unet_motion
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use unet_attention::diffusers::model_config::mid_blocks;
use unet_attention::diffusers::model_config::MidBlockSpec;
use unet_attention::diffusers::{
    ControlNetMidBlock, MidBlockTemporalDecoder, UNetMidBlock2D, UNetMidBlock2DCrossAttn,
    UNetMidBlock2DSimpleCrossAttn, UNetMidBlock3DCrossAttn, UNetMidBlockCrossAttnMotion, UNetMidBlockSpatioTemporal,
};

/// Stable Video Diffusion's mid blocks on one video of 4 frames: `(frames, C, H, W)`, temb and
/// context repeated per frame as the U-Net repeats them, `image_only_indicator` zeros as the
/// pipelines pass it. `None` for other blocks.
fn svd(
    spec: &MidBlockSpec,
    vb: VarBuilder,
    x: &Tensor,
    temb: Option<&Tensor>,
    context: &Tensor,
) -> anyhow::Result<Option<Tensor>> {
    let frames = 4;
    let (x, ioi) = (
        x.repeat((frames, 1, 1, 1))?,
        Tensor::zeros((1, frames), DType::F32, x.device())?,
    );
    if spec.block == UNetMidBlockSpatioTemporal::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        let temb = temb.map(|t| t.repeat((frames, 1))).transpose()?;
        let context = context.repeat((frames, 1, 1))?;
        let mid = UNetMidBlockSpatioTemporal::new(vb, &cfg)?;
        return Ok(Some(mid.forward(&x, temb.as_ref(), Some(&context), Some(&ioi))?));
    }
    if spec.block == MidBlockTemporalDecoder::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        return Ok(Some(MidBlockTemporalDecoder::new(vb, &cfg)?.forward(&x, Some(&ioi))?));
    }
    Ok(None)
}

/// UNet3DConditionModel's / I2VGenXL's and AnimateDiff's mid blocks on one video of 4 frames:
/// `(batch·frames, C, H, W)`, temb and context repeated per frame as those U-Nets (and
/// AnimateDiff's pipeline) repeat them. The input and output; `None` for other blocks.
fn video(
    spec: &MidBlockSpec,
    vb: VarBuilder,
    x: &Tensor,
    temb: Option<&Tensor>,
    context: &Tensor,
) -> anyhow::Result<Option<(Tensor, Tensor)>> {
    if ![UNetMidBlock3DCrossAttn::BLOCK, UNetMidBlockCrossAttnMotion::BLOCK].contains(&spec.block) {
        return Ok(None);
    }
    let frames = 4;
    let x = x.repeat((frames, 1, 1, 1))?;
    let temb = temb.map(|t| t.repeat((frames, 1))).transpose()?;
    let context = context.repeat((frames, 1, 1))?;
    let y = if spec.block == UNetMidBlock3DCrossAttn::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        UNetMidBlock3DCrossAttn::new(vb, &cfg)?.forward(&x, temb.as_ref(), Some(&context), None, frames)?
    } else {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        UNetMidBlockCrossAttnMotion::new(vb, &cfg)?.forward(&x, temb.as_ref(), Some(&context), None, None, frames)?
    };
    Ok(Some((x, y)))
}

/// The image mid blocks (ControlNet's, the cross-attention ones, the plain one) on `x`.
fn image(
    spec: &MidBlockSpec,
    vb: VarBuilder,
    x: &Tensor,
    temb: Option<&Tensor>,
    context: &Tensor,
) -> anyhow::Result<Tensor> {
    Ok(if spec.block == ControlNetMidBlock::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        // (mid_block_res_sample, sample); the residual at conditioning_scale 1.0
        ControlNetMidBlock::new(vb, &cfg)?
            .forward(x, temb, Some(context), None, 1.0)?
            .0
    } else if spec.block == UNetMidBlock2DCrossAttn::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        UNetMidBlock2DCrossAttn::new(vb, &cfg)?.forward(x, temb, Some(context), None, None)?
    } else if spec.block == UNetMidBlock2DSimpleCrossAttn::BLOCK {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        UNetMidBlock2DSimpleCrossAttn::new(vb, &cfg)?.forward(x, temb, Some(context), None, None)?
    } else {
        let cfg = unet_attention::config::from_json(spec.block, &spec.config)?;
        UNetMidBlock2D::new(vb, &cfg)?.forward(x, temb)?
    })
}

/// Random inputs for the mid block of kwargs `mid`: `x` `(1, C, 8, 8)`, temb where the block
/// takes one, and a 77-token context as the block sees it (IF / Kandinsky: after
/// `encoder_hid_proj`).
fn inputs(mid: &serde_json::Value, dev: &Device) -> anyhow::Result<(Tensor, Option<Tensor>, Tensor)> {
    let c = mid["in_channels"].as_u64().unwrap_or(0) as usize;
    let x = Tensor::randn(0f32, 1.0, (1, c, 8, 8), dev)?;
    let temb = match mid["temb_channels"].as_u64() {
        Some(t) => Some(Tensor::randn(0f32, 1.0, (1, t as usize), dev)?),
        None => None,
    };
    let context_dim = mid["cross_attention_dim"].as_u64().unwrap_or(0) as usize;
    let context = Tensor::randn(0f32, 1.0, (1, 77, context_dim), dev)?;
    Ok((x, temb, context))
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "weights/models/diffusers_sd1".into());
    let dir = std::path::Path::new(&dir);
    let dev = Device::Cpu;
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    // SAFETY: the file is not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("diffusion_pytorch_model.safetensors")], DType::F32, &dev)?
    };
    // The model's own config.json says how the mid block is built (one for a U-Net, two for a VAE;
    // a ControlNet's whole bottleneck at the top level, then its mid block alone).
    for spec in mid_blocks(&config, None, false)? {
        // ControlNetMidBlock's kwargs hold the mid block's under `mid_block`.
        let (x, temb, context) = inputs(spec.config.get("mid_block").unwrap_or(&spec.config), &dev)?;
        // (`pp("")` would put a dot before every key: the top level is `vb` itself.)
        let vb = if spec.prefix.is_empty() {
            vb.clone()
        } else {
            vb.pp(spec.prefix)
        };
        let (block, at) = (spec.block, spec.prefix);
        if let Some(y) = svd(&spec, vb.clone(), &x, temb.as_ref(), &context)? {
            println!("{block} at `{at}`: {:?} -> {:?} (4 frames)", x.dims(), y.dims());
        } else if let Some((x, y)) = video(&spec, vb.clone(), &x, temb.as_ref(), &context)? {
            println!("{block} at `{at}`: {:?} -> {:?}", x.dims(), y.dims());
        } else {
            let y = image(&spec, vb, &x, temb.as_ref(), &context)?;
            println!("{block} at `{at}`: {:?} -> {:?}", x.dims(), y.dims());
        }
    }
    Ok(())
}

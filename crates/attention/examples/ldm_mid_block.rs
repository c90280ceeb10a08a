//! Build the first-stage VAE decoder mid block of a Stable Diffusion `.ckpt` and run it.
//!
//! ```sh
//! cargo run --release -p unet-attention --example ldm_mid_block -- weights/models/sd_v1_tiny/sd_v1_tiny.ckpt
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use unet_attention::ldm::mid_block::{AttnType, MidBlock, MidBlockConfig};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "weights/models/sd_v1_tiny/sd_v1_tiny.ckpt".into());
    let dev = Device::Cpu;
    // SD checkpoints keep the weights in their `state_dict` entry.
    let vb =
        VarBuilder::from_pth_with_state(&path, DType::F32, "state_dict", &dev)?.pp("first_stage_model.decoder.mid");
    let in_channels = vb.get_unchecked("block_1.conv1.weight")?.dim(1)?;
    let cfg = MidBlockConfig {
        in_channels,
        temb_channels: 0, // the VAE has no time embedding
        dropout: 0.0,
        attn_type: AttnType::Vanilla,
    };
    let mid = MidBlock::new(vb, &cfg)?;
    let x = Tensor::randn(0f32, 1.0, (1, in_channels, 8, 8), &dev)?;
    let y = mid.forward(&x, None)?;
    println!("{}: {:?} -> {:?}", MidBlock::BLOCK, x.dims(), y.dims());
    Ok(())
}

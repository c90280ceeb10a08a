//! Build a guided-diffusion `middle_block` (ResBlock → AttentionBlock → ResBlock) from a bare
//! state dict and run it.
//!
//! ```sh
//! cargo run --release -p unet-attention --example openai_middle_block -- weights/models/guided_tiny/guided_tiny.pt
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use unet_attention::openai::{MiddleBlock, MiddleBlockConfig};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "weights/models/guided_tiny/guided_tiny.pt".into());
    let dev = Device::Cpu;
    let vb = VarBuilder::from_pth(&path, DType::F32, &dev)?.pp("middle_block");
    let channels = vb.get_unchecked("0.in_layers.0.weight")?.dim(0)?;
    let emb = vb.get_unchecked("0.emb_layers.1.weight")?;
    let (emb_out, emb_channels) = emb.dims2()?;
    // What the keys cannot tell comes from the model's flags (guided-diffusion: num_heads 4,
    // legacy qkv order); `use_scale_shift_norm` doubles emb_layers' output.
    let cfg: MiddleBlockConfig = unet_attention::config::from_json(
        MiddleBlock::BLOCK,
        &serde_json::json!({
            "channels": channels,
            "emb_channels": emb_channels,
            "use_scale_shift_norm": emb_out == 2 * channels,
            "num_heads": 4,
        }),
    )?;
    let mid = MiddleBlock::new(vb, &cfg)?;
    let x = Tensor::randn(0f32, 1.0, (1, channels, 8, 8), &dev)?;
    let t = Tensor::randn(0f32, 1.0, (1, emb_channels), &dev)?; // time_embed(timestep_embedding(t))
    let y = mid.forward(&x, &t, None)?;
    println!("{}: {:?} -> {:?}", MiddleBlock::BLOCK, x.dims(), y.dims());
    Ok(())
}

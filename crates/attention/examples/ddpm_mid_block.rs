//! Build lucidrains' `Unet` bottleneck from a `Trainer.save` checkpoint (`model-N.pt`), EMA
//! weights, and run it.
//!
//! ```sh
//! cargo run --release -p unet-attention --example ddpm_mid_block -- weights/models/lucidrains_ddpm/model-1.pt
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use unet_attention::ddpm::{MidBlock, MidBlockConfig};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "weights/models/lucidrains_ddpm/model-1.pt".into());
    let dev = Device::Cpu;
    // `Trainer.save` writes {'model': ..., 'ema': ..., 'version': ...}; the EMA's Unet is under
    // `ema_model.model.` (the online one: entry "model", prefix "model.").
    let vb = VarBuilder::from_pth_with_state(&path, DType::F32, "ema", &dev)?.pp("ema_model.model");
    // Heads, head width and memory key/values are in `mem_kv`'s shape (2, heads, num_mem_kv, dim_head).
    let mem_kv = vb.get_unchecked("mid_attn.mem_kv")?;
    let (_, heads, num_mem_kv, dim_head) = mem_kv.dims4()?;
    let dim = vb.get_unchecked("mid_block1.block1.proj.weight")?.dim(0)?;
    let time_emb_dim = vb.get_unchecked("mid_block1.mlp.1.weight")?.dim(1)?;
    let cfg = MidBlockConfig {
        dim,
        time_emb_dim: Some(time_emb_dim),
        heads,
        dim_head,
        num_mem_kv,
        dropout: 0.0,
        flash: false,
    };
    let mid = MidBlock::new(vb, &cfg)?;
    let x = Tensor::randn(0f32, 1.0, (2, dim, 8, 8), &dev)?;
    let t = Tensor::randn(0f32, 1.0, (2, time_emb_dim), &dev)?; // Unet.time_mlp(time)
    let y = mid.forward(&x, Some(&t))?;
    println!(
        "{} ({heads} heads of {dim_head}): {:?} -> {:?}",
        MidBlock::BLOCK,
        x.dims(),
        y.dims()
    );
    Ok(())
}

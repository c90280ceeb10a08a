use super::{single, BlockInfo};
use unet_attention::ddpm::{Attention, LinearAttention};

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: Attention::BLOCK,
            pytorch: "denoising_diffusion_pytorch.Attention (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(Attention::BLOCK, vb, cfg, &["x"], &[4], Attention::new),
        },
        BlockInfo {
            id: LinearAttention::BLOCK,
            pytorch:
                "denoising_diffusion_pytorch.LinearAttention (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(LinearAttention::BLOCK, vb, cfg, &["x"], &[4], LinearAttention::new),
        },
    ]
}

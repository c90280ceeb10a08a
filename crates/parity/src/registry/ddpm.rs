use super::{single, BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::ddpm::{Attention, LinearAttention, MidBlock};
use unet_attention::Result;

impl Runnable for MidBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("time_emb"))?])
    }
}

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
        BlockInfo {
            id: MidBlock::BLOCK,
            pytorch: "denoising_diffusion_pytorch.Unet bottleneck: mid_block1 (ResnetBlock, RMSNorm + FiLM) → mid_attn (+ x) → \
                      mid_block2 (lucidrains denoising-diffusion-pytorch 2.0.0 – 2.3.4; keys of the Unet)",
            inputs: &["x", "time_emb"],
            kwargs: &[],
            build: from_config!(MidBlock),
        },
    ]
}

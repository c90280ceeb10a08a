use super::{single, BlockInfo, Inputs, Runnable};
use candle_core::Tensor;
use unet_attention::ldm::mid_block::MidBlock;
use unet_attention::ldm::vae::{AttnBlock, LinAttnBlock, SpatialSelfAttention};
use unet_attention::Result;

impl Runnable for MidBlock {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Ok(vec![self.forward(inputs.required("x")?, inputs.get("temb"))?])
    }
}

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: AttnBlock::BLOCK,
            pytorch: "ldm.modules.diffusionmodules.model.AttnBlock (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, \
                      SD 2.x cf1d67a; SD 1.x/2.x VAE mid.attn_1)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(AttnBlock::BLOCK, vb, cfg, &["x"], &[4], AttnBlock::new),
        },
        BlockInfo {
            id: SpatialSelfAttention::BLOCK,
            pytorch: "ldm.modules.attention.SpatialSelfAttention (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, \
                      SD 2.x cf1d67a)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(SpatialSelfAttention::BLOCK, vb, cfg, &["x"], &[4], SpatialSelfAttention::new),
        },
        BlockInfo {
            id: LinAttnBlock::BLOCK,
            pytorch: "ldm.modules.diffusionmodules.model.LinAttnBlock = LinearAttention(dim=C, heads=1, dim_head=C) \
                      (CompVis latent-diffusion a506df5 = stable-diffusion 1.x; make_attn(.., \"linear\"))",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(LinAttnBlock::BLOCK, vb, cfg, &["x"], &[4], LinAttnBlock::new),
        },
        BlockInfo {
            id: MidBlock::BLOCK,
            pytorch: "ldm.modules.diffusionmodules.model Encoder/Decoder/Model mid: block_1 (ResnetBlock) → attn_1 \
                      (make_attn vanilla / linear / none) → block_2 (CompVis latent-diffusion a506df5 = stable-diffusion 1.x, SD 2.x cf1d67a)",
            inputs: &["x", "temb"],
            kwargs: &[],
            build: from_config!(MidBlock),
        },
    ]
}

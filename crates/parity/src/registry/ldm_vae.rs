use super::{single, BlockInfo};
use unet_attention::ldm::vae::{AttnBlock, LinAttnBlock, SpatialSelfAttention};

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
    ]
}

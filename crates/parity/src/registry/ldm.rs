use super::{single, BlockInfo};
use unet_attention::ldm::LinearAttention;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![BlockInfo {
        id: LinearAttention::BLOCK,
        pytorch: "ldm.modules.attention.LinearAttention (CompVis latent-diffusion a506df5 = stable-diffusion 1.x; LinAttnBlock)",
        inputs: &["x"],
        kwargs: &[],
        build: |vb, cfg| single(LinearAttention::BLOCK, vb, cfg, &["x"], &[4], LinearAttention::new),
    }]
}

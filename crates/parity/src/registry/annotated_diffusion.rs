use super::{single, BlockInfo};
use unet_attention::annotated_diffusion::{Attention, LinearAttention};

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: Attention::BLOCK,
            pytorch: "Attention of the Hugging Face Annotated Diffusion blog post (huggingface/blog annotated-diffusion.md @ fd0b656)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(Attention::BLOCK, vb, cfg, &["x"], &[4], Attention::new),
        },
        BlockInfo {
            id: LinearAttention::BLOCK,
            pytorch: "LinearAttention of the Hugging Face Annotated Diffusion blog post (huggingface/blog annotated-diffusion.md @ fd0b656)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(LinearAttention::BLOCK, vb, cfg, &["x"], &[4], LinearAttention::new),
        },
    ]
}

use super::{single, BlockInfo};
use unet_attention::fastai::{SelfAttention, SelfAttentionMultiHead};

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: SelfAttention::BLOCK,
            pytorch: "fast.ai course22p2 nbs/27_attention.ipynb SelfAttention (GroupNorm or BatchNorm2d + fused qkv) @ df93232",
            // The GroupNorm class names its input `x`, the BatchNorm2d/fused-qkv class `inp`:
            // one tensor input under either name.
            inputs: &["x", "inp"],
            kwargs: &[],
            build: |vb, cfg| single(SelfAttention::BLOCK, vb, cfg, &["x", "inp"], &[4], SelfAttention::new),
        },
        BlockInfo {
            id: SelfAttentionMultiHead::BLOCK,
            pytorch: "fast.ai course22p2 nbs/27_attention.ipynb SelfAttentionMultiHead @ df93232",
            inputs: &["inp"],
            kwargs: &[],
            build: |vb, cfg| single(SelfAttentionMultiHead::BLOCK, vb, cfg, &["inp"], &[4], SelfAttentionMultiHead::new),
        },
    ]
}

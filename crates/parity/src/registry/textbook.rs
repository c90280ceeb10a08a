use super::{single, BlockInfo};
use unet_attention::textbook::{MultiHeadAttention, SelfAttention};

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![
        BlockInfo {
            id: SelfAttention::BLOCK,
            pytorch: "Self_Attention(Dx, D, Dv) (sword4869 attention notes §2.1, the textbook \"Attention Is All You Need\" self-attention)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(SelfAttention::BLOCK, vb, cfg, &["x"], &[2, 3], SelfAttention::new),
        },
        BlockInfo {
            id: MultiHeadAttention::BLOCK,
            pytorch: "MultiHead_Attention(input_dim, nh, dh) / MultiHead_Attention(input_dim, d_all, nh) (sword4869 attention notes §3.1 = datnnt1997/multi-head_self-attention)",
            inputs: &["x"],
            kwargs: &[],
            build: |vb, cfg| single(MultiHeadAttention::BLOCK, vb, cfg, &["x"], &[3], MultiHeadAttention::new),
        },
    ]
}

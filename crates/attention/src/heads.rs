//! Splitting channels into attention heads and merging them back.
//!
//! Two layouts occur in the PyTorch code this crate mirrors:
//! * tokens last-dim (`(B, N, H·D)`, diffusers / torch / ldm CrossAttention): `'b n (h d) -> b h n d'`;
//! * channels first (`(B, H·D, N)`, the conv-1×1 blocks): `'b (h d) n -> b h n d'`.
//!
//! Both use the "(h d)" order: head `h` owns channels `h·D .. (h+1)·D`.

use crate::cpu::contiguous;
use candle_core::{Result, Tensor};

/// `(B, N, H·D)` → `(B, H, N, D)`.
pub fn split_tokens(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, n, c) = x.dims3()?;
    x.reshape((b, n, heads, c / heads))?.transpose(1, 2)
}

/// `(B, H, N, D)` → `(B, N, H·D)`.
pub fn merge_tokens(x: &Tensor) -> Result<Tensor> {
    let (b, h, n, d) = x.dims4()?;
    contiguous(&x.transpose(1, 2)?)?.reshape((b, n, h * d))
}

/// `(B, H·D, N)` → `(B, H, N, D)`.
pub fn split_channels(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, c, n) = x.dims3()?;
    x.reshape((b, heads, c / heads, n))?.transpose(2, 3)
}

/// `(B, H, N, D)` → `(B, H·D, N)`.
pub fn merge_channels(x: &Tensor) -> Result<Tensor> {
    let (b, h, n, d) = x.dims4()?;
    contiguous(&x.transpose(2, 3)?)?.reshape((b, h * d, n))
}

/// Image `(B, C, H, W)` → tokens `(B, H·W, C)`; token `n = row·W + col`.
pub fn image_to_tokens(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    x.reshape((b, c, h * w))?.transpose(1, 2)
}

/// Tokens `(B, H·W, C)` → image `(B, C, H, W)`.
pub fn tokens_to_image(x: &Tensor, h: usize, w: usize) -> Result<Tensor> {
    let (b, _, c) = x.dims3()?;
    contiguous(&x.transpose(1, 2)?)?.reshape((b, c, h, w))
}

/// A fused q/k/v projection `(B, 3·H·D, ...)` chunked `[Q | K | V]` along dimension 1, each
/// rearranged `'b (h d) ... -> b h d (...)'`: three `(B, H, D, N)` tensors, channels first.
pub fn chunk_qkv_channels(qkv: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let b = qkv.dim(0)?;
    let qkv = qkv.reshape((b, qkv.dim(1)?, ()))?;
    let hidden = qkv.dim(1)? / 3;
    let chunk = |i: usize| {
        qkv.narrow(1, i * hidden, hidden)?
            .reshape((b, heads, hidden / heads, ()))
    };
    Ok([chunk(0)?, chunk(1)?, chunk(2)?])
}

/// A fused token projection `(B, N, 3·H·D)` in the legacy **per-head** layout
/// `[q_0 | k_0 | v_0 | q_1 | k_1 | v_1 | ...]` (each `D` wide): heads split first,
/// `'b n (h d3) -> b h n d3'`, then each head's `3·D` channels chunked `[q_h | k_h | v_h]`.
/// Returns three `(B, H, N, D)` tensors. This is fast.ai's `SelfAttentionMultiHead`
/// (`rearrange(x, 'n s (h d) -> (n h) s d')` then `chunk(3, dim=-1)`), whose batch-head
/// index `n·H + h` is the `(B, H)` pair here.
pub fn chunk_qkv_tokens_per_head(qkv: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let per_head = split_tokens(qkv, heads)?;
    let d = per_head.dim(3)? / 3;
    let chunk = |i: usize| per_head.narrow(3, i * d, d);
    Ok([chunk(0)?, chunk(1)?, chunk(2)?])
}

/// A fused channels-first projection `(B, 3·H·D, ...)` in the legacy **per-head** layout
/// `[q_0 | k_0 | v_0 | q_1 | k_1 | v_1 | ...]` (each `D` wide): heads split first,
/// `'b (h d3) ... -> b h d3 (...)'`, then each head's `3·D` channels chunked `[q_h | k_h | v_h]`.
/// Returns three `(B, H, D, N)` tensors, channels first. This is OpenAI's
/// `QKVAttentionLegacy` (`qkv.reshape(bs * H, 3 * ch, T).split(ch, dim=1)`), whose batch-head
/// index `b·H + h` is the `(B, H)` pair here.
pub fn chunk_qkv_channels_per_head(qkv: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let b = qkv.dim(0)?;
    let per_head = qkv.reshape((b, heads, qkv.dim(1)? / heads, ()))?;
    let d = per_head.dim(2)? / 3;
    let chunk = |i: usize| per_head.narrow(2, i * d, d);
    Ok([chunk(0)?, chunk(1)?, chunk(2)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn round_trips_and_layouts() {
        let dev = Device::Cpu;
        let x = Tensor::arange(0f32, 2. * 5. * 6., &dev)
            .unwrap()
            .reshape((2, 5, 6))
            .unwrap();
        let s = split_tokens(&x, 3).unwrap();
        assert_eq!(s.dims(), &[2, 3, 5, 2]);
        // head 1, token 0 = channels 2..4 of token 0
        assert_eq!(
            s.get(0)
                .unwrap()
                .get(1)
                .unwrap()
                .get(0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![2., 3.]
        );
        assert_eq!(
            merge_tokens(&s).unwrap().to_vec3::<f32>().unwrap(),
            x.to_vec3::<f32>().unwrap()
        );
        let c = split_channels(&x.transpose(1, 2).unwrap(), 2).unwrap();
        assert_eq!(c.dims(), &[2, 2, 5, 3]);
        let back = merge_channels(&c).unwrap().transpose(1, 2).unwrap();
        assert_eq!(back.to_vec3::<f32>().unwrap(), x.to_vec3::<f32>().unwrap());
        let img = Tensor::zeros((2, 4, 3, 5), DType::F32, &dev).unwrap();
        let t = image_to_tokens(&img).unwrap();
        assert_eq!(t.dims(), &[2, 15, 4]);
        assert_eq!(tokens_to_image(&t, 3, 5).unwrap().dims(), &[2, 4, 3, 5]);
    }
}

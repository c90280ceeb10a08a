//! The one scaled-dot-product attention core every block calls.
//!
//! `softmax(q·kᵀ · scale + mask) · v` over tensors laid out `(batch, heads, tokens, head_dim)`.
//! Scores and the softmax are always computed in at least f32: f16/bf16 inputs are upcast, so a
//! long row cannot saturate the half-precision denominator (Candle 0.11.1's CPU
//! `softmax_last_dim` sums in the input dtype). f64 inputs stay f64.
//!
//! This is the seam where faster kernels plug in: blocks only ever call [`sdpa`],
//! [`attention_probs`] and [`softmax`].

use candle_core::{DType, Result, Tensor, D};

/// The dtype attention arithmetic runs in for inputs of `dtype`: f32 for half types.
pub fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

fn upcast(x: &Tensor) -> Result<Tensor> {
    x.to_dtype(compute_dtype(x.dtype()))
}

/// Softmax over `dim`, accumulated in at least f32. Returns the compute dtype
/// ([`compute_dtype`] of the input); cast back where the PyTorch code does.
pub fn softmax<Dm: candle_core::shape::Dim>(xs: &Tensor, dim: Dm) -> Result<Tensor> {
    let dim = dim.to_index(xs.shape(), "softmax")?;
    let last = xs.rank() - 1;
    let xs = upcast(xs)?;
    if dim == last {
        candle_nn::ops::softmax_last_dim(&xs.contiguous()?)
    } else {
        let moved = xs.transpose(dim, last)?.contiguous()?;
        candle_nn::ops::softmax_last_dim(&moved)?.transpose(dim, last)
    }
}

/// Attention probabilities `softmax(q·kᵀ · scale + mask)` of shape `(.., q_tokens, k_tokens)`,
/// in the compute dtype.
///
/// `q`: `(B, H, Lq, D)`, `k`: `(B, H, Lk, D)`. `mask` is additive and broadcasts to
/// `(B, H, Lq, Lk)` (use `-inf` for positions that may not be attended). A `scale` of exactly
/// 1.0 is not applied, for blocks that scale `q` themselves.
pub fn attention_probs(q: &Tensor, k: &Tensor, mask: Option<&Tensor>, scale: f64) -> Result<Tensor> {
    let q = upcast(q)?.contiguous()?;
    let k = upcast(k)?.contiguous()?;
    let mut scores = q.matmul(&k.t()?)?;
    if scale != 1.0 {
        scores = (scores * scale)?;
    }
    if let Some(mask) = mask {
        scores = scores.broadcast_add(&mask.to_dtype(scores.dtype())?)?;
    }
    softmax(&scores, D::Minus1)
}

/// Scaled dot-product attention: `softmax(q·kᵀ · scale + mask) · v`, returned in `v`'s dtype.
///
/// Shapes: `q` `(B, H, Lq, D)`, `k` `(B, H, Lk, D)`, `v` `(B, H, Lk, Dv)` → `(B, H, Lq, Dv)`.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64) -> Result<Tensor> {
    let probs = attention_probs(q, k, mask, scale)?;
    let v_up = upcast(v)?.contiguous()?;
    probs.matmul(&v_up)?.to_dtype(v.dtype())
}

/// The default scale `1 / sqrt(head_dim)`.
pub fn default_scale(head_dim: usize) -> f64 {
    1.0 / (head_dim as f64).sqrt()
}

/// Efficient ("linear") attention on channels-first heads `(B, H, d, n)`, merged to
/// `(B, H·d, n)`:
/// `k = softmax(k)` over tokens; with `q_scale = Some(s)`, `q = softmax(q)` over features then
/// `q · s` (lucidrains, Annotated Diffusion); with `None`, `q` is used as it is (ldm);
/// `context = einsum('b h d n, b h e n -> b h d e', k, v)`,
/// `out = einsum('b h d e, b h d n -> b h e n', context, q)`.
pub fn linear_attention(q: &Tensor, k: &Tensor, v: &Tensor, q_scale: Option<f64>) -> Result<Tensor> {
    let dtype = v.dtype();
    let q = match q_scale {
        Some(scale) => (softmax(q, 2)?.to_dtype(dtype)? * scale)?,
        None => q.clone(),
    };
    let k = softmax(k, 3)?.to_dtype(dtype)?;
    let context = k.contiguous()?.matmul(&v.t()?.contiguous()?)?; // (b h d e)
    let out = context.t()?.contiguous()?.matmul(&q.contiguous()?)?; // (b h e n)
    let (b, heads, e, n) = out.dims4()?;
    out.reshape((b, heads * e, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Naive f64 attention over plain vectors, indexed [b][h][i][d].
    fn naive(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64) -> Vec<f64> {
        let q = q.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        let k = k.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        let v = v.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap();
        let m = mask.map(|m| m.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap());
        let mut out = vec![];
        for bh in 0..q.len() {
            for (i, qi) in q[bh].iter().enumerate() {
                let s: Vec<f64> = k[bh]
                    .iter()
                    .enumerate()
                    .map(|(j, kj)| {
                        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                        dot * scale + m.as_ref().map_or(0.0, |m| m[i][j])
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..v[bh][0].len() {
                    out.push(e.iter().zip(&v[bh]).map(|(ej, vj)| ej / z * vj[d]).sum());
                }
            }
        }
        out
    }

    /// `dims` = (batch, heads, q_tokens, k_tokens, head_dim, v_dim).
    fn check(dtype: DType, tol: f64, dims: (usize, usize, usize, usize, usize, usize), masked: bool) {
        let (b, h, lq, lk, d, dv) = dims;
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1., (b, h, lq, d), &dev).unwrap();
        let k = Tensor::randn(0f32, 1., (b, h, lk, d), &dev).unwrap();
        let v = Tensor::randn(0f32, 1., (b, h, lk, dv), &dev).unwrap();
        let mask = masked.then(|| Tensor::randn(0f32, 2., (lq, lk), &dev).unwrap());
        let scale = default_scale(d);
        let (qd, kd, vd) = (
            q.to_dtype(dtype).unwrap(),
            k.to_dtype(dtype).unwrap(),
            v.to_dtype(dtype).unwrap(),
        );
        let got = sdpa(&qd, &kd, &vd, mask.as_ref(), scale).unwrap();
        assert_eq!(got.dims(), &[b, h, lq, dv]);
        assert_eq!(got.dtype(), dtype);
        let got = got
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        // The reference sees the same (rounded) inputs as the kernel.
        let r = |t: &Tensor| {
            t.to_dtype(dtype)
                .unwrap()
                .reshape((b * h, t.dim(2).unwrap(), t.dim(3).unwrap()))
                .unwrap()
        };
        let want = naive(&r(&q), &r(&k), &r(&v), mask.as_ref(), scale);
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err < tol, "{dtype:?} b{b} h{h} lq{lq} lk{lk} d{d}: max err {err}");
    }

    #[test]
    fn matches_naive_f64_reference_on_odd_sizes() {
        check(DType::F32, 1e-5, (2, 3, 7, 11, 5, 6), false);
        check(DType::F32, 1e-5, (1, 1, 13, 3, 17, 4), true);
        check(DType::F64, 1e-12, (3, 2, 5, 9, 7, 7), true);
        check(DType::F16, 1e-2, (2, 1, 9, 31, 8, 3), false);
        check(DType::BF16, 5e-2, (1, 2, 6, 10, 12, 5), true);
    }

    #[test]
    fn half_precision_softmax_keeps_the_denominator_on_long_rows() {
        // 4096 equal scores: every probability is exactly 1/4096 and the output is the mean of v.
        let dev = Device::Cpu;
        let n = 4096;
        let q = Tensor::zeros((1, 1, 1, 8), DType::F16, &dev).unwrap();
        let k = Tensor::zeros((1, 1, n, 8), DType::F16, &dev).unwrap();
        let v = Tensor::ones((1, 1, n, 8), DType::F16, &dev).unwrap();
        let out = sdpa(&q, &k, &v, None, 1.0).unwrap();
        let vals = out
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(vals.iter().all(|x| (x - 1.0).abs() < 1e-3), "{vals:?}");
    }

    #[test]
    fn softmax_over_a_middle_dim() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 3, 4), &dev).unwrap();
        let s = softmax(&x, 1).unwrap();
        let sums = s.sum(1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(sums.iter().all(|x| (x - 1.0).abs() < 1e-6));
    }
}

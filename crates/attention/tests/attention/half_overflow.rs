//! Half precision on activations as large as a trained Stable Diffusion VAE decoder produces in
//! its mid-block attention (std ~100, a few channels offset by hundreds): the scores `q·kᵀ`
//! exceed f16's largest value (65504) when formed in half arithmetic, and a long row of 1024 keys
//! spans two of PyTorch's 512-key flash blocks. The SDPA core and diffusers' VAE mid-block
//! `Attention` (`AttnProcessor2_0`) must stay finite in f16 and bf16 and agree with f32.

use crate::common::{max_diff, seeded_randn};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use unet_attention::diffusers::{Attention, AttentionConfig};
use unet_attention::sdpa::{default_scale, sdpa};

fn max_abs(t: &Tensor) -> f32 {
    t.to_dtype(DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn all_finite(t: &Tensor) -> bool {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .all(|x| x.is_finite())
}

#[test]
fn core_sdpa_stays_finite_where_half_scores_overflow() {
    let (tokens, d) = (1024, 64);
    // Keys equal to the queries (a self-similar image): q_i·k_i = |q_i|² ≈ 64 · 40² ≈ 1e5.
    let q = (seeded_randn(&[1, 1, tokens, d], 4) * 40.0).unwrap();
    let k = q.clone();
    let v = (seeded_randn(&[1, 1, tokens, d], 5) * 100.0).unwrap();
    let scale = default_scale(d);
    let reference = sdpa(&q, &k, &v, None, scale).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let (qh, kh, vh) = (
            q.to_dtype(dtype).unwrap(),
            k.to_dtype(dtype).unwrap(),
            v.to_dtype(dtype).unwrap(),
        );
        if dtype == DType::F16 {
            // The naive half-precision product does overflow: this test is overflow-prone.
            let naive = qh.matmul(&kh.t().unwrap()).unwrap();
            assert!(!all_finite(&naive), "q·kᵀ in f16 should exceed 65504");
        }
        let out = sdpa(&qh, &kh, &vh, None, scale).unwrap();
        assert_eq!(out.dtype(), dtype);
        assert!(all_finite(&out), "{dtype:?}: non-finite attention output");
        // The softmax is one-hot-ish here; each output is close to one row of v (|v| ≲ 500).
        let tol = if dtype == DType::F16 { 0.5 } else { 4.0 };
        let err = max_diff(&out, &reference);
        assert!(err < tol, "{dtype:?}: max |half − f32| = {err}");
    }
}

#[test]
fn core_sdpa_long_rows_of_equal_scores_keep_their_denominator() {
    // 1024 equal scores over two key blocks: every weight is 1/1024 and the output is mean(v).
    let dev = Device::Cpu;
    for dtype in [DType::F16, DType::BF16] {
        let q = Tensor::zeros((1, 2, 3, 8), dtype, &dev).unwrap();
        let k = Tensor::zeros((1, 2, 1024, 8), dtype, &dev).unwrap();
        let v = (Tensor::ones((1, 2, 1024, 8), dtype, &dev).unwrap() * 300.0).unwrap();
        let out = sdpa(&q, &k, &v, None, 1.0).unwrap();
        let vals = out
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(vals.iter().all(|x| (x - 300.0).abs() < 1e-3), "{dtype:?}: {vals:?}");
    }
}

/// diffusers' `UNetMidBlock2D` attention of a VAE (`_from_deprecated_attn_block`, one head,
/// GroupNorm 32, residual inside) with 64 channels, on a 32×32 latent (1024 tokens); also
/// returns the query projection weight.
fn vae_mid_attention(dtype: DType) -> (Attention, Tensor) {
    let dev = Device::Cpu;
    let c = 64;
    let cfg: AttentionConfig = unet_attention::config::from_str(
        "diffusers.Attention",
        r#"{"query_dim": 64, "heads": 1, "dim_head": 64, "eps": 1e-6, "norm_num_groups": 32,
            "residual_connection": true, "bias": true, "upcast_softmax": true,
            "_from_deprecated_attn_block": true}"#,
    )
    .unwrap();
    // Query and key projections equal and large, as a trained VAE's can be: |q·k| reaches ~1e5.
    let wq = (seeded_randn(&[c, c], 1) * (40.0 / (c as f64).sqrt())).unwrap();
    let mut ts = HashMap::new();
    let mut put = |name: &str, t: Tensor| {
        ts.insert(name.to_string(), t);
    };
    put("group_norm.weight", Tensor::ones(c, DType::F32, &dev).unwrap());
    put("group_norm.bias", Tensor::zeros(c, DType::F32, &dev).unwrap());
    let wq_out = wq.clone();
    put("to_q.weight", wq.clone());
    put("to_q.bias", Tensor::zeros(c, DType::F32, &dev).unwrap());
    put("to_k.weight", wq);
    put("to_k.bias", Tensor::zeros(c, DType::F32, &dev).unwrap());
    let w = |seed: u64| (seeded_randn(&[c, c], seed) * (1.0 / (c as f64).sqrt())).unwrap();
    put("to_v.weight", w(2));
    put("to_v.bias", Tensor::zeros(c, DType::F32, &dev).unwrap());
    put("to_out.0.weight", w(3));
    put("to_out.0.bias", Tensor::zeros(c, DType::F32, &dev).unwrap());
    let vb = VarBuilder::from_tensors(ts, dtype, &dev);
    (Attention::new(vb, &cfg).unwrap(), wq_out)
}

/// GroupNorm(32 groups, eps 1e-6, no affine) of `(1, 64, H, W)` in f32, as tokens `(HW, 64)`.
fn group_normed_tokens(x: &Tensor) -> Tensor {
    let (b, c, h, w) = x.dims4().unwrap();
    let g = x.reshape((b, 32, (c / 32) * h * w)).unwrap();
    let mean = g.mean_keepdim(2).unwrap();
    let centered = g.broadcast_sub(&mean).unwrap();
    let var = centered.sqr().unwrap().mean_keepdim(2).unwrap();
    let normed = centered.broadcast_div(&(var + 1e-6).unwrap().sqrt().unwrap()).unwrap();
    normed.reshape((c, h * w)).unwrap().t().unwrap()
}

#[test]
fn vae_mid_attention_on_sd_vae_sized_activations_stays_finite_in_f16_and_bf16() {
    let dev = Device::Cpu;
    // hidden_states = 100·N(0, 1), channels 3, 17, 40 offset by +500, −450, +550.
    let x = (seeded_randn(&[1, 64, 32, 32], 6) * 100.0).unwrap();
    let mut offset = vec![0f32; 64];
    offset[3] = 500.0;
    offset[17] = -450.0;
    offset[40] = 550.0;
    let x = x
        .broadcast_add(&Tensor::new(offset, &dev).unwrap().reshape((1, 64, 1, 1)).unwrap())
        .unwrap();
    let (attn32, wq) = vae_mid_attention(DType::F32);
    let reference = attn32.forward(&x, None, None).unwrap();
    assert!(all_finite(&reference));
    // The scores formed in half arithmetic overflow: q = k here, and max |q·k| > 65504.
    let q = group_normed_tokens(&x).matmul(&wq.t().unwrap()).unwrap();
    let scores = q.matmul(&q.t().unwrap()).unwrap();
    assert!(max_abs(&scores) > 65504.0, "max |q·k| = {}", max_abs(&scores));
    for dtype in [DType::F16, DType::BF16] {
        let (attn, _) = vae_mid_attention(dtype);
        let xh = x.to_dtype(dtype).unwrap();
        let out = attn.forward(&xh, None, None).unwrap();
        assert_eq!(out.dtype(), dtype);
        assert!(all_finite(&out), "{dtype:?}: non-finite VAE mid-block attention output");
        // Relative to the output's scale (~600): f16 keeps ~3 digits, bf16 ~2.
        let rel = max_diff(&out, &reference) / f64::from(max_abs(&reference));
        let tol = if dtype == DType::F16 { 1e-2 } else { 5e-2 };
        assert!(rel < tol, "{dtype:?}: max |half − f32| / max |f32| = {rel}");
    }
}

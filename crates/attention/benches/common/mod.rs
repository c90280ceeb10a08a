//! Cases shared by the criterion bench (`benches/attention.rs`) and the one-shot timing and
//! peak-memory example (`examples/bench_sdpa.rs`); `scripts/bench_torch.py` has the same cases.
#![allow(dead_code)]

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use unet_attention::{ddpm, diffusers};

/// Core SDPA shapes `(batch, heads, queries, keys, head_dim)`, f32.
pub const CORE_SHAPES: [(usize, usize, usize, usize, usize); 7] = [
    (1, 1, 4096, 4096, 512),
    (1, 1, 16384, 16384, 512),
    (2, 20, 1024, 1024, 64),
    (2, 8, 64, 64, 160),
    (2, 8, 64, 77, 160),
    (4, 4, 256, 260, 32),
    (1, 4, 1024, 1028, 32),
];

/// `q, k, v` of a core shape, standard normal.
pub fn core_inputs(shape: (usize, usize, usize, usize, usize)) -> (Tensor, Tensor, Tensor) {
    let (b, h, lq, lk, d) = shape;
    let dev = Device::Cpu;
    let r = |n: usize| Tensor::randn(0f32, 1., (b, h, n, d), &dev).unwrap();
    (r(lq), r(lk), r(lk))
}

/// A whole block and its input.
pub struct BlockCase {
    pub name: String,
    pub block: Box<dyn Module>,
    pub input: Tensor,
}

fn randn(shape: &[usize], std: f64) -> Tensor {
    (Tensor::randn(0f32, 1., shape, &Device::Cpu).unwrap() * std).unwrap()
}

/// Where a case runs: the device and dtype its weights and input are moved to.
#[derive(Clone)]
pub struct On {
    pub device: Device,
    pub dtype: DType,
}

impl Default for On {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
        }
    }
}

impl On {
    fn vb(&self, weights: HashMap<String, Tensor>) -> VarBuilder<'static> {
        VarBuilder::from_tensors(weights, self.dtype, &self.device)
    }

    pub fn put(&self, t: Tensor) -> Tensor {
        t.to_dtype(self.dtype).unwrap().to_device(&self.device).unwrap()
    }
}

/// diffusers `Attention` as the SD VAE decoder's mid block builds it (C = 512, one head,
/// GroupNorm 32 groups eps 1e-6, residual), on a `(1, 512, side, side)` input.
pub fn vae_mid(side: usize, on: &On) -> BlockCase {
    let c = 512;
    let cfg: diffusers::AttentionConfig = unet_attention::config::from_str(
        "diffusers.Attention",
        r#"{"query_dim": 512, "heads": 1, "dim_head": 512, "rescale_output_factor": 1.0, "eps": 1e-06,
            "norm_num_groups": 32, "spatial_norm_dim": null, "residual_connection": true, "bias": true,
            "upcast_softmax": true, "_from_deprecated_attn_block": true}"#,
    )
    .unwrap();
    let w = 1.0 / (c as f64).sqrt();
    let mut m = HashMap::new();
    m.insert("group_norm.weight".into(), (randn(&[c], 0.1) + 1.0).unwrap());
    m.insert("group_norm.bias".into(), randn(&[c], 0.1));
    for p in ["to_q", "to_k", "to_v", "to_out.0"] {
        m.insert(format!("{p}.weight"), randn(&[c, c], w));
        m.insert(format!("{p}.bias"), randn(&[c], 0.02));
    }
    let attn = diffusers::Attention::new(on.vb(m), &cfg).unwrap();
    struct Vae(diffusers::Attention);
    impl Module for Vae {
        fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            Ok(self.0.forward(x, None, None)?)
        }
    }
    BlockCase {
        name: format!("diffusers.Attention vae_mid {side}x{side}"),
        block: Box::new(Vae(attn)),
        input: on.put(randn(&[1, c, side, side], 1.0)),
    }
}

/// lucidrains `denoising_diffusion_pytorch.Attention` of `Unet(dim=64)`'s mid block (dim 512,
/// heads 4, dim_head 32, num_mem_kv 4, flash False), on a `(1, 512, side, side)` input.
pub fn ddpm_mid(side: usize, on: &On) -> BlockCase {
    let (dim, heads, dh, mem) = (512, 4, 32, 4);
    let cfg: ddpm::AttentionConfig = unet_attention::config::from_str(
        "denoising_diffusion_pytorch.Attention",
        r#"{"dim": 512, "heads": 4, "dim_head": 32, "num_mem_kv": 4}"#,
    )
    .unwrap();
    let hidden = heads * dh;
    let mut m = HashMap::new();
    m.insert(
        "norm.g".into(),
        Tensor::ones((1, dim, 1, 1), DType::F32, &Device::Cpu).unwrap(),
    );
    m.insert("mem_kv".into(), randn(&[2, heads, mem, dh], 1.0));
    m.insert(
        "to_qkv.weight".into(),
        randn(&[3 * hidden, dim, 1, 1], 1.0 / (dim as f64).sqrt()),
    );
    m.insert(
        "to_out.weight".into(),
        randn(&[dim, hidden, 1, 1], 1.0 / (hidden as f64).sqrt()),
    );
    m.insert("to_out.bias".into(), randn(&[dim], 0.02));
    let attn = ddpm::Attention::new(on.vb(m), &cfg).unwrap();
    BlockCase {
        name: format!("denoising_diffusion_pytorch.Attention mid {side}x{side}"),
        block: Box::new(attn),
        input: on.put(randn(&[1, dim, side, side], 1.0)),
    }
}

/// One layer timed alone (`bench_sdpa linear|conv`).
pub struct LayerCase {
    pub name: String,
    pub flops: f64,
    pub io_bytes: usize,
    pub run: Box<dyn Fn() -> Tensor>,
}

/// `linear TOKENS IN OUT` or `conv B C H W OUT K` (f32, random weights and input): the packed
/// layer GEMM of `unet_attention::cpu_kernels`, or with `candle` Candle's `Linear` / `Conv2d`.
pub fn layer_case(args: &[String], candle: bool) -> LayerCase {
    use unet_attention::cpu_kernels::{ConvExtras, PackedConv, PackedLinear};
    let num = |i: usize| -> usize { args[i].parse().expect("a size") };
    let which = if candle { "candle" } else { "packed" };
    if args[0] == "linear" {
        let (tokens, inp, out) = (num(1), num(2), num(3));
        let (w, b, x) = (randn(&[out, inp], 0.05), randn(&[out], 0.1), randn(&[tokens, inp], 1.0));
        let run: Box<dyn Fn() -> Tensor> = if candle {
            let lin = candle_nn::Linear::new(w, Some(b));
            Box::new(move || lin.forward(&x).unwrap())
        } else {
            let p = PackedLinear::new(&w).unwrap().expect("a CPU the layer GEMM runs on");
            Box::new(move || p.forward(&x, Some(&b)).unwrap().unwrap())
        };
        return LayerCase {
            name: format!("linear {which} ({tokens}, {inp}) -> {out}"),
            flops: 2.0 * (tokens * inp * out) as f64,
            io_bytes: 4 * tokens * (inp + out),
            run,
        };
    }
    let (bt, c, h, wd, out, k) = (num(1), num(2), num(3), num(4), num(5), num(6));
    let (w, b, x) = (
        randn(&[out, c, k, k], 0.02),
        randn(&[out], 0.1),
        randn(&[bt, c, h, wd], 1.0),
    );
    let run: Box<dyn Fn() -> Tensor> = if candle {
        let cfg = candle_nn::Conv2dConfig {
            padding: k / 2,
            ..Default::default()
        };
        let conv = candle_nn::Conv2d::new(w, Some(b), cfg);
        Box::new(move || conv.forward(&x).unwrap())
    } else {
        let p = PackedConv::new(&w).unwrap().expect("a CPU the layer GEMM runs on");
        Box::new(move || p.forward(&x, Some(&b), ConvExtras::default()).unwrap().unwrap())
    };
    LayerCase {
        name: format!("conv{k}x{k} {which} ({bt}, {c}, {h}, {wd}) -> {out}"),
        flops: 2.0 * (bt * out * c * k * k * h * wd) as f64,
        io_bytes: 4 * bt * h * wd * (c + out),
        run,
    }
}

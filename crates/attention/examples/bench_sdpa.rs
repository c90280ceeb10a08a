//! One benchmark case, timed and with its peak memory, for `BENCHMARKS.md`:
//!
//! ```text
//! cargo run --release -p unet-attention --example bench_sdpa -- core 1 1 4096 4096 512 [--reps 5]
//! cargo run --release -p unet-attention --example bench_sdpa -- block vae 128 [--reps 3]
//! cargo run --release -p unet-attention --example bench_sdpa -- block ddpm 32
//! cargo run --release -p unet-attention --example bench_sdpa -- linear 4096 512 512   # tokens in out
//! cargo run --release -p unet-attention --example bench_sdpa -- conv 1 512 64 64 512 3  # B C H W out k
//! cargo run --release -p unet-attention --example bench_sdpa -- fma-peak
//! cargo run --release -p unet-attention --features cuda --example bench_sdpa -- core 1 1 4096 4096 512 --device cuda --dtype f16
//! ```
//!
//! `core` and `block` take `--device cpu|cuda[:N]|metal[:N]` and `--dtype f32|f16|bf16` (inputs
//! and weights are drawn in f32 on the CPU, then moved). On a GPU every timed call ends with
//! `Device::synchronize`, and the resident-set fields are the host's.
//!
//! `linear` and `conv` time the layer GEMM of `unet_attention::cpu_kernels` alone (and, with
//! `--candle`, Candle's `Linear` / `Conv2d` on the same data); their JSON adds `gflops`.
//! `fma-peak` prints the f32 FMA rate of one core (independent `vfmadd` chains, AVX2 and, where
//! the CPU has it, AVX-512), the peak the GFLOP/s figures of `BENCHMARKS.md` are held against.
//!
//! Prints one JSON line: the times of each repetition (after one warm-up call, unless
//! `--warmup 0`), their median, the resident set before the first call (inputs and weights
//! built) and its peak (`VmHWM`), and the bytes of inputs plus output. `UNET_ATTENTION_SDPA`
//! picks the path as for any caller. `scripts/bench_torch.py` prints the same for PyTorch.

#[path = "../benches/common/mod.rs"]
mod common;

use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use unet_attention::sdpa::{default_scale, sdpa, sdpa_path};

fn status_kib(key: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: bench_sdpa core|block|linear|conv|fma-peak ... (see the examples' docs)");
        std::process::exit(2);
    }
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .map_or(default, |i| args[i + 1].parse().expect("a count"))
    };
    let (reps, warmup) = (opt("--reps", 5), opt("--warmup", 1));
    let num = |i: usize| -> usize { args[i].parse().expect("a size") };
    let on = place(&args);
    let device = on.device.clone();
    if args[0] == "fma-peak" {
        fma_peak::print();
        return;
    }
    let mut flops = 0f64;
    let (case, io_bytes, run): (String, usize, Box<dyn Fn() -> Tensor>) = match args[0].as_str() {
        "linear" | "conv" => {
            let layer = common::layer_case(&args, args.iter().any(|a| a == "--candle"));
            flops = layer.flops;
            (layer.name, layer.io_bytes, layer.run)
        }
        "core" => {
            let shape = (num(1), num(2), num(3), num(4), num(5));
            let (b, h, lq, lk, d) = shape;
            let (q, k, v) = common::core_inputs(shape);
            let (q, k, v) = (on.put(q), on.put(k), on.put(v));
            let io = on.dtype.size_in_bytes() * b * h * d * (2 * lq + 2 * lk);
            let scale = default_scale(d);
            (
                format!("sdpa {shape:?}"),
                io,
                Box::new(move || sdpa(&q, &k, &v, None, scale).unwrap()),
            )
        }
        "block" => {
            let side = num(2);
            let c = match args[1].as_str() {
                "vae" => common::vae_mid(side, &on),
                "ddpm" => common::ddpm_mid(side, &on),
                other => panic!("unknown block {other}"),
            };
            let io = 2 * on.dtype.size_in_bytes() * c.input.elem_count();
            let (block, input) = (c.block, c.input);
            (c.name, io, Box::new(move || block.forward(&input).unwrap()))
        }
        other => panic!("unknown case kind {other}: core B H LQ LK D | block vae|ddpm SIDE"),
    };
    let rss_before = status_kib("VmRSS:") / 1024.0;
    for _ in 0..warmup {
        drop(run());
    }
    device.synchronize().unwrap();
    let mut ms = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        let out = run();
        device.synchronize().unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(out);
    }
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let peak = status_kib("VmHWM:") / 1024.0;
    let gflops = if flops > 0.0 {
        format!(", \"gflops\": {:.1}", flops / median / 1e6)
    } else {
        String::new()
    };
    let ms: Vec<String> = ms.iter().map(|x| format!("{x:.2}")).collect();
    println!(
        "{{\"impl\": \"candle\", \"case\": \"{case}\", \"device\": \"{}\", \"dtype\": \"{:?}\", \"path\": \"{}\", \"cpu_kernel\": \"{}\", \"threads\": {}, \"ms\": [{}], \"median_ms\": {median:.2}, \"rss_before_mib\": {rss_before:.1}, \"peak_rss_mib\": {peak:.1}, \"io_mib\": {:.1}{gflops}}}",
        args.iter().position(|a| a == "--device").map_or("cpu", |i| args[i + 1].as_str()),
        on.dtype,
        sdpa_path().unwrap(),
        unet_attention::sdpa::cpu_kernel_isa(),
        rayon_threads(),
        ms.join(", "),
        mib(io_bytes)
    );
}

/// `--device` and `--dtype` (default: the CPU, f32).
fn place(args: &[String]) -> common::On {
    let value = |name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1].as_str());
    let device = match value("--device").map(|d| d.split_once(':').unwrap_or((d, "0"))) {
        None | Some(("cpu", _)) => Device::Cpu,
        Some(("cuda", n)) => Device::new_cuda(n.parse().expect("a device ordinal")).unwrap(),
        Some(("metal", n)) => Device::new_metal(n.parse().expect("a device ordinal")).unwrap(),
        Some((other, _)) => panic!("unknown device {other}: cpu, cuda[:N] or metal[:N]"),
    };
    let dtype = match value("--dtype").unwrap_or("f32") {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => panic!("unknown dtype {other}: f32, f16 or bf16"),
    };
    common::On { device, dtype }
}

fn rayon_threads() -> usize {
    rayon::current_num_threads()
}

/// The f32 FMA rate of one core: independent chains of fused multiply-adds, enough to cover the
/// FMA latency on every unit.
mod fma_peak {
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;

    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(0.5); 12];
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` has room for the 8 floats stored.
        unsafe {
            _mm256_storeu_ps(
                out.as_mut_ptr(),
                acc.iter().fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x)),
            )
        };
        out.iter().sum()
    }

    /// # Safety
    ///
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.5); 24];
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)))
    }

    /// Best of 5 runs of `f` over `flops_per_iter`, GFLOP/s.
    #[cfg(target_arch = "x86_64")]
    fn rate(flops_per_iter: f64, f: impl Fn(usize) -> f32) -> f64 {
        let iters = 20_000_000;
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(f(iters));
                flops_per_iter * iters as f64 / t.elapsed().as_secs_f64() / 1e9
            })
            .fold(0.0, f64::max)
    }

    pub fn print() {
        #[cfg(target_arch = "x86_64")]
        {
            let mut fields = vec![];
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let run = |n| {
                    // SAFETY: AVX2 and FMA detected.
                    unsafe { avx2(n) }
                };
                fields.push(format!("\"avx2_gflops\": {:.1}", rate(12.0 * 16.0, run)));
            }
            if is_x86_feature_detected!("avx512f") {
                let run = |n| {
                    // SAFETY: AVX-512F detected.
                    unsafe { avx512(n) }
                };
                fields.push(format!("\"avx512_gflops\": {:.1}", rate(24.0 * 32.0, run)));
            }
            println!("{{\"case\": \"fma-peak (one core)\", {}}}", fields.join(", "));
        }
        #[cfg(not(target_arch = "x86_64"))]
        println!("{{\"case\": \"fma-peak (one core)\", \"error\": \"x86-64 only\"}}");
    }
}

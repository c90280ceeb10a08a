//! Our side of the whole-model benchmark (BENCHMARKS.md, "Whole models"): one
//! `UNet2DConditionModel` step at Stable Diffusion 1.5's size, or one `AutoencoderKL` decode, in
//! float32 on the CPU, on the folders `scripts/bench/whole_models.py make DIR` wrote:
//!
//! ```sh
//! cargo run --release -p unet-attention --example bench_whole -- DIR/unet unet [RUNS] [--device cuda] [--dtype f16]
//! cargo run --release -p unet-attention --example bench_whole -- DIR/vae vae [RUNS]
//! ```
//!
//! The same shapes and protocol as the PyTorch script (one model a process, one warm-up run,
//! then RUNS timed runs, default 3; on a GPU each run ends with `Device::synchronize`); prints one
//! JSON line: each run's milliseconds, the median and the fastest, the resident memory after
//! loading and the process's peak (`VmHWM`, the host's). `--device cpu|cuda|metal` (default cpu),
//! `--dtype f32|f16|bf16` (default f32): the weights are converted to it when loaded. The GPU
//! kit's `models` stage runs it (`scripts/gpu_kit/run.sh`).

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use unet_attention::models::{AutoencoderKL, UNet2DConditionModel};

/// A `/proc/self/status` field in MiB (Linux; 0 elsewhere).
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// `FOLDER unet|vae [RUNS] [--device D] [--dtype T]`.
struct Args {
    folder: String,
    model: String,
    runs: usize,
    device: String,
    dtype: DType,
}

fn args() -> Result<Args> {
    let usage = "usage: bench_whole FOLDER unet|vae [RUNS] [--device cpu|cuda|metal] [--dtype f32|f16|bf16]";
    let (mut positional, mut device, mut dtype) = (vec![], "cpu".to_string(), DType::F32);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" => device = it.next().context(usage)?,
            "--dtype" => {
                dtype = match it.next().as_deref() {
                    Some("f32") => DType::F32,
                    Some("f16") => DType::F16,
                    Some("bf16") => DType::BF16,
                    other => bail!("--dtype {other:?}: f32, f16 or bf16"),
                }
            }
            _ => positional.push(a),
        }
    }
    let (folder, model) = match positional.as_slice() {
        [f, m, ..] => (f.clone(), m.clone()),
        _ => bail!(usage),
    };
    let runs = positional.get(2).map_or(Ok(3), |r| r.parse()).context("RUNS")?;
    Ok(Args {
        folder,
        model,
        runs,
        device,
        dtype,
    })
}

fn main() -> Result<()> {
    let Args {
        folder,
        model,
        runs,
        device,
        dtype,
    } = args()?;
    let (folder, model) = (folder.as_str(), model.as_str());
    let dev = match device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        "metal" => Device::new_metal(0)?,
        other => bail!("--device {other:?}: cpu, cuda or metal"),
    };
    // Seeded inputs of the script's shapes (the values do not change the time).
    let randn = |shape: &[usize], seed: u64| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Ok(Tensor::from_vec(v, shape, &dev)?.to_dtype(dtype)?)
    };
    let (step, shapes): (Box<dyn Fn() -> Result<Tensor>>, &str) = match model {
        "unet" => {
            let unet = UNet2DConditionModel::load(folder, dtype, &dev)?;
            let x = randn(&[2, 4, 64, 64], 1)?;
            let ctx = randn(&[2, 77, 768], 2)?;
            (
                Box::new(move || Ok(unet.forward(&x, 500.0, &ctx)?)),
                "sample (2, 4, 64, 64), timestep 500, context (2, 77, 768)",
            )
        }
        "vae" => {
            let vae = AutoencoderKL::load(folder, dtype, &dev)?;
            let z = randn(&[1, 4, 64, 64], 3)?;
            (
                Box::new(move || Ok(vae.decode(&z)?)),
                "decode (1, 4, 64, 64) -> (1, 3, 512, 512)",
            )
        }
        other => bail!("model {other:?}: unet or vae"),
    };
    let loaded = status_mib("VmRSS:");
    step()?;
    dev.synchronize()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let _y = step()?;
        dev.synchronize()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted[sorted.len() / 2];
    let line = serde_json::json!({
        "side": "ours", "model": model, "shapes": shapes, "dtype": format!("{dtype:?}").to_lowercase(),
        "device": device,
        "runs_ms": times.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>(),
        "median_ms": (median * 10.0).round() / 10.0, "min_ms": (sorted[0] * 10.0).round() / 10.0,
        "rss_loaded_mib": loaded.round(), "peak_rss_mib": status_mib("VmHWM:").round(),
    });
    println!("{line}");
    Ok(())
}

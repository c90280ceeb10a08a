//! Our side of the whole-model benchmark (BENCHMARKS.md, "Whole models"): one
//! `UNet2DConditionModel` step at Stable Diffusion 1.5's size, or one `AutoencoderKL` decode, in
//! float32 on the CPU, on the folders `scripts/bench/whole_models.py make DIR` wrote:
//!
//! ```sh
//! cargo run --release --example bench_whole -- DIR/unet unet [RUNS]
//! cargo run --release --example bench_whole -- DIR/vae vae [RUNS]
//! ```
//!
//! The same shapes and protocol as the PyTorch script (one model a process, one warm-up run,
//! then RUNS timed runs, default 3); prints one JSON line: each run's milliseconds, the median and
//! the fastest, the resident memory after loading and the process's peak (`VmHWM`).

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

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (folder, model) = match args.as_slice() {
        [f, m, ..] => (f.as_str(), m.as_str()),
        _ => bail!("usage: bench_whole FOLDER unet|vae [RUNS]"),
    };
    let runs: usize = args.get(2).map_or(Ok(3), |r| r.parse()).context("RUNS")?;
    let dev = Device::Cpu;
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
        Ok(Tensor::from_vec(v, shape, &dev)?)
    };
    let (step, shapes): (Box<dyn Fn() -> Result<Tensor>>, &str) = match model {
        "unet" => {
            let unet = UNet2DConditionModel::load(folder, DType::F32, &dev)?;
            let x = randn(&[2, 4, 64, 64], 1)?;
            let ctx = randn(&[2, 77, 768], 2)?;
            (
                Box::new(move || Ok(unet.forward(&x, 500.0, &ctx)?)),
                "sample (2, 4, 64, 64), timestep 500, context (2, 77, 768)",
            )
        }
        "vae" => {
            let vae = AutoencoderKL::load(folder, DType::F32, &dev)?;
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
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let y = step()?;
        // Candle's CPU ops are eager; touching the result keeps the timing honest anyway.
        let _ = y.dims();
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted[sorted.len() / 2];
    let line = serde_json::json!({
        "side": "ours", "model": model, "shapes": shapes, "dtype": "f32",
        "runs_ms": times.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>(),
        "median_ms": (median * 10.0).round() / 10.0, "min_ms": (sorted[0] * 10.0).round() / 10.0,
        "rss_loaded_mib": loaded.round(), "peak_rss_mib": status_mib("VmHWM:").round(),
    });
    println!("{line}");
    Ok(())
}

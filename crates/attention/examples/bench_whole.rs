//! Our side of the whole-model benchmark (BENCHMARKS.md, "Whole models"): one
//! `UNet2DConditionModel` step (SD 1.5 or SDXL, whatever the folder holds), or one `AutoencoderKL`
//! decode, on the folders `scripts/bench/whole_models.py make DIR` wrote:
//!
//! ```sh
//! cargo run --release -p unet-attention --example bench_whole -- DIR/unet unet [RUNS] [--dtype bf16] [--latent 64] [--batch 2]
//! cargo run --release -p unet-attention --example bench_whole -- DIR/vae vae [RUNS] [--device cuda] [--dtype f16]
//! cargo run --release -p unet-attention --example bench_whole -- DIR/unet unet 0 --profile   # where the memory goes
//! cargo run --release -p unet-attention --example bench_whole -- DIR/controlnet controlnet     # make DIR --more
//! cargo run --release -p unet-attention --example bench_whole -- DIR/ddpm unet2d --latent 32 --batch 16
//! cargo run --release -p unet-attention --example bench_whole -- DIR/lucidrains lucidrains --latent 64 --batch 4
//! cargo run --release -p unet-attention --example bench_whole -- DIR/annotated annotated --latent 28 --batch 128
//! ```
//!
//! The same shapes and protocol as the PyTorch script (one model a process, one warm-up run,
//! then RUNS timed runs, default 3; on a GPU each run ends with `Device::synchronize`); prints one
//! JSON line: the load's milliseconds, each run's milliseconds, the median and the fastest, and
//! the memory at every stage: resident after loading, the peak of the load, of the first run and
//! of the whole process (`VmHWM`, the host's), and the heap's peak bytes (counted by the
//! allocator, [`support::counting_alloc`]), and the kernels: `isa`, the f32 tiles, and
//! `bf16_kernel`, what bf16 layers run on (`amx` where the AMX tiles run). `--device cpu|cuda|metal` (default cpu),
//! `--dtype f32|f16|bf16` (default f32): the weights are converted to it when loaded.
//! `--latent N` and `--batch B` set the latent's size (default 64 × 64, batch 2 for the U-Net and
//! 1 for the VAE); the U-Net's context and SDXL's `added_cond_kwargs` follow its config.
//! `--profile` runs the first step under a trace that keeps no tensor, and prints the stages
//! (module paths) whose heap peak was highest: where the forward's memory goes. The GPU kit's
//! `models` stage runs it (`scripts/gpu_kit/run.sh`).

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::time::Instant;
use unet_attention::models::{
    AddedCond, AnnotatedUnet, AnnotatedUnetConfig, AutoencoderKL, ControlNetModel, ForwardArgs, LucidrainsUnet,
    LucidrainsUnetConfig, UNet2DConditionModel, UNet2DModel,
};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static HEAP: counting_alloc::Counting = counting_alloc::Counting;

const MIB: f64 = 1024.0 * 1024.0;

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

/// Reset `VmHWM` to the current resident size (Linux 4.0+: `5` into `clear_refs`), so that the
/// next reading is the peak of what follows.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// `FOLDER unet|vae [RUNS] [--device D] [--dtype T] [--latent N] [--batch B] [--profile]`.
struct Args {
    folder: String,
    model: String,
    runs: usize,
    device: String,
    dtype: DType,
    latent: usize,
    batch: Option<usize>,
    profile: bool,
}

fn args() -> Result<Args> {
    let usage = "usage: bench_whole FOLDER unet|vae [RUNS] [--device cpu|cuda|metal] [--dtype f32|f16|bf16] \
                 [--latent N] [--batch B] [--profile]";
    let mut a = Args {
        folder: String::new(),
        model: String::new(),
        runs: 3,
        device: "cpu".into(),
        dtype: DType::F32,
        latent: 64,
        batch: None,
        profile: false,
    };
    let mut positional = vec![];
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--device" => a.device = it.next().context(usage)?,
            "--dtype" => {
                a.dtype = match it.next().as_deref() {
                    Some("f32") => DType::F32,
                    Some("f16") => DType::F16,
                    Some("bf16") => DType::BF16,
                    other => bail!("--dtype {other:?}: f32, f16 or bf16"),
                }
            }
            "--latent" => a.latent = it.next().context(usage)?.parse().context("--latent")?,
            "--batch" => a.batch = Some(it.next().context(usage)?.parse().context("--batch")?),
            "--profile" => a.profile = true,
            _ => positional.push(arg),
        }
    }
    match positional.as_slice() {
        [f, m, ..] => (a.folder, a.model) = (f.clone(), m.clone()),
        _ => bail!(usage),
    }
    if let Some(r) = positional.get(2) {
        a.runs = r.parse().context("RUNS")?;
    }
    Ok(a)
}

/// Seeded values in [-1, 1) of `shape` (the values do not change the time).
fn randn(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, dev)?.to_dtype(dtype)?)
}

/// The U-Net's conditioning from its `config.json`: the context's width, and SDXL's
/// `text_embeds` width and `time_ids` count where it has a `text_time` addition embedding.
fn unet_conditioning(folder: &str) -> Result<(usize, Option<(usize, usize)>)> {
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{folder}/config.json"))?)?;
    let ctx = match &cfg["cross_attention_dim"] {
        serde_json::Value::Array(v) => v.first().and_then(|x| x.as_u64()),
        v => v.as_u64(),
    }
    .context("cross_attention_dim")? as usize;
    let text_time = if cfg["addition_embed_type"].as_str() == Some("text_time") {
        let proj = cfg["projection_class_embeddings_input_dim"]
            .as_u64()
            .context("projection dim")? as usize;
        let per = cfg["addition_time_embed_dim"]
            .as_u64()
            .context("addition_time_embed_dim")? as usize;
        Some((proj - 6 * per, 6))
    } else {
        None
    };
    Ok((ctx, text_time))
}

type Step = Box<dyn Fn() -> Result<Tensor>>;

/// Load the model and its inputs; returns the step and a description of its shapes.
fn build(a: &Args, dev: &Device) -> Result<(Step, String)> {
    let (dtype, n) = (a.dtype, a.latent);
    Ok(match a.model.as_str() {
        "unet" => {
            let (ctx_dim, text_time) = unet_conditioning(&a.folder)?;
            let b = a.batch.unwrap_or(2);
            let unet = UNet2DConditionModel::load(&a.folder, dtype, dev)?;
            let x = randn(&[b, 4, n, n], 1, dtype, dev)?;
            let ctx = randn(&[b, 77, ctx_dim], 2, dtype, dev)?;
            let added = match text_time {
                Some((text, ids)) => Some((randn(&[b, text], 4, dtype, dev)?, randn(&[b, ids], 5, dtype, dev)?)),
                None => None,
            };
            let shapes = format!("sample ({b}, 4, {n}, {n}), timestep 500, context ({b}, 77, {ctx_dim})")
                + if added.is_some() { ", added_cond_kwargs" } else { "" };
            let step = move || {
                let args = ForwardArgs {
                    added_cond: added.as_ref().map(|(t, i)| AddedCond {
                        text_embeds: t,
                        time_ids: i,
                    }),
                    ..Default::default()
                };
                Ok(unet.forward_with(&x, 500.0, &ctx, args)?)
            };
            (Box::new(step), shapes)
        }
        "vae" => {
            let b = a.batch.unwrap_or(1);
            let vae = AutoencoderKL::load(&a.folder, dtype, dev)?;
            let z = randn(&[b, 4, n, n], 3, dtype, dev)?;
            let shapes = format!("decode ({b}, 4, {n}, {n}) -> ({b}, 3, {}, {})", 8 * n, 8 * n);
            (Box::new(move || Ok(vae.decode(&z)?)), shapes)
        }
        "controlnet" => {
            let b = a.batch.unwrap_or(2);
            let net = ControlNetModel::load(&a.folder, dtype, dev)?;
            let levels = net
                .config()
                .conditioning_embedding_out_channels
                .as_ref()
                .map_or(1, |w| w.len())
                - 1;
            let ctx_dim = net.config().cross_attention_dim;
            let x = randn(&[b, 4, n, n], 1, dtype, dev)?;
            let ctx = randn(&[b, 77, ctx_dim], 2, dtype, dev)?;
            let cond = randn(&[b, 3, n << levels, n << levels], 3, dtype, dev)?;
            let shapes = format!(
                "sample ({b}, 4, {n}, {n}), timestep 500, context ({b}, 77, {ctx_dim}), controlnet_cond ({b}, 3, {}, {})",
                n << levels,
                n << levels
            );
            (
                Box::new(move || Ok(net.forward(&x, 500.0, &ctx, &cond, 1.0)?.mid)),
                shapes,
            )
        }
        "unet2d" => {
            let b = a.batch.unwrap_or(16);
            let unet = UNet2DModel::load(&a.folder, dtype, dev)?;
            let c = unet.config().in_channels;
            let x = randn(&[b, c, n, n], 1, dtype, dev)?;
            let shapes = format!("sample ({b}, {c}, {n}, {n}), timestep 500");
            (Box::new(move || Ok(unet.forward(&x, 500.0)?)), shapes)
        }
        "lucidrains" => {
            let b = a.batch.unwrap_or(4);
            let text = std::fs::read_to_string(format!("{}/config.json", a.folder))?;
            let cfg: LucidrainsUnetConfig = serde_json::from_str(&text)?;
            let weights = [format!("{}/model.safetensors", a.folder)];
            // SAFETY: a benchmark folder nothing writes to while it runs.
            let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&weights, dtype, dev)? };
            let unet = LucidrainsUnet::new(vb, &cfg)?;
            let c = cfg.channels;
            let x = randn(&[b, c, n, n], 1, dtype, dev)?;
            let t = Tensor::full(500f32, b, dev)?;
            let shapes = format!("x ({b}, {c}, {n}, {n}), time 500");
            (Box::new(move || Ok(unet.forward(&x, &t, None)?)), shapes)
        }
        "annotated" => {
            let b = a.batch.unwrap_or(128);
            let text = std::fs::read_to_string(format!("{}/config.json", a.folder))?;
            let cfg: AnnotatedUnetConfig = serde_json::from_str(&text)?;
            let weights = [format!("{}/model.safetensors", a.folder)];
            // SAFETY: a benchmark folder nothing writes to while it runs.
            let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&weights, dtype, dev)? };
            let unet = AnnotatedUnet::new(vb, &cfg)?;
            let c = cfg.channels;
            let x = randn(&[b, c, n, n], 1, dtype, dev)?;
            let t = Tensor::full(500f32, b, dev)?;
            let shapes = format!("x ({b}, {c}, {n}, {n}), time 500");
            (Box::new(move || Ok(unet.forward(&x, &t, None)?)), shapes)
        }
        other => bail!("model {other:?}: unet, vae, controlnet, unet2d, lucidrains or annotated"),
    })
}

thread_local! {
    /// `(stage, heap held at its end, heap peak since the stage before, seconds since the stage
    /// before)`, in recording order.
    static STAGES: RefCell<Vec<(String, usize, usize, f64)>> = const { RefCell::new(Vec::new()) };
    static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Run `step` under a trace that keeps no tensor, noting the heap at each stage; print the
/// stages with the highest peaks (each over the heap held before the step) to stderr.
fn profile(step: &Step, before: usize) -> Result<()> {
    counting_alloc::take_peak();
    let (out, _, _) = unet_attention::trace::with_trace_keeping(
        |name| {
            let peak = counting_alloc::take_peak();
            let now = Instant::now();
            let secs = LAST
                .with(|l| l.replace(Some(now)))
                .map_or(0.0, |t| (now - t).as_secs_f64());
            STAGES.with(|s| {
                s.borrow_mut()
                    .push((name.to_string(), counting_alloc::now(), peak, secs))
            });
            false
        },
        step,
    );
    out?;
    let mut stages = STAGES.with(|s| s.take());
    // Time by the stage's last name (`norm1`, `attn1/q` → `q`), over the whole step.
    let mut by_kind: std::collections::BTreeMap<String, f64> = Default::default();
    for (name, _, _, secs) in &stages {
        let leaf = name
            .rsplit('/')
            .next()
            .unwrap_or(name)
            .split('#')
            .next()
            .unwrap_or(name);
        *by_kind.entry(leaf.to_string()).or_default() += secs;
    }
    let mut by_kind: Vec<_> = by_kind.into_iter().collect();
    by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
    eprintln!("time up to each stage, by stage name (ms):");
    for (leaf, secs) in by_kind.iter().take(15) {
        eprintln!("{:>10.1}  {leaf}", secs * 1e3);
    }
    eprintln!(
        "heap before the step: {:.0} MiB; the stages with the highest peaks over it (MiB):",
        before as f64 / MIB
    );
    eprintln!("{:>10} {:>10}  stage", "peak", "held after");
    stages.sort_by_key(|s| std::cmp::Reverse(s.2));
    for (name, held, peak, _) in stages.iter().take(25) {
        let over = |b: usize| (b as f64 - before as f64) / MIB;
        eprintln!("{:>10.0} {:>10.0}  {name}", over(*peak), over(*held));
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = args()?;
    unet_attention::cpu_kernels::join_rayon_pool();
    let dev = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        "metal" => Device::new_metal(0)?,
        other => bail!("--device {other:?}: cpu, cuda or metal"),
    };
    let t0 = Instant::now();
    let (step, shapes) = build(&a, &dev)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (loaded, load_peak, heap_loaded) = (status_mib("VmRSS:"), status_mib("VmHWM:"), counting_alloc::now());
    let heap_load_peak = counting_alloc::all_time_peak();
    reset_peak_rss();
    counting_alloc::take_peak();
    let t1 = Instant::now();
    if a.profile {
        profile(&step, heap_loaded)?;
    } else {
        step()?;
    }
    dev.synchronize()?;
    let first_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (first_peak, heap_first_peak) = (status_mib("VmHWM:"), counting_alloc::take_peak());
    reset_peak_rss();
    let mut times = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let t0 = Instant::now();
        let _y = step()?;
        dev.synchronize()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let steady_peak = status_mib("VmHWM:");
    let heap_steady_peak = counting_alloc::take_peak();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let r = |t: f64| (t * 10.0).round() / 10.0;
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    let line = serde_json::json!({
        "side": "ours", "model": a.model, "shapes": shapes, "dtype": format!("{:?}", a.dtype).to_lowercase(),
        "device": a.device, "load_ms": r(load_ms), "first_ms": r(first_ms),
        "runs_ms": times.iter().map(|&t| r(t)).collect::<Vec<_>>(),
        "median_ms": r(median), "min_ms": sorted.first().map_or(f64::NAN, |&t| r(t)),
        "rss_loaded_mib": loaded.round(), "peak_load_mib": load_peak.round(),
        "peak_first_mib": first_peak.round(), "peak_steady_mib": steady_peak.round(),
        "peak_rss_mib": load_peak.max(first_peak).max(steady_peak).round(),
        "heap_loaded_mib": (heap_loaded as f64 / MIB).round(),
        "heap_peak_load_mib": (heap_load_peak as f64 / MIB).round(),
        "heap_peak_first_mib": (heap_first_peak as f64 / MIB).round(),
        "heap_peak_steady_mib": (heap_steady_peak as f64 / MIB).round(),
        "isa": unet_attention::cpu_kernels::layer_kernel_isa(),
        "bf16_kernel": unet_attention::cpu_kernels::bf16_layer_kernel(),
    });
    println!("{line}");
    Ok(())
}

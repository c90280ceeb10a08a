//! One whole block of a parity bundle, timed, with its peak memory and its accuracy:
//!
//! ```text
//! cargo build --release -p unet-parity --example bench_bundle
//! target/release/examples/bench_bundle target/bench_blocks/vae_mid_64.safetensors [--reps 5] [--warmup 1]
//!     [--device cpu|cuda[:N]|metal[:N]] [--dtype f32|f16|bf16]
//! ```
//!
//! Reads the bundle, builds its block and prepares its inputs once (as `unet-parity check` does,
//! in the bundle's dtype or `--dtype`, on the CPU or `--device`), then times `block.run(&inputs)`
//! per repetition after the warm-up calls. On a GPU each timed call ends with
//! `Device::synchronize`, so the time is the kernels' and not only their launch; the resident-set
//! fields are then the host's, not the GPU's memory. Prints one JSON line with the fields of `crates/attention/examples/bench_sdpa.rs`
//! (`case` is the bundle's metadata `bench.case`, else the file stem; `rss_before_mib` is taken
//! with the bundle and the block loaded, and the peak `VmHWM` is reset there, so `peak_rss_mib` is
//! the calls' peak, not that of reading the bundle; `io_mib` is the inputs plus our outputs), and
//! two more:
//! `max_abs_vs_f64`, max |ours − PyTorch's float64 output| over all outputs (of the last timed
//! call), and `torch_max_abs_vs_f64`, the same for PyTorch's own output in the bundle; `null` when
//! the bundle has no float64 outputs. `scripts/bench_torch.py whole NAME` times PyTorch on the
//! same bundle.
//!
//! On CUDA (built with `--features cuda`) the line also has `gpu_before_mib` (the device memory
//! pool's live bytes with the block and inputs loaded, PyTorch's `memory_allocated()`
//! counterpart) and `gpu_peak_mib` (its peak over the warm-up and timed calls, as
//! `max_memory_allocated()` after `reset_peak_memory_stats()`), and `gpu_device_used_mib` (total −
//! free of the whole device after the calls), `null` where the device has no memory pool
//! (`unet_attention::cuda::memory`).
//!
//! The calls run from the main thread made one of rayon's workers
//! (`unet_attention::cpu_kernels::join_rayon_pool`, as the README advises a program to), and the
//! line says so (`rayon_pool`: `calling-thread`); `--rayon-default` leaves rayon's pool as it is
//! built by default (`default`: every parallel loop handed from the main thread to the pool).

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use std::path::Path;
use std::time::Instant;
use unet_parity::bundle::{parse_dtype, Bundle};
use unet_parity::cli::{open_device, parse_device};
use unet_parity::compare::compare;
use unet_parity::{prepare_bundle, Options};

fn status_kib(key: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Reset `VmHWM` to the current resident set (Linux: `/proc/self/clear_refs` 5), so the peak is
/// the calls' and not that of reading the bundle; where that fails it stays the process's peak.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> usize {
    tensors
        .into_iter()
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

/// Max |ours − float64| and max |PyTorch − float64| over all outputs, `None` without the
/// bundle's float64 outputs.
fn errors_vs_f64(bundle: &Bundle, ours: &[Tensor]) -> Result<(Option<f64>, Option<f64>)> {
    let (mut o, mut t) = (Some(0.0f64), Some(0.0f64));
    for (name, ours) in bundle.outputs.iter().zip(ours) {
        let torch = bundle.output(name).context("output listed but missing")?;
        let report = compare(
            name,
            &ours.to_device(&Device::Cpu)?,
            torch,
            bundle.output_f64(name),
            0.0,
            0.0,
        )?;
        o = o.zip(report.ours_vs_f64).map(|(a, b)| a.max(b));
        t = t.zip(report.torch_vs_f64).map(|(a, b)| a.max(b));
    }
    Ok((o, t))
}

/// The timed calls' milliseconds and the last call's outputs (one extra call when `reps` is 0).
fn time_runs(
    run: impl Fn() -> Result<Vec<Tensor>>,
    device: &Device,
    reps: usize,
    warmup: usize,
) -> Result<(Vec<f64>, Vec<Tensor>)> {
    for _ in 0..warmup {
        drop(run()?);
    }
    device.synchronize()?;
    let mut ms = vec![];
    let mut last = None;
    for i in 0..reps {
        let t = Instant::now();
        let out = run()?;
        device.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        if i + 1 == reps {
            last = Some(out);
        }
    }
    let last = match last {
        Some(out) => out,
        None => run()?,
    };
    Ok((ms, last))
}

/// The GPU memory fields of the JSON line (see the module docs), and what `start` returns to
/// give them: the pool and its live bytes, read right before the calls.
struct GpuMemory {
    #[cfg(feature = "cuda")]
    pool: Option<(unet_attention::cuda::memory::PoolMemory, u64)>,
}

impl GpuMemory {
    /// Reset the peak and read the live bytes, on a CUDA device (after a synchronize).
    #[allow(unused_variables)]
    fn start(device: &Device) -> Result<GpuMemory> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            device.synchronize()?;
            let pool = unet_attention::cuda::memory::PoolMemory::of(dev)?;
            let pool = match pool {
                Some(p) => {
                    p.reset_peak()?;
                    let used = p.used_bytes()?;
                    Some((p, used))
                }
                None => None,
            };
            return Ok(GpuMemory { pool });
        }
        Ok(GpuMemory {
            #[cfg(feature = "cuda")]
            pool: None,
        })
    }

    /// `, "gpu_before_mib": .., "gpu_peak_mib": .., "gpu_device_used_mib": ..` on CUDA, else "".
    #[allow(unused_variables)]
    fn fields(&self, device: &Device) -> Result<String> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            device.synchronize()?;
            let mib_u = |b: u64| format!("{:.1}", b as f64 / (1024.0 * 1024.0));
            let (before, peak) = match &self.pool {
                Some((p, before)) => (mib_u(*before), mib_u(p.peak_bytes()?)),
                None => ("null".into(), "null".into()),
            };
            let used = mib_u(unet_attention::cuda::memory::device_used_bytes(dev)?);
            return Ok(format!(
                ", \"gpu_before_mib\": {before}, \"gpu_peak_mib\": {peak}, \"gpu_device_used_mib\": {used}"
            ));
        }
        Ok(String::new())
    }
}

fn json_f64(x: Option<f64>) -> String {
    x.map_or("null".into(), |x| format!("{x:.3e}"))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rayon_pool = rayon_pool(&args);
    let opt = |name: &str, default: usize| -> Result<usize> {
        match args.iter().position(|a| a == name) {
            None => Ok(default),
            Some(i) => Ok(args.get(i + 1).context("a count")?.parse()?),
        }
    };
    let sopt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let (reps, warmup) = (opt("--reps", 5)?, opt("--warmup", 1)?);
    let Some(file) = args.first().filter(|a| !a.starts_with("--")) else {
        bail!(
            "usage: bench_bundle BUNDLE.safetensors [--reps N] [--warmup N] [--device D] [--dtype T] [--rayon-default]"
        );
    };
    let spec = parse_device(sopt("--device").map_or("cpu", |s| s.as_str())).map_err(anyhow::Error::msg)?;
    let device = open_device(spec).map_err(anyhow::Error::msg)?;
    let dtype = match sopt("--dtype") {
        None => None,
        Some(s) => Some(parse_dtype(s).with_context(|| format!("--dtype {s}: expected f32, f16, bf16 or f64"))?),
    };
    let path = Path::new(file);
    let bundle = Bundle::read(path)?;
    let opts = Options {
        device: device.clone(),
        dtype,
        ..Options::default()
    };
    let prepared = prepare_bundle(&bundle, &opts)?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let case = bundle.metadata.get("bench.case").cloned().or(stem).unwrap_or_default();
    let (block, inputs) = (&prepared.block, &prepared.inputs);

    reset_peak_rss();
    let rss_before = status_kib("VmRSS:") / 1024.0;
    let gpu = GpuMemory::start(&device)?;
    let (ms, last) = time_runs(|| Ok(block.run(inputs)?), &device, reps, warmup)?;
    let peak = status_kib("VmHWM:") / 1024.0;
    let gpu_fields = gpu.fields(&device)?;
    let io = bytes(inputs.tensors.values()) + bytes(&last);
    let (ours_err, torch_err) = errors_vs_f64(&bundle, &last)?;

    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted
        .get(sorted.len() / 2)
        .map_or("null".into(), |m| format!("{m:.2}"));
    let ms: Vec<String> = ms.iter().map(|x| format!("{x:.2}")).collect();
    println!(
        "{{\"impl\": \"candle\", \"case\": {}, \"device\": \"{spec}\", \"dtype\": \"{:?}\", \"path\": \"{}\", \"cuda_layers\": {}, \"cpu_kernel\": \"{}\", \"layer_kernel\": \"{}\", \"threads\": {}, \"rayon_pool\": \"{rayon_pool}\", \"ms\": [{}], \"median_ms\": {median}, \"rss_before_mib\": {rss_before:.1}, \"peak_rss_mib\": {peak:.1}, \"io_mib\": {:.1}, \"max_abs_vs_f64\": {}, \"torch_max_abs_vs_f64\": {}{gpu_fields}}}",
        serde_json::to_string(&case)?,
        prepared.dtype,
        unet_attention::sdpa::sdpa_path()?,
        unet_attention::ops::cuda_layers()?,
        unet_attention::sdpa::cpu_kernel_isa(),
        unet_attention::cpu_kernels::layer_kernel_isa(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        ms.join(", "),
        mib(io),
        json_f64(ours_err),
        json_f64(torch_err),
    );
    Ok(())
}

/// Makes the main thread one of rayon's workers unless `--rayon-default` is given; what the JSON
/// line reports as `rayon_pool`.
fn rayon_pool(args: &[String]) -> &'static str {
    if !args.iter().any(|a| a == "--rayon-default") && unet_attention::cpu_kernels::join_rayon_pool() {
        "calling-thread"
    } else {
        "default"
    }
}

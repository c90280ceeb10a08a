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
//! the CPU has it, AVX-512), the peak the GFLOP/s figures of `BENCHMARKS.md` are held against,
//! and the layer GEMM's register tile alone on L1-resident operands (`tile_rows_gflops`,
//! `tile_interleaved_gflops`; `tile_rows3_gflops` for the AVX-512 candidate loop that addresses
//! its rows from three base registers): the loop's own ceiling on this CPU.
//!
//! Prints one JSON line: the times of each repetition (after one warm-up call, unless
//! `--warmup 0`), their median, the resident set before the first call (inputs and weights
//! built) and its peak (`VmHWM`), and the bytes of inputs plus output. `UNET_ATTENTION_SDPA`
//! picks the path as for any caller. `scripts/bench_torch.py` prints the same for PyTorch.
//!
//! The timed calls run from the main thread made one of rayon's workers
//! (`unet_attention::cpu_kernels::join_rayon_pool`, as the README advises a program to; the line's
//! `rayon_pool` is `calling-thread`), unless `--rayon-default` leaves rayon's default pool
//! (`default`).
//!
//! `--help` prints the usage; a bad argument prints what is wrong and the usage, and exits with
//! status 2 (a device that does not open: status 1).

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

const USAGE: &str =
    "usage: bench_sdpa CASE [--reps N] [--warmup N] [--device cpu|cuda[:N]|metal[:N]] [--dtype f32|f16|bf16] [--candle] [--rayon-default]
cases:
  core B H LQ LK D      the attention core (sdpa) on (B, H, L, D) inputs
  block vae|ddpm SIDE   a whole attention block on a (1, C, SIDE, SIDE) input
  linear TOKENS IN OUT  the packed linear layer (--candle: Candle's Linear)
  conv B C H W OUT K    the packed K×K convolution (--candle: Candle's Conv2d)
  fma-peak              the f32 FMA rate of one core
(see the doc comment of crates/attention/examples/bench_sdpa.rs)";

/// What to time.
enum Case {
    /// `(B, H, LQ, LK, D)`.
    Core((usize, usize, usize, usize, usize)),
    /// `vae` or `ddpm`, and the side of the image.
    Block(String, usize),
    /// `linear` or `conv` with their sizes, as `common::layer_case` reads them.
    Layer(Vec<String>),
    FmaPeak,
}

/// The command line.
struct Options {
    case: Case,
    reps: usize,
    warmup: usize,
    /// `--device` as given, and what it names.
    device: String,
    place: Place,
    dtype: DType,
    candle: bool,
    /// Leave rayon's global pool as built by default (the main thread outside it).
    rayon_default: bool,
}

/// The command line, or what is wrong with it.
fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        case: Case::FmaPeak,
        reps: 5,
        warmup: 1,
        device: "cpu".into(),
        place: Place::Cpu,
        dtype: DType::F32,
        candle: false,
        rayon_default: false,
    };
    let mut positional = vec![];
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().map(String::as_str).ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--reps" => opts.reps = number(arg, value()?, 1)?,
            "--warmup" => opts.warmup = number(arg, value()?, 0)?,
            "--device" => {
                opts.device = value()?.to_string();
                opts.place = Place::parse(&opts.device)?;
            }
            "--dtype" => {
                opts.dtype = match value()? {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => return Err(format!("unknown dtype {other}: f32, f16 or bf16")),
                }
            }
            "--candle" => opts.candle = true,
            "--rayon-default" => opts.rayon_default = true,
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ => positional.push(arg.clone()),
        }
    }
    opts.case = case(&positional)?;
    Ok(opts)
}

/// An integer of at least `min`, the value of `what`.
fn number(what: &str, s: &str, min: usize) -> Result<usize, String> {
    match s.parse() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("{what}: expected an integer of at least {min}, found {s:?}")),
    }
}

/// A device `--device` names.
#[derive(Clone, Copy)]
enum Place {
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl Place {
    /// `cpu`, `cuda[:N]` or `metal[:N]`.
    fn parse(s: &str) -> Result<Place, String> {
        let (kind, ordinal) = s.split_once(':').unwrap_or((s, "0"));
        let ordinal = || number(&format!("--device {s}"), ordinal, 0);
        match kind {
            "cpu" => Ok(Place::Cpu),
            "cuda" => Ok(Place::Cuda(ordinal()?)),
            "metal" => Ok(Place::Metal(ordinal()?)),
            other => Err(format!("unknown device {other}: cpu, cuda[:N] or metal[:N]")),
        }
    }
}

/// The case the positional arguments name, its sizes checked.
fn case(positional: &[String]) -> Result<Case, String> {
    let Some((kind, rest)) = positional.split_first() else {
        return Err("no case given".into());
    };
    let sizes = |names: &[&str]| -> Result<Vec<usize>, String> {
        if rest.len() != names.len() {
            return Err(format!(
                "{kind} takes {}, found {} arguments",
                names.join(" "),
                rest.len()
            ));
        }
        names
            .iter()
            .zip(rest)
            .map(|(name, s)| number(&format!("{kind} {name}"), s, 1))
            .collect()
    };
    Ok(match kind.as_str() {
        "core" => {
            let n = sizes(&["B", "H", "LQ", "LK", "D"])?;
            Case::Core((n[0], n[1], n[2], n[3], n[4]))
        }
        "block" => match rest.first().map(String::as_str) {
            Some(block @ ("vae" | "ddpm")) => {
                let side = match rest {
                    [_, side] => number("block SIDE", side, 1)?,
                    _ => return Err(format!("block takes vae|ddpm SIDE, found {} arguments", rest.len())),
                };
                Case::Block(block.to_string(), side)
            }
            other => return Err(format!("unknown block {}: vae or ddpm", other.unwrap_or("(none)"))),
        },
        "linear" | "conv" => {
            let names: &[&str] = if kind == "linear" {
                &["TOKENS", "IN", "OUT"]
            } else {
                &["B", "C", "H", "W", "OUT", "K"]
            };
            sizes(names)?;
            Case::Layer(positional.to_vec())
        }
        "fma-peak" if rest.is_empty() => Case::FmaPeak,
        "fma-peak" => return Err("fma-peak takes no arguments".into()),
        other => return Err(format!("unknown case {other}: core, block, linear, conv or fma-peak")),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let opts = parse(&args).unwrap_or_else(|e| {
        eprintln!("bench_sdpa: {e}\n{USAGE}");
        std::process::exit(2)
    });
    if let Case::FmaPeak = opts.case {
        fma_peak::print();
        return;
    }
    let on = place(&opts).unwrap_or_else(|e| {
        eprintln!("bench_sdpa: {e}");
        std::process::exit(1)
    });
    let rayon_pool = if !opts.rayon_default && unet_attention::cpu_kernels::join_rayon_pool() {
        "calling-thread"
    } else {
        "default"
    };
    let bench = build(&opts, &on);
    let rss_before = status_kib("VmRSS:") / 1024.0;
    let ms = time(&*bench.run, &opts, &on.device);
    report(&opts, &bench, ms, rss_before, rayon_pool);
}

/// A case ready to time.
struct Bench {
    name: String,
    io_bytes: usize,
    /// Floating-point operations of one call, where the case counts them (else 0).
    flops: f64,
    run: Box<dyn Fn() -> Tensor>,
}

/// The inputs and weights of the case, on `on`.
fn build(opts: &Options, on: &common::On) -> Bench {
    match &opts.case {
        Case::Layer(args) => {
            let layer = common::layer_case(args, opts.candle);
            Bench {
                name: layer.name,
                io_bytes: layer.io_bytes,
                flops: layer.flops,
                run: layer.run,
            }
        }
        &Case::Core(shape) => {
            let (b, h, lq, lk, d) = shape;
            let (q, k, v) = common::core_inputs(shape);
            let (q, k, v) = (on.put(q), on.put(k), on.put(v));
            let scale = default_scale(d);
            Bench {
                name: format!("sdpa {shape:?}"),
                io_bytes: on.dtype.size_in_bytes() * b * h * d * (2 * lq + 2 * lk),
                flops: 0.0,
                run: Box::new(move || sdpa(&q, &k, &v, None, scale).unwrap()),
            }
        }
        Case::Block(kind, side) => {
            let c = match kind.as_str() {
                "vae" => common::vae_mid(*side, on),
                _ => common::ddpm_mid(*side, on),
            };
            let io_bytes = 2 * on.dtype.size_in_bytes() * c.input.elem_count();
            let (block, input) = (c.block, c.input);
            Bench {
                name: c.name,
                io_bytes,
                flops: 0.0,
                run: Box::new(move || block.forward(&input).unwrap()),
            }
        }
        Case::FmaPeak => unreachable!("fma-peak runs no case"),
    }
}

/// Milliseconds of each of `opts.reps` calls of `run`, after `opts.warmup` calls; each call
/// ends with the device synchronised.
fn time(run: &dyn Fn() -> Tensor, opts: &Options, device: &Device) -> Vec<f64> {
    for _ in 0..opts.warmup {
        drop(run());
    }
    device.synchronize().unwrap();
    let mut ms = vec![];
    for _ in 0..opts.reps {
        let t = Instant::now();
        let out = run();
        device.synchronize().unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(out);
    }
    ms
}

/// The JSON line of the run.
fn report(opts: &Options, bench: &Bench, ms: Vec<f64>, rss_before: f64, rayon_pool: &str) {
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let peak = status_kib("VmHWM:") / 1024.0;
    let gflops = if bench.flops > 0.0 {
        format!(", \"gflops\": {:.1}", bench.flops / median / 1e6)
    } else {
        String::new()
    };
    let ms: Vec<String> = ms.iter().map(|x| format!("{x:.2}")).collect();
    let variant = fused_variant_field();
    println!(
        "{{\"impl\": \"candle\", \"case\": \"{}\", \"device\": \"{}\", \"dtype\": \"{:?}\", \"path\": \"{}\"{variant}, \"cpu_kernel\": \"{}\", \"threads\": {}, \"rayon_pool\": \"{rayon_pool}\", \"ms\": [{}], \"median_ms\": {median:.2}, \"rss_before_mib\": {rss_before:.1}, \"peak_rss_mib\": {peak:.1}, \"io_mib\": {:.1}{gflops}}}",
        bench.name,
        opts.device,
        opts.dtype,
        sdpa_path().unwrap(),
        unet_attention::sdpa::cpu_kernel_isa(),
        rayon_threads(),
        ms.join(", "),
        mib(bench.io_bytes)
    );
}

/// `, "fused_variant": "<name>", "fused_splits": "<auto|n>"`: the fused CUDA kernel's variant
/// and key splits (`UNET_ATTENTION_FUSED_VARIANT`, `UNET_ATTENTION_FUSED_SPLITS`) in a CUDA
/// build; nothing in another.
#[cfg(feature = "cuda")]
fn fused_variant_field() -> String {
    let name = unet_attention::cuda::fused_variant().map_or("invalid", |v| v.name());
    let splits = match unet_attention::cuda::fused_splits() {
        Ok(Some(n)) => n.to_string(),
        Ok(None) => "auto".to_string(),
        Err(_) => "invalid".to_string(),
    };
    format!(", \"fused_variant\": \"{name}\", \"fused_splits\": \"{splits}\"")
}

#[cfg(not(feature = "cuda"))]
fn fused_variant_field() -> String {
    String::new()
}

/// The device of `--device` opened, and `--dtype`.
fn place(opts: &Options) -> Result<common::On, String> {
    let opened = match opts.place {
        Place::Cpu => Ok(Device::Cpu),
        Place::Cuda(n) => Device::new_cuda(n),
        Place::Metal(n) => Device::new_metal(n),
    };
    let device = opened.map_err(|e| format!("cannot open device {}: {e}", opts.device))?;
    Ok(common::On {
        device,
        dtype: opts.dtype,
    })
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

    /// The layer GEMM's own register tile on L1-resident operands (`unet_attention::cpu_kernels::
    /// tile_flops`), best of 5 runs, for `A` read as rows, as one interleaved micro-panel, and
    /// (AVX-512) as rows by the three-base candidate loop.
    #[cfg(target_arch = "x86_64")]
    fn tile_rates() -> Vec<String> {
        let kernel = unet_attention::cpu_kernels::layer_kernel_isa();
        let mut fields = vec![format!("\"tile\": \"{kernel}\", \"tile_kc\": 128")];
        for name in ["rows", "interleaved", "rows3"] {
            let best = (0..5)
                .filter_map(|_| {
                    let t = std::time::Instant::now();
                    let flops = unet_attention::cpu_kernels::tile_flops(name, 128, 300_000)?;
                    Some(flops / t.elapsed().as_secs_f64() / 1e9)
                })
                .fold(0.0, f64::max);
            if best > 0.0 {
                fields.push(format!("\"tile_{name}_gflops\": {best:.1}"));
            }
        }
        fields
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
            fields.extend(tile_rates());
            println!("{{\"case\": \"fma-peak (one core)\", {}}}", fields.join(", "));
        }
        #[cfg(not(target_arch = "x86_64"))]
        println!("{{\"case\": \"fma-peak (one core)\", \"error\": \"x86-64 only\"}}");
    }
}

//! One benchmark case, timed and with its peak memory, for `BENCHMARKS.md`:
//!
//! ```text
//! cargo run --release -p unet-attention --example bench_sdpa -- core 1 1 4096 4096 512 [--reps 5]
//! cargo run --release -p unet-attention --example bench_sdpa -- block vae 128 [--reps 3]
//! cargo run --release -p unet-attention --example bench_sdpa -- block ddpm 32
//! ```
//!
//! Prints one JSON line: the times of each repetition (after one warm-up call, unless
//! `--warmup 0`), their median, the resident set before the first call (inputs and weights
//! built) and its peak (`VmHWM`), and the bytes of inputs plus output. `UNET_ATTENTION_SDPA`
//! picks the path as for any caller. `scripts/bench_torch.py` prints the same for PyTorch.

#[path = "../benches/common/mod.rs"]
mod common;

use candle_core::Tensor;
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
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .map_or(default, |i| args[i + 1].parse().expect("a count"))
    };
    let (reps, warmup) = (opt("--reps", 5), opt("--warmup", 1));
    let num = |i: usize| -> usize { args[i].parse().expect("a size") };
    let (case, io_bytes, run): (String, usize, Box<dyn Fn() -> Tensor>) = match args[0].as_str() {
        "core" => {
            let shape = (num(1), num(2), num(3), num(4), num(5));
            let (b, h, lq, lk, d) = shape;
            let (q, k, v) = common::core_inputs(shape);
            let io = 4 * b * h * d * (2 * lq + 2 * lk);
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
                "vae" => common::vae_mid(side),
                "ddpm" => common::ddpm_mid(side),
                other => panic!("unknown block {other}"),
            };
            let io = 2 * 4 * c.input.elem_count();
            let (block, input) = (c.block, c.input);
            (c.name, io, Box::new(move || block.forward(&input).unwrap()))
        }
        other => panic!("unknown case kind {other}: core B H LQ LK D | block vae|ddpm SIDE"),
    };
    let rss_before = status_kib("VmRSS:") / 1024.0;
    for _ in 0..warmup {
        drop(run());
    }
    let mut ms = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        let out = run();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(out);
    }
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let peak = status_kib("VmHWM:") / 1024.0;
    let ms: Vec<String> = ms.iter().map(|x| format!("{x:.2}")).collect();
    println!(
        "{{\"impl\": \"candle\", \"case\": \"{case}\", \"path\": \"{}\", \"cpu_kernel\": \"{}\", \"threads\": {}, \"ms\": [{}], \"median_ms\": {median:.2}, \"rss_before_mib\": {rss_before:.1}, \"peak_rss_mib\": {peak:.1}, \"io_mib\": {:.1}}}",
        sdpa_path().unwrap(),
        unet_attention::sdpa::cpu_kernel_isa(),
        rayon_threads(),
        ms.join(", "),
        mib(io_bytes)
    );
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

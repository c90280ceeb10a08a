//! Calibrating `unet_parity::memory`: the estimate of a check's peak memory against the peak it
//! really takes (`VmHWM`, Linux).
//!
//! ```text
//! cargo run --release -p unet-parity --example memory_peak -- measure BUNDLE [f32|f16|bf16|f64]
//! cargo run --release -p unet-parity --example memory_peak -- repeat IN OUT N
//! ```
//!
//! `measure` checks one bundle (run it once per bundle: the peak is the process's) and prints
//! `file estimate peak ratio pass`. `repeat` writes a bigger bundle: every input and output
//! (and float64 twin) repeated N times along dim 0, the batch, where the outputs of N copies of
//! the batch are N copies of the outputs, so the bundle still passes.

use candle_core::Tensor;
use std::path::Path;
use unet_parity::bundle::{parse_dtype, read_file, read_header, Load};
use unet_parity::memory::{estimate, human};

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn measure(path: &Path, dtype: Option<&str>) {
    let (metadata, infos) = read_header(path).expect("a bundle");
    let e = estimate(&metadata, &infos, Load::NoStages, dtype);
    let opts = unet_parity::Options {
        dtype: dtype.and_then(parse_dtype),
        ..Default::default()
    };
    let pass = match unet_parity::check_file(path, &opts) {
        Ok(r) => if r.pass { "pass" } else { "FAIL" }.to_string(),
        Err(e) => format!("error: {e}"),
    };
    let peak = peak_rss();
    println!(
        "{}\testimate {}\tpeak {}\tratio {:.2}\t{pass}",
        path.display(),
        human(e.bytes),
        human(peak),
        e.bytes as f64 / peak as f64
    );
}

fn repeat(src: &Path, dst: &Path, n: usize) {
    let (metadata, _, tensors) = read_file(src).expect("a bundle");
    let tensors: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(name, t)| {
            let io = name.starts_with("parity.input.") || name.starts_with("parity.output.");
            let t = if io && t.rank() > 0 {
                Tensor::cat(&vec![&t; n], 0).expect("cat")
            } else {
                t
            };
            (name, t)
        })
        .collect();
    let meta: std::collections::HashMap<String, String> = metadata.into_iter().collect();
    let bytes = safetensors::serialize(tensors.iter().map(|(k, v)| (k.as_str(), v)), Some(meta)).expect("serialize");
    std::fs::write(dst, bytes).expect("write");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["measure", file] => measure(Path::new(file), None),
        ["measure", file, dtype] => measure(Path::new(file), Some(dtype)),
        ["repeat", src, dst, n] => repeat(Path::new(src), Path::new(dst), n.parse().expect("N")),
        _ => eprintln!("usage: memory_peak measure BUNDLE [DTYPE] | repeat IN OUT N"),
    }
}

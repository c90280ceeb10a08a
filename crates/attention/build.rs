//! Build script: under the `cuda` feature, compiles each of [`KERNELS`] to PTX with nvcc for
//! `CUDA_COMPUTE_CAP` and writes `$OUT_DIR/<rs>` (`pub(crate) const <NAME>: Option<&str>`), which
//! `src/cuda/` includes: `kernels/fused_attention.cu` → `fused_ptx.rs` (`PTX`, in `launch.rs`),
//! `kernels/fused_layers.cu` → `layers_ptx.rs` (`LAYERS_PTX`, in `layers_launch.rs`). Below
//! compute capability 8.0 (no `mma.sync.m16n8k16` on f16/bf16, no `cp.async`, and bf16 without
//! native conversions) nothing is compiled and each const is `None`: attention then takes the
//! chunked path and the layers Candle's ops. Without the feature the script does nothing (no nvcc
//! needed).
//!
//! nvcc: `$NVCC`, else `$CUDA_HOME/bin/nvcc` or `$CUDA_PATH/bin/nvcc`, else `nvcc` on the PATH.
//! Compute capability: `CUDA_COMPUTE_CAP` (`80`, `8.0`, `90a`...), else the first GPU that
//! `nvidia-smi` lists, else 80.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `(source, generated Rust file, const name)` of each kernel.
const KERNELS: [(&str, &str, &str); 2] = [
    ("kernels/fused_attention.cu", "fused_ptx.rs", "PTX"),
    ("kernels/fused_layers.cu", "layers_ptx.rs", "LAYERS_PTX"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for (source, _, _) in KERNELS {
        println!("cargo::rerun-if-changed={source}");
    }
    // Included by kernels/fused_attention.cu.
    for header in ["kernels/attention_steps.cuh", "kernels/attention_wide.cuh"] {
        println!("cargo::rerun-if-changed={header}");
    }
    for var in ["CUDA_COMPUTE_CAP", "NVCC", "CUDA_HOME", "CUDA_PATH"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let (arch, cap) = compute_cap();
    if cap < 80 {
        println!(
            "cargo::warning=CUDA_COMPUTE_CAP {arch} is below 8.0: no fused kernels (the chunked attention path and Candle's ops run)"
        );
        for (_, rs, name) in KERNELS {
            write(
                &out_dir.join(rs),
                &format!("/// No PTX: built for a GPU below compute capability 8.0.\npub(crate) const {name}: Option<&str> = None;\n"),
            );
        }
        return;
    }
    let nvcc = nvcc();
    for (source, rs, name) in KERNELS {
        let stem = Path::new(source).file_stem().expect("a file name").to_string_lossy();
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "--expt-relaxed-constexpr"])
            .arg(format!("-arch=sm_{arch}"))
            .arg("-o")
            .arg(&ptx)
            .arg(source)
            .status()
            .unwrap_or_else(|e| panic!("could not run nvcc ({}): {e}; set NVCC or CUDA_HOME", nvcc.display()));
        if !status.success() {
            panic!("nvcc failed on {source} for sm_{arch} ({status})");
        }
        write(
            &out_dir.join(rs),
            &format!(
                "/// PTX of `{source}` for sm_{arch}.\npub(crate) const {name}: Option<&str> = Some(include_str!({:?}));\n",
                ptx.display().to_string()
            ),
        );
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("could not write {}: {e}", path.display()));
}

/// `(arch for -arch=sm_XX, numeric capability)`, e.g. `("90a", 90)`.
fn compute_cap() -> (String, u32) {
    let raw = env::var("CUDA_COMPUTE_CAP")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            let out = Command::new("nvidia-smi")
                .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.lines().next().map(str::to_string).filter(|s| !s.trim().is_empty())
        });
    let raw = raw.unwrap_or_else(|| "80".to_string());
    let arch: String = raw.trim().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let digits: String = arch.chars().take_while(char::is_ascii_digit).collect();
    let cap = digits
        .parse()
        .unwrap_or_else(|_| panic!("CUDA_COMPUTE_CAP={raw:?}: expected a compute capability such as 80, 8.0 or 90a"));
    (arch, cap)
}

fn nvcc() -> PathBuf {
    if let Some(p) = env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let p = Path::new(&home).join("bin").join("nvcc");
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from("nvcc")
}

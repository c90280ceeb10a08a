//! Build script: under the `cuda` feature, compiles each of [`KERNELS`] with nvcc into a CUDA fat
//! binary and writes `$OUT_DIR/<rs>` (`pub(crate) const <NAME>: &[u8]`, the image's bytes), which
//! `src/cuda/` includes: `kernels/fused_attention.cu` → `fused_image.rs` (`FUSED_IMAGE`, in
//! `launch.rs`), `kernels/fused_layers.cu` → `layers_image.rs` (`LAYERS_IMAGE`, in
//! `layers_launch.rs`). Without the feature the script does nothing (no nvcc needed).
//!
//! The image holds machine code (SASS) for each architecture of `UNET_ATTENTION_CUDA_ARCHS`
//! (comma-separated, each 80 or over; default `80,90`: sm_80 runs on every 8.x GPU, A100, A10,
//! RTX 30/40, L4, L40; sm_90 on H100/H200) and the PTX of the lowest one, which the driver
//! compiles at load on newer GPUs (Blackwell). A GPU with its own SASS loads in milliseconds;
//! PTX alone costs minutes of the driver's ptxas for the attention kernels' 80 entry points at
//! the first call. Which entry a GPU runs, or whether it falls back, is decided at run time
//! from the image itself (`src/cuda_plan/image.rs`, included here to check the image).
//!
//! ptxas's `-v` report goes to `$OUT_DIR/<stem>.ptxas.log` (`.ci/cuda-check` reads it for
//! register spills), with the seconds nvcc took on its last line. nvcc takes about two minutes
//! of one core for the attention kernels at the default architectures; with
//! `UNET_ATTENTION_KERNEL_CACHE` set to a folder, images are kept there by a hash of the kernel
//! sources, nvcc's version and its arguments, and reused (`.ci/cuda-check` sets it, so that its
//! `cuda` and `cudnn` checks compile once).
//!
//! nvcc: `$NVCC`, else `$CUDA_HOME/bin/nvcc` or `$CUDA_PATH/bin/nvcc`, else `nvcc` on the PATH.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[allow(dead_code)]
#[path = "src/cuda_plan/image.rs"]
mod image;

/// `(source, generated Rust file, const name)` of each kernel.
const KERNELS: [(&str, &str, &str); 2] = [
    ("kernels/fused_attention.cu", "fused_image.rs", "FUSED_IMAGE"),
    ("kernels/fused_layers.cu", "layers_image.rs", "LAYERS_IMAGE"),
];

/// Included by the kernel files.
const HEADERS: [&str; 2] = ["kernels/attention_steps.cuh", "kernels/attention_wide.cuh"];

/// The default of `UNET_ATTENTION_CUDA_ARCHS`.
const DEFAULT_ARCHS: &str = "80,90";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/cuda_plan/image.rs");
    for path in KERNELS.map(|k| k.0).iter().chain(&HEADERS) {
        println!("cargo::rerun-if-changed={path}");
    }
    for var in [
        "UNET_ATTENTION_CUDA_ARCHS",
        "UNET_ATTENTION_KERNEL_CACHE",
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let archs = archs();
    let nvcc = nvcc();
    let args = nvcc_args(&archs);
    let cache = env::var_os("UNET_ATTENTION_KERNEL_CACHE").map(PathBuf::from);
    for (source, rs, name) in KERNELS {
        let stem = Path::new(source).file_stem().expect("a file name").to_string_lossy();
        let fatbin = out_dir.join(format!("{stem}.fatbin"));
        let log = out_dir.join(format!("{stem}.ptxas.log"));
        let cached = cache.as_ref().map(|dir| {
            let key = cache_key(&nvcc, &args, source);
            (
                dir.join(format!("{stem}-{key:016x}.fatbin")),
                dir.join(format!("{stem}-{key:016x}.ptxas.log")),
            )
        });
        match &cached {
            Some((f, l)) if f.exists() && l.exists() => {
                copy(f, &fatbin);
                copy(l, &log);
            }
            _ => {
                compile(&nvcc, &args, source, &fatbin, &log);
                if let Some((f, l)) = &cached {
                    std::fs::create_dir_all(f.parent().expect("a folder")).ok();
                    // The log last: it marks the image complete (a reader wants both).
                    publish(&fatbin, f);
                    publish(&log, l);
                }
            }
        }
        let bytes = std::fs::read(&fatbin).unwrap_or_else(|e| panic!("could not read {}: {e}", fatbin.display()));
        let entries = image::fatbin_entries(&bytes).unwrap_or_else(|e| panic!("{}: {e}", fatbin.display()));
        let want: Vec<image::Entry> = archs
            .iter()
            .map(|&a| image::Entry::Sass(a))
            .chain([image::Entry::Ptx(archs[0])])
            .collect();
        for e in &want {
            assert!(
                entries.contains(e),
                "{}: no {} in {entries:?}",
                fatbin.display(),
                image::describe(*e)
            );
        }
        let held: Vec<String> = entries.iter().map(|e| image::describe(*e)).collect();
        write(
            &out_dir.join(rs),
            &format!(
                "/// The fat binary of `{source}` ({}, {} bytes).\npub(crate) const {name}: &[u8] = include_bytes!({:?});\n",
                held.join(", "),
                bytes.len(),
                fatbin.display().to_string()
            ),
        );
    }
}

/// The SASS architectures to build, sorted, from `UNET_ATTENTION_CUDA_ARCHS` (`80,90`, `sm_86`,
/// `8.6` ...).
fn archs() -> Vec<u32> {
    let raw = env::var("UNET_ATTENTION_CUDA_ARCHS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ARCHS.to_string());
    let mut archs: Vec<u32> = raw
        .split(',')
        .map(|a| {
            let digits: String = a.trim().trim_start_matches("sm_").chars().filter(|c| *c != '.').collect();
            match digits.parse::<u32>() {
                Ok(n) if n >= 80 => n,
                _ => panic!(
                    "UNET_ATTENTION_CUDA_ARCHS={raw:?}: expected architectures of 8.0 or over such as 80,86,90 (below 8.0 the kernels do not run; the chunked path and Candle's ops do)"
                ),
            }
        })
        .collect();
    archs.sort_unstable();
    archs.dedup();
    archs
}

/// nvcc's arguments for a fat binary of SASS for `archs` and the PTX of the lowest, every image
/// compressed (the driver decompresses at load), with ptxas's resource report; the architectures
/// are compiled in parallel, one thread per CPU (`--threads 0`: ptxas on 80 kernels is most of
/// the time, and each architecture's is independent).
fn nvcc_args(archs: &[u32]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--fatbin",
        "-O3",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "--threads",
        "0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["-Xptxas", "-v", "-Xfatbin", "-compress-all"].map(String::from));
    for a in archs {
        args.push(format!("-gencode=arch=compute_{a},code=sm_{a}"));
    }
    args.push(format!("-gencode=arch=compute_{0},code=compute_{0}", archs[0]));
    args
}

/// Runs nvcc on `source` into `fatbin`, its stderr (ptxas's report) and the seconds it took into
/// `log`.
fn compile(nvcc: &Path, args: &[String], source: &str, fatbin: &Path, log: &Path) {
    let start = Instant::now();
    let out = Command::new(nvcc)
        .args(args)
        .arg("-o")
        .arg(fatbin)
        .arg(source)
        .output()
        .unwrap_or_else(|e| panic!("could not run nvcc ({}): {e}; set NVCC or CUDA_HOME", nvcc.display()));
    let report = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!("nvcc failed on {source} ({}):\n{report}", out.status);
    }
    let secs = start.elapsed().as_secs_f64();
    write(log, &format!("{report}nvcc took {secs:.1} s for {source}\n"));
}

/// FNV-1a over nvcc's version, its arguments and every kernel source and header.
fn cache_key(nvcc: &Path, args: &[String], source: &str) -> u64 {
    let version = Command::new(nvcc)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes.iter().chain(&[0xff]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(&version);
    eat(args.join(" ").as_bytes());
    for path in [source].iter().chain(&HEADERS) {
        eat(&std::fs::read(path).unwrap_or_else(|e| panic!("could not read {path}: {e}")));
    }
    h
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("could not copy {} to {}: {e}", from.display(), to.display()));
}

/// `from` copied to `to` under another name first, then renamed: a concurrent build never reads
/// half a file.
fn publish(from: &Path, to: &Path) {
    let partial = to.with_extension(format!("partial-{}", std::process::id()));
    copy(from, &partial);
    std::fs::rename(&partial, to).unwrap_or_else(|e| panic!("could not rename {}: {e}", partial.display()));
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("could not write {}: {e}", path.display()));
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

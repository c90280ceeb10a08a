//! The CPU emulation of this crate's CUDA kernels, for the unit tests: builds
//! `kernels/emu/runner.cpp` (both kernel files under `kernels/emu/cuda_emu.h`) with the system's
//! C++ compiler once per source text, and runs [`Request`]s through it: buffers, then launches as
//! the Rust launch code plans them, then the buffers asked for back.
//!
//! They run in a lane of their own (two minutes of a sanitized C++ build and emulation, which a
//! user's `cargo test --workspace` need not wait for): only with `UNET_ATTENTION_EMULATOR=1`, or
//! with `UNET_ATTENTION_REQUIRE_EMULATOR` set (as `.ci/run`'s emulator lane does); otherwise each
//! says it skipped. Needs a C++17 compiler (`$CXX`, else `c++`, `g++` or `clang++`). Without one
//! the tests say so and pass, unless `UNET_ATTENTION_REQUIRE_EMULATOR` is set, which makes a
//! missing compiler a failure.

use crate::test_support::seeded_randn;
use candle_core::DType;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The compile flags, first with AddressSanitizer and UBSan (they catch a kernel's read or write
/// past the end of a buffer or of shared memory, each allocated exactly as long as the launch
/// says, and signed overflow in its index arithmetic), then without them for a compiler that
/// lacks their runtime libraries.
const FLAG_SETS: [&[&str]; 2] = [
    &[
        "-std=c++17",
        "-O1",
        "-fsanitize=address,undefined",
        "-DUNET_CUDA_EMULATE",
        "-Wall",
        "-Wno-unknown-pragmas",
    ],
    &[
        "-std=c++17",
        "-O1",
        "-DUNET_CUDA_EMULATE",
        "-Wall",
        "-Wno-unknown-pragmas",
    ],
];

/// What the runner is built from (relative to `kernels/`).
const SOURCES: [&str; 6] = [
    "fused_attention.cu",
    "attention_steps.cuh",
    "attention_wide.cuh",
    "fused_layers.cu",
    "emu/cuda_emu.h",
    "emu/runner.cpp",
];

/// The runner binary, built once (`None`: no C++ compiler, the caller's test is skipped).
pub(super) fn runner() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        if !wanted() {
            eprintln!(
                "skipped: the emulated CUDA kernels run in their own lane (UNET_ATTENTION_EMULATOR=1, or .ci/run)"
            );
            return None;
        }
        build()
    })
    .as_deref()
}

/// The emulated kernels are asked for: `UNET_ATTENTION_EMULATOR=1`, or
/// `UNET_ATTENTION_REQUIRE_EMULATOR` set.
fn wanted() -> bool {
    std::env::var_os("UNET_ATTENTION_REQUIRE_EMULATOR").is_some()
        || std::env::var("UNET_ATTENTION_EMULATOR").is_ok_and(|v| v.trim() == "1")
}

fn build() -> Option<PathBuf> {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&FLAG_SETS, &mut hasher);
    for s in SOURCES {
        let text = std::fs::read(kernels.join(s)).unwrap_or_else(|e| panic!("read kernels/{s}: {e}"));
        std::hash::Hash::hash(&text, &mut hasher);
    }
    let dir = Path::new(env!("OUT_DIR")).join("cuda-emulator");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(format!("runner-{:016x}", std::hash::Hasher::finish(&hasher)));
    if bin.exists() {
        return Some(bin);
    }
    let compilers: Vec<String> = match std::env::var("CXX") {
        Ok(cxx) => vec![cxx],
        Err(_) => ["c++", "g++", "clang++"].map(String::from).to_vec(),
    };
    let tmp = dir.join(format!("build-{}", std::process::id()));
    for cxx in &compilers {
        let mut errors = String::new();
        for flags in FLAG_SETS {
            let out = Command::new(cxx)
                .args(flags)
                .arg("-I")
                .arg(&kernels)
                .arg(kernels.join("emu/runner.cpp"))
                .arg("-o")
                .arg(&tmp)
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    std::fs::rename(&tmp, &bin).unwrap();
                    return Some(bin);
                }
                Ok(o) => errors += &format!("{cxx} {}:\n{}\n", flags.join(" "), String::from_utf8_lossy(&o.stderr)),
                Err(_) => break, // not installed: try the next name
            }
        }
        if !errors.is_empty() {
            panic!("could not build the CUDA emulation (kernels/emu/runner.cpp):\n{errors}");
        }
    }
    if std::env::var_os("UNET_ATTENTION_REQUIRE_EMULATOR").is_some() {
        panic!("no C++ compiler ({compilers:?}) for the CUDA emulation, and UNET_ATTENTION_REQUIRE_EMULATOR is set");
    }
    eprintln!("skipped: no C++ compiler ({compilers:?}) to build the CUDA emulation");
    None
}

/// One kernel argument.
#[derive(Debug, Clone)]
pub(super) enum Arg {
    /// A buffer's address (`None`: a null pointer).
    Buf(Option<usize>),
    I32(i32),
    I64(i64),
    F32(f32),
    /// A struct passed by value whose first `pointers` u64 fields hold buffer index + 1 (0:
    /// null), replaced by the buffers' addresses.
    Struct {
        bytes: Vec<u8>,
        pointers: u32,
    },
}

/// What a buffer starts as.
enum Fill {
    Data(Vec<u8>),
    /// 0xff bytes: NaN in every float dtype, so an element no kernel wrote shows.
    Garbage(usize),
}

/// Buffers and launches for one run of the runner.
#[derive(Default)]
pub(super) struct Request {
    late_copies: bool,
    seed: u64,
    buffers: Vec<Fill>,
    launches: Vec<u8>,
    count: u32,
}

fn put_u32(w: &mut Vec<u8>, x: u32) {
    w.extend(x.to_le_bytes());
}

fn put_u64(w: &mut Vec<u8>, x: usize) {
    w.extend((x as u64).to_le_bytes());
}

impl Request {
    /// `late_copies`: `cp.async` lands at the thread's wait rather than at once. `seed`: 0 runs
    /// the threads in order, round after round; else it seeds a random schedule in which some
    /// warps run ahead of others (`emu::Config` in `kernels/emu/cuda_emu.h`).
    pub(super) fn new(late_copies: bool, seed: u64) -> Request {
        Request {
            late_copies,
            seed,
            ..Request::default()
        }
    }

    fn buffer(&mut self, f: Fill) -> usize {
        self.buffers.push(f);
        self.buffers.len() - 1
    }

    /// A buffer holding `bytes`.
    pub(super) fn data(&mut self, bytes: Vec<u8>) -> usize {
        self.buffer(Fill::Data(bytes))
    }

    /// A buffer of `bytes` bytes 0xff (NaN however read as floats).
    pub(super) fn garbage(&mut self, bytes: usize) -> usize {
        self.buffer(Fill::Garbage(bytes))
    }

    /// Launches `kernel` on `grid` blocks of `threads` threads with `smem` bytes of dynamic
    /// shared memory.
    pub(super) fn launch(&mut self, kernel: &str, grid: (u32, u32, u32), threads: u32, smem: usize, args: &[Arg]) {
        let w = &mut self.launches;
        put_u32(w, kernel.len() as u32);
        w.extend(kernel.as_bytes());
        for x in [grid.0, grid.1, grid.2, threads] {
            put_u32(w, x);
        }
        put_u64(w, smem);
        put_u32(w, args.len() as u32);
        for a in args {
            match a {
                Arg::Buf(b) => {
                    put_u32(w, 0);
                    put_u32(w, b.map_or(u32::MAX, |i| i as u32));
                }
                Arg::I32(x) => {
                    put_u32(w, 1);
                    w.extend(x.to_le_bytes());
                }
                Arg::I64(x) => {
                    put_u32(w, 2);
                    w.extend(x.to_le_bytes());
                }
                Arg::F32(x) => {
                    put_u32(w, 3);
                    w.extend(x.to_le_bytes());
                }
                Arg::Struct { bytes, pointers } => {
                    put_u32(w, 4);
                    put_u32(w, bytes.len() as u32);
                    put_u32(w, *pointers);
                    w.extend(bytes);
                }
            }
        }
        self.count += 1;
    }

    /// Runs the launches in order on `bin`; the bytes of each buffer of `outputs`. Panics with
    /// the runner's message (`what` says which case) when it fails.
    pub(super) fn run(self, bin: &Path, outputs: &[usize], what: &dyn std::fmt::Debug) -> Vec<Vec<u8>> {
        self.run_counted(bin, outputs, what).0
    }

    /// [`Request::run`], and what the launches asked of the memory system ([`Traffic`]).
    pub(super) fn run_counted(
        self,
        bin: &Path,
        outputs: &[usize],
        what: &dyn std::fmt::Debug,
    ) -> (Vec<Vec<u8>>, Traffic) {
        let mut req = Vec::new();
        put_u32(&mut req, 0x554d_4555);
        put_u32(&mut req, self.late_copies as u32);
        req.extend(self.seed.to_le_bytes());
        put_u32(&mut req, self.buffers.len() as u32);
        let mut sizes = Vec::new();
        for b in &self.buffers {
            let (n, fill) = match b {
                Fill::Data(d) => (d.len(), 0),
                Fill::Garbage(n) => (*n, 2),
            };
            put_u64(&mut req, n);
            put_u32(&mut req, fill);
            if let Fill::Data(d) = b {
                req.extend(d);
            }
            sizes.push(n);
        }
        put_u32(&mut req, self.count);
        req.extend(&self.launches);
        put_u32(&mut req, outputs.len() as u32);
        for &o in outputs {
            put_u32(&mut req, o as u32);
        }
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&req).unwrap();
        let done = child.wait_with_output().unwrap();
        assert!(
            done.status.success(),
            "{what:?}: the emulated kernels failed ({}):\n{}",
            done.status,
            String::from_utf8_lossy(&done.stderr)
        );
        let want: usize = outputs.iter().map(|&o| sizes[o]).sum::<usize>() + 7 * 8;
        assert_eq!(done.stdout.len(), want, "{what:?}: the runner's answer length");
        let mut at = 0;
        let buffers = outputs
            .iter()
            .map(|&o| {
                let part = done.stdout[at..at + sizes[o]].to_vec();
                at += sizes[o];
                part
            })
            .collect();
        let c: Vec<u64> = done.stdout[at..]
            .chunks_exact(8)
            .map(|x| u64::from_le_bytes(x.try_into().unwrap()))
            .collect();
        let traffic = Traffic {
            ldmatrix_phases: c[0],
            ldmatrix_wavefronts: c[1],
            copy_phases: c[2],
            copy_wavefronts: c[3],
            copy_bytes: c[4],
            copy_sectors: c[5],
            mma: c[6],
        };
        (buffers, traffic)
    }
}

/// What a run's launches asked of the memory system, counted by the emulator (`emu::Traffic` in
/// `kernels/emu/cuda_emu.h`): a static view of the access patterns, not a timing. A phase is 8
/// sixteen-byte shared accesses (one `ldmatrix` matrix, or a quarter of a warp's `cp.async`
/// stores); it takes one wavefront when its addresses fall in distinct bank groups, more when
/// they conflict. The global side of `cp.async`: bytes asked for, 32-byte sectors touched per
/// warp instruction. And the warps' `mma.m16n8k16` instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Traffic {
    pub ldmatrix_phases: u64,
    pub ldmatrix_wavefronts: u64,
    pub copy_phases: u64,
    pub copy_wavefronts: u64,
    pub copy_bytes: u64,
    pub copy_sectors: u64,
    pub mma: u64,
}

impl Traffic {
    /// Wavefronts per phase of `ldmatrix` (1.0: no bank conflicts).
    pub fn ldmatrix_ways(&self) -> f64 {
        self.ldmatrix_wavefronts as f64 / self.ldmatrix_phases.max(1) as f64
    }

    /// `ldmatrix.x4` instructions (4 phases each) per `mma` instruction: how many shared-memory
    /// fragment reads each tensor-core instruction costs.
    pub fn ldmatrix_per_mma(&self) -> f64 {
        self.ldmatrix_phases as f64 / 4.0 / self.mma.max(1) as f64
    }

    /// Wavefronts per phase of the `cp.async` shared stores (1.0: no bank conflicts).
    pub fn copy_ways(&self) -> f64 {
        self.copy_wavefronts as f64 / self.copy_phases.max(1) as f64
    }

    /// Bytes asked for over bytes of the sectors touched, of the `cp.async` reads (1.0: every
    /// sector fully used).
    pub fn copy_sector_use(&self) -> f64 {
        self.copy_bytes as f64 / (32 * self.copy_sectors).max(1) as f64
    }
}

/// `n` normal values from `seed` ([`seeded_randn`]) times `gain`, rounded to `dtype`.
pub(super) fn normals(seed: u64, n: usize, gain: f64, dtype: DType) -> Vec<f32> {
    let x = seeded_randn(&[n], seed).to_vec1::<f32>().unwrap();
    x.into_iter().map(|v| round(dtype, (v as f64 * gain) as f32)).collect()
}

/// `x` rounded to `dtype` (f16, bf16 or f32), as f32.
pub(super) fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The bytes of `x` in `dtype` (f16, bf16 or f32).
pub(super) fn encode(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut w = Vec::with_capacity(x.len() * 4);
    for &e in x {
        match dtype {
            DType::F16 => w.extend(half::f16::from_f32(e).to_le_bytes()),
            DType::BF16 => w.extend(half::bf16::from_f32(e).to_le_bytes()),
            _ => w.extend(e.to_le_bytes()),
        }
    }
    w
}

/// The values of `bytes` in `dtype` (f16, bf16 or f32).
pub(super) fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|x| half::f16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|x| half::bf16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect(),
    }
}

/// Bytes per element of `dtype` (f16, bf16 or f32).
pub(super) fn elem_size(dtype: DType) -> usize {
    if dtype == DType::F32 {
        4
    } else {
        2
    }
}

//! The one helper of the workspace's integration tests: run the CLI in-process (or as a child
//! process under limits), write modified bundles, read the pictures `show` draws. Compiled into
//! unet-parity's test binaries (`crates/parity/tests/{cli,hostile}`) and the root package's
//! (`tests/e2e`, `tests/accuracy.rs`, through `#[path]`), so each binary uses only part of it.
#![allow(dead_code)]

use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use unet_parity::show::{SCALE_STRIP, TITLE_STRIP};

/// The repository root (the committed bundles live in `weights/`): two folders above
/// unet-parity's manifest, or the root package's own folder.
pub fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match env!("CARGO_PKG_NAME") {
        "unet-parity" => manifest.ancestors().nth(2).unwrap().to_path_buf(),
        _ => manifest.to_path_buf(),
    }
}

pub fn weights() -> PathBuf {
    root().join("weights")
}

/// Exit code, stdout and stderr of `unet-parity ARGS`, run in-process through the same
/// function the binary calls.
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let mut out = vec![];
    let mut err = vec![];
    let argv: Vec<&str> = std::iter::once("unet-parity").chain(args.iter().copied()).collect();
    let code = unet_parity::cli::run(argv, &mut out, &mut err);
    (
        code,
        String::from_utf8_lossy(&out).into(),
        String::from_utf8_lossy(&err).into(),
    )
}

/// A fresh, empty scratch folder for one test, named by the calling file and `name` (and made
/// unique by `tempfile`), removed when the returned guard drops, unless the test is panicking:
/// then it is kept, and its path printed, for a look at what the test wrote.
#[track_caller]
pub fn scratch(name: &str) -> Scratch {
    let file = Path::new(std::panic::Location::caller().file());
    let stem = file.file_stem().unwrap().to_string_lossy();
    let dir = tempfile::Builder::new()
        .prefix(&format!("unet-parity-test-{stem}-{name}-"))
        .tempdir()
        .unwrap();
    Scratch(Some(dir))
}

/// A scratch folder ([`scratch`]): derefs to its path.
pub struct Scratch(Option<tempfile::TempDir>);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let dir = self.0.take().unwrap();
        if std::thread::panicking() {
            eprintln!("(scratch folder kept: {})", dir.keep().display());
        }
    }
}

/// A bundle's tensors and metadata, for tests that edit them.
pub struct RawBundle {
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: HashMap<String, String>,
}

impl RawBundle {
    pub fn read(path: &Path) -> Self {
        let (metadata, _, tensors) = unet_parity::bundle::read_file(path).unwrap();
        Self {
            tensors,
            metadata: metadata.into_iter().collect(),
        }
    }

    pub fn write(&self, path: &Path) {
        let bytes = safetensors::serialize(
            self.tensors.iter().map(|(k, v)| (k.as_str(), v)),
            Some(self.metadata.clone()),
        )
        .unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// The committed bundle `weights/<rel>`, edited by `edit`, written to `dir/<file name>`.
    pub fn edited(rel: &str, dir: &Path, edit: impl FnOnce(&mut RawBundle)) -> PathBuf {
        let mut b = RawBundle::read(&weights().join(rel));
        edit(&mut b);
        let path = dir.join(Path::new(rel).file_name().unwrap());
        b.write(&path);
        path
    }
}

/// Every committed bundle file, sorted.
pub fn committed_bundles() -> Vec<PathBuf> {
    unet_parity::bundle::collect(&[weights()]).unwrap()
}

/// Decode an RGB PNG: (width, height, pixels).
pub fn read_png(path: &Path) -> (usize, usize, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width as usize, info.height as usize, buf)
}

/// The background `show` draws on (never a colour of its colour map).
pub const BACKGROUND: [u8; 3] = [96, 96, 96];

/// The left edges of a picture's panel columns and the panels' width: the runs of non-background
/// pixels along the first panel row (4 px under the title strip).
pub fn panel_columns(w: usize, px: &[u8]) -> (Vec<usize>, usize) {
    let y = TITLE_STRIP + 4;
    let drawn = |x: usize| px[(y * w + x) * 3..(y * w + x) * 3 + 3] != BACKGROUND;
    let starts: Vec<usize> = (0..w).filter(|&x| drawn(x) && (x == 0 || !drawn(x - 1))).collect();
    let width = (starts[0]..w).take_while(|&x| drawn(x)).count();
    (starts, width)
}

/// How far apart a correct port's attention maps may be drawn, in colour levels (0–255) of any
/// channel: PyTorch's and our weights differ by rounding (~1e-6 of the scale, which depends on the
/// CPU's kernels), which moves a pixel by at most one level of the colour map (its steepest
/// channel climbs 680 levels over the whole scale); a broken port moves them by tens to hundreds.
pub const PANEL_LEVELS: u8 = 2;

/// The largest difference, in colour levels of any channel, between the PyTorch and ours panels of
/// the attention picture (its first two panel columns, between the title strip and the scale bars).
pub fn probs_panels_max_diff(path: &Path) -> u8 {
    let (w, h, px) = read_png(path);
    let (starts, panel) = panel_columns(w, &px);
    assert_eq!(starts.len(), 3, "{}: PyTorch | ours | difference", path.display());
    let mut most = 0;
    for y in TITLE_STRIP..h - SCALE_STRIP {
        for x in 0..panel {
            let a = (y * w + starts[0] + x) * 3;
            let b = (y * w + starts[1] + x) * 3;
            for k in 0..3 {
                most = most.max(px[a + k].abs_diff(px[b + k]));
            }
        }
    }
    most
}

/// PyTorch's and our attention maps are the same picture, up to [`PANEL_LEVELS`]: true for a
/// correct port on any CPU, false for a broken one.
pub fn probs_panels_agree(path: &Path) -> bool {
    probs_panels_max_diff(path) <= PANEL_LEVELS
}

// ---- The CLI in a child process, under limits ----

/// The environment variable that turns a test binary's `cli_child` test into the CLI: its
/// arguments, one a line. Every test binary that calls [`run_limited`] defines, at its top level
/// (the child runs `cli_child --exact`), `#[test] fn cli_child() { common::cli_child() }`.
pub const CHILD: &str = "UNET_PARITY_TEST_CLI_ARGS";
/// The child's address-space limit (`ulimit -v`, KiB): 4 GiB, the limit issue 20 sets.
pub const LIMIT_KIB: u64 = 4 << 20;
/// The most a hostile input may take.
pub const SECONDS: u64 = 20;

/// The body of each test binary's `cli_child` test: with [`CHILD`] set, be the CLI (the same
/// `cli::run` the binary calls) and exit with its code; without it, nothing.
pub fn cli_child() {
    let Ok(args) = std::env::var(CHILD) else { return };
    let args: Vec<&str> = args.lines().collect();
    let (code, out, err) = cli(&args);
    print!("{out}");
    eprint!("{err}");
    if std::env::var_os(PEAK).is_some() {
        eprintln!("{PEAK_LINE}{}", peak_rss());
    }
    std::process::exit(code);
}

/// With this variable set, the child prints its peak resident memory last on stderr
/// (`peak-rss: BYTES`, from `VmHWM`).
pub const PEAK: &str = "UNET_PARITY_TEST_PEAK";
const PEAK_LINE: &str = "peak-rss: ";

/// The peak resident memory of this process (`VmHWM`, Linux; 0 elsewhere).
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

impl Child {
    /// The peak resident memory the child printed (run with [`PEAK`] set).
    pub fn peak(&self) -> u64 {
        self.err
            .lines()
            .find_map(|l| l.strip_prefix(PEAK_LINE))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no peak line: {}", self.err))
    }
}

/// What a child run of the CLI did.
pub struct Child {
    /// The exit code, or `-signal`.
    pub code: i32,
    pub out: String,
    pub err: String,
    pub took: std::time::Duration,
}

/// `unet-parity ARGS` in a child process (this test binary's `cli_child`) under the
/// address-space limit [`LIMIT_KIB`], with `env` added to its environment. The test fails if it
/// runs past [`SECONDS`].
pub fn run_limited(args: &[&str], env: &[(&str, &str)]) -> Child {
    run_limited_within(args, env, std::time::Duration::from_secs(SECONDS))
}

/// [`run_limited`] with another limit on its time (a test whose child runs a whole model's
/// forward: the limit is for a hang, not a measure of speed).
pub fn run_limited_within(args: &[&str], env: &[(&str, &str)], limit: std::time::Duration) -> Child {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};
    let dir = scratch(&format!(
        "child-{}",
        std::thread::current().name().unwrap_or("t").replace("::", "-")
    ));
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(std::env::current_exe().unwrap())
        .args(["cli_child", "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(CHILD, args.join("\n"))
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Child {
        code: status.code().unwrap_or_else(|| -status.signal().unwrap_or(0)),
        out: read(&out_path),
        err: read(&err_path),
        took: start.elapsed(),
    }
}

// ---- Synthetic whole-model checkpoints ----

/// A `VarBuilder` backend that makes every weight asked for (small deterministic values, 1 near
/// for norm weights) and keeps them: build a model on it to get a checkpoint of any config.
#[derive(Clone, Default)]
struct Synth(std::sync::Arc<std::sync::Mutex<BTreeMap<String, Tensor>>>);

impl candle_nn::var_builder::SimpleBackend for Synth {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: candle_core::DType,
        dev: &candle_core::Device,
    ) -> candle_core::Result<Tensor> {
        let seed = name
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32)) as f32;
        let n = s.elem_count();
        let scale = 1.0 / (s.dims().iter().skip(1).product::<usize>().max(1) as f32).sqrt();
        let norm = name.contains("norm") && name.ends_with("weight");
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let x = ((i as f32) * 0.618_034 + seed * 1e-3).sin();
                if norm {
                    1.0 + 0.1 * x
                } else {
                    scale * x
                }
            })
            .collect();
        let t = Tensor::from_vec(v, s, &candle_core::Device::Cpu)?;
        self.0.lock().unwrap().insert(name.to_string(), t.clone());
        t.to_dtype(dtype)?.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, _: candle_core::DType, _: &candle_core::Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("synthetic weights need a shape: {name}")
    }

    /// Only the weights made so far: a block that picks its layout by asking (diffusers'
    /// deprecated attention names) takes the current one.
    fn contains_tensor(&self, name: &str) -> bool {
        self.0.lock().unwrap().contains_key(name)
    }
}

/// The weights a model built by `build` reads, made up (see [`Synth`]), by name.
pub fn synth_weights<T>(
    build: impl FnOnce(candle_nn::VarBuilder) -> unet_attention::Result<T>,
) -> HashMap<String, Tensor> {
    let synth = Synth::default();
    let vb = candle_nn::VarBuilder::from_backend(
        Box::new(synth.clone()),
        candle_core::DType::F32,
        candle_core::Device::Cpu,
    );
    build(vb).unwrap();
    let tensors = synth.0.lock().unwrap().clone();
    tensors.into_iter().collect()
}

/// A diffusers model folder `dir` with `config` (a `config.json` object) and made-up weights for
/// the model `build` builds from it, in one safetensors file.
pub fn synth_folder<T>(
    dir: &Path,
    config: &serde_json::Value,
    build: impl FnOnce(candle_nn::VarBuilder) -> unet_attention::Result<T>,
) -> HashMap<String, Tensor> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let weights = synth_weights(build);
    candle_core::safetensors::save(&weights, dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    weights
}

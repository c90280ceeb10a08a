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

/// A fresh, empty scratch folder for one test, named by the process, the calling file and `name`:
/// the tests of one binary share a process and run in parallel, so `name` need only be unique in
/// its file.
#[track_caller]
pub fn scratch(name: &str) -> PathBuf {
    let file = Path::new(std::panic::Location::caller().file());
    let stem = file.file_stem().unwrap().to_string_lossy();
    let dir = std::env::temp_dir().join(format!("unet-parity-test-{}-{stem}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    std::process::exit(code);
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
        if start.elapsed() > Duration::from_secs(SECONDS) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} ran past {SECONDS} s");
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

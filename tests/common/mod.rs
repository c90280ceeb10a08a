//! Helpers for the end-to-end tests: run the CLI in-process and write modified bundles.
#![allow(dead_code)]

use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use unet_parity::show::{SCALE_STRIP, TITLE_STRIP};

/// The repository root (the committed bundles live in `weights/`).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// A fresh, empty scratch folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("unet-parity-test-{}-{name}", std::process::id()));
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

/// The PyTorch and ours panels of the attention picture (its first two panel columns, between the
/// title strip and the scale bars): equal for a correct port, not for a broken one.
pub fn probs_panels_equal(path: &Path) -> bool {
    let (w, h, px) = read_png(path);
    let (starts, panel) = panel_columns(w, &px);
    assert_eq!(starts.len(), 3, "{}: PyTorch | ours | difference", path.display());
    (TITLE_STRIP..h - SCALE_STRIP).all(|y| {
        (0..panel).all(|x| {
            let a = (y * w + starts[0] + x) * 3;
            let b = (y * w + starts[1] + x) * 3;
            px[a..a + 3] == px[b..b + 3]
        })
    })
}

//! Helpers for the end-to-end tests: run the CLI in-process and write modified bundles.
#![allow(dead_code)]

use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

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

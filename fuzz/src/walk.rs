//! A folder tree built from the input (folders, bundle-named files, FIFOs and symbolic links to
//! `.`, `..`, `/`, siblings and /dev/stdin), then searched as `check FOLDER` searches it, and each
//! bundle found read as `check` reads it. The walk must end (no loop through links), find each
//! file once, stay inside the tree, and never block on a FIFO (libFuzzer's `-timeout` catches a
//! hang).
use std::collections::HashSet;
use std::path::{Path, PathBuf};

const NAMES: [&str; 6] = ["a", "b", "c.safetensors", "d.safetensors", "sub", ".hidden.safetensors"];
const TARGETS: [&str; 8] = [".", "..", "/", "/dev/stdin", "a", "sub", "../a", "c.safetensors"];

/// A small committed bundle, so that some files found are real bundles.
fn bundle_bytes() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let root = super::repo_root();
        std::fs::read(root.join("weights/textbook/self_attention_dx6_d5_dv7.safetensors")).unwrap_or_default()
    })
}

/// Build the tree: each 3 bytes are (what, name, where/target).
fn build(root: &Path, data: &[u8]) {
    let mut dirs = vec![root.to_path_buf()];
    for op in data.chunks_exact(3).take(64) {
        let parent = dirs[op[2] as usize % dirs.len()].clone();
        let path = parent.join(NAMES[op[1] as usize % NAMES.len()]);
        if std::fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        match op[0] % 6 {
            0 => {
                if std::fs::create_dir(&path).is_ok() {
                    dirs.push(path);
                }
            }
            1 => drop(std::fs::write(&path, bundle_bytes())),
            2 => drop(std::fs::write(&path, op)),
            3 => {
                let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid C string; mkfifo only creates a node.
                unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
            }
            _ => drop(std::os::unix::fs::symlink(
                TARGETS[op[2] as usize % TARGETS.len()],
                &path,
            )),
        }
    }
}

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let root: PathBuf = std::env::temp_dir().join(format!("unet-parity-fuzz-walk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    if std::fs::create_dir_all(&root).is_err() {
        return;
    }
    build(&root, data);
    let real_root = std::fs::canonicalize(&root).unwrap();
    if let Ok(found) = unet_parity::files::collect(std::slice::from_ref(&root)) {
        let mut seen = HashSet::new();
        for file in found.bundles.iter().chain(&found.skipped) {
            assert!(file.starts_with(&root), "{file:?} is outside the tree");
            // The walk enters no linked folder, so each path is a real place in the tree.
            let parent = std::fs::canonicalize(file.parent().unwrap()).unwrap();
            assert!(parent.starts_with(&real_root), "{file:?} lies outside the tree");
            assert!(seen.insert(file.clone()), "{file:?} found twice");
            // Reading must not block, whatever the file is.
            let _ = unet_parity::bundle::read_header(file);
            let _ = unet_parity::bundle::Bundle::read(file);
        }
        for link in &found.links {
            assert!(std::fs::symlink_metadata(link).unwrap().file_type().is_symlink());
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

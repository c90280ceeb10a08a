//! Hostile files and folders (issue 20): a folder walk with symlink loops ends and counts each
//! bundle once; a FIFO named like a bundle, a config or a checkpoint is reported, never opened
//! (an `open` on a FIFO blocks); a Hub cache cannot be made to read outside itself.
#![cfg(unix)]

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BUNDLE: &str = "textbook/self_attention_dx6_d5_dv7.safetensors";

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "mkfifo {path:?}");
}

/// `cli`, failing the test (instead of hanging it) if the tool takes more than 60 s.
fn cli_bounded(args: &[&str]) -> (i32, String, String) {
    let start = Instant::now();
    let r = cli(args);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{args:?} took {:?}",
        start.elapsed()
    );
    r
}

#[test]
fn symlink_loops_end_and_count_each_bundle_once() {
    let dir = scratch("hostile-walk");
    std::fs::copy(weights().join(BUNDLE), dir.join("one.safetensors")).unwrap();
    for link in ["a", "b"] {
        std::os::unix::fs::symlink(".", dir.join(link)).unwrap();
    }
    std::os::unix::fs::symlink(&dir, dir.join("self")).unwrap();
    let (code, out, err) = cli_bounded(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 passed, 0 failed"), "{out}");
}

#[test]
fn fifos_are_reported_not_opened() {
    let dir = scratch("hostile-fifo");
    std::fs::copy(weights().join(BUNDLE), dir.join("one.safetensors")).unwrap();
    let fifo = dir.join("pipe.safetensors");
    mkfifo(&fifo);
    // In a folder: the bundle passes, the FIFO is an unusable entry.
    let (code, out, err) = cli_bounded(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("1 passed") && err.contains("not a regular file"),
        "{out}{err}"
    );
    // Named directly, as a config, as weights, to inspect.
    let bundle = dir.join("one.safetensors");
    let (b, f) = (bundle.to_str().unwrap(), fifo.to_str().unwrap());
    for args in [
        vec!["check", f],
        vec!["check", b, "--config", f],
        vec!["check", b, "--weights", f],
        vec!["inspect", f],
    ] {
        let (code, out, err) = cli_bounded(&args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
}

/// A cache whose `refs/main` points out of it (`../../..`), and a `--subfolder` with `..`.
#[test]
fn the_hub_cache_is_not_left() {
    let cache = scratch("hostile-hub");
    let repo = cache.join("models--acme--tiny-unet");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots")).unwrap();
    std::fs::write(repo.join("refs/main"), "../../../../../../etc").unwrap();
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let base = [
        "check",
        bundle.to_str().unwrap(),
        "--repo",
        "acme/tiny-unet",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--offline",
    ];
    let (code, out, err) = cli_bounded(&base);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("commit hash"), "{err}");
    std::fs::write(repo.join("refs/main"), "0123456789abcdef0123456789abcdef01234567").unwrap();
    for sub in ["../../..", "/etc", "unet/../../x"] {
        let (code, out, err) = cli_bounded(&[&base[..], &["--subfolder", sub]].concat());
        assert_eq!(code, 2, "{sub}: {out}{err}");
        assert!(err.contains("--subfolder"), "{sub}: {err}");
    }
}

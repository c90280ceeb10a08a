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

/// A failing bundle whose file name carries a fake `PASS` row, an ANSI "conceal" sequence, a
/// carriage return and a right-to-left override, and whose metadata carries an OSC 52 clipboard
/// write: no command prints any of those characters raw (the table, `inspect`, error lines), so
/// the terminal shows the real `FAIL`.
#[test]
fn names_and_metadata_cannot_steer_the_terminal() {
    let dir = scratch("hostile-terminal");
    let name = "x.safetensors  PASS\n\u{1b}[8m\r\u{202e}LIAF\u{2066}.safetensors";
    let path = RawBundle::edited(BUNDLE, &dir, |b| {
        // A wrong weight: the port no longer matches PyTorch's output, the bundle fails.
        let wrong = (b.tensors["v.weight"].clone() + 1.0).unwrap();
        b.tensors.insert("v.weight".into(), wrong);
        b.metadata
            .insert("note".into(), "\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}".into());
    });
    let hostile = dir.join(name);
    std::fs::rename(&path, &hostile).unwrap();
    let raw = |s: &str| s.chars().any(unet_parity::terminal::is_unsafe);
    for args in [
        vec!["check", dir.to_str().unwrap()],
        vec!["check", "--json", dir.to_str().unwrap()],
        vec!["inspect", hostile.to_str().unwrap()],
    ] {
        let (code, out, err) = cli_bounded(&args);
        assert!(
            !raw(&out) && !raw(&err),
            "{args:?} printed a raw control:\n{out:?}\n{err:?}"
        );
        assert!(!out.contains("\n\u{1b}") && !err.contains('\u{202e}'));
        if args[0] == "check" {
            assert_eq!(code, 1, "{args:?}: {out}{err}");
        }
    }
    let (_, out, _) = cli_bounded(&["check", dir.to_str().unwrap()]);
    assert!(out.contains("\\u202e") && out.contains("FAIL"), "{out}");
}

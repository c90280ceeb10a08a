//! Hostile files and folders (issue 20): a folder walk with symlink loops ends and counts each
//! bundle once; a FIFO named like a bundle, a config or a checkpoint is reported, never opened
//! (an `open` on a FIFO blocks); a Hub cache cannot be made to read outside itself.

use crate::common::*;
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
    // A link to the root: following it would walk the whole machine.
    std::os::unix::fs::symlink("/", dir.join("root")).unwrap();
    let (code, out, err) = cli_bounded(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 passed, 0 failed"), "{out}");
    // Symbolic links to folders are named, not followed.
    assert!(
        err.contains("did not follow 4 symbolic links to folders") && err.contains("root"),
        "{err}"
    );
    // A folder named twice (or inside another one named) is searched once.
    let (code, out, err) = cli_bounded(&["check", dir.to_str().unwrap(), dir.join("a").to_str().unwrap()]);
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
    // A link to /dev/stdin named like a bundle: not a regular file either.
    std::os::unix::fs::symlink("/dev/stdin", dir.join("stdin.safetensors")).unwrap();
    let (code, out, err) = cli_bounded(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("1 passed") && err.contains("stdin.safetensors"),
        "{out}{err}"
    );
    // A sharded index whose shard is a FIFO.
    let shards = scratch("hostile-fifo-shard");
    let index = shards.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {"q.weight": "shard.safetensors"}}"#).unwrap();
    mkfifo(&shards.join("shard.safetensors"));
    // Named directly, as a config, as weights, as a shard, to inspect.
    let bundle = dir.join("one.safetensors");
    let (b, f) = (bundle.to_str().unwrap(), fifo.to_str().unwrap());
    for args in [
        vec!["check", f],
        vec!["check", b, "--config", f],
        vec!["check", b, "--weights", f],
        vec!["check", b, "--weights", index.to_str().unwrap()],
        vec!["detect", index.to_str().unwrap()],
        vec!["inspect", f],
    ] {
        let (code, out, err) = cli_bounded(&args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A Hub cache holding `acme/tiny-unet` (the committed diffusers UNet2DModel) at [`COMMIT`], and
/// the same model in a folder outside the cache. Returns (cache, repo folder, outside folder).
fn hub_cache(name: &str) -> (Scratch, std::path::PathBuf, Scratch) {
    let cache = scratch(name);
    let repo = cache.join("models--acme--tiny-unet");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    let outside = scratch(&format!("{name}-outside"));
    for file in ["config.json", "diffusion_pytorch_model.safetensors"] {
        let model = weights().join("models/diffusers_unet2d").join(file);
        std::fs::copy(&model, snapshot.join(file)).unwrap();
        std::fs::copy(&model, outside.join(file)).unwrap();
    }
    std::fs::write(outside.join("ref"), COMMIT).unwrap();
    (cache, repo, outside)
}

/// A cache cannot send the tool out of itself: a `refs/main` holding `../../..`, an absolute
/// path, or linking out of the cache, a FIFO as `refs/main`, snapshot files linking out, a
/// `--revision` that is a path (whose file would be read as a ref, its content printed), a
/// `--subfolder` with `..`. Each is exit 2 with one line; the same cache with a plain ref passes.
#[test]
fn the_hub_cache_is_not_left() {
    let (cache, repo, outside) = hub_cache("hostile-hub");
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
    let refs = repo.join("refs/main");
    let refused = |args: &[&str], needle: &str| {
        let (code, out, err) = cli_bounded(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{args:?}: {err}");
        err
    };
    for bad in ["../../../../../../etc", outside.to_str().unwrap()] {
        std::fs::write(&refs, bad).unwrap();
        refused(&base, "commit hash");
    }
    std::fs::remove_file(&refs).unwrap();
    std::os::unix::fs::symlink(outside.join("ref"), &refs).unwrap();
    refused(&base, "leads out of the Hub cache");
    std::fs::remove_file(&refs).unwrap();
    mkfifo(&refs);
    refused(&base, "not a regular file");
    std::fs::remove_file(&refs).unwrap();
    std::fs::write(&refs, COMMIT).unwrap();
    let (code, out, err) = cli_bounded(&base);
    assert_eq!(code, 0, "the plain cache passes: {out}{err}");
    // A revision that is a path: refused as a name, the file never read.
    let secret = outside.join("secret");
    std::fs::write(&secret, "TOP-SECRET").unwrap();
    for rev in [secret.to_str().unwrap(), "../../../x", "main/../../x", "a b"] {
        let err = refused(&[&base[..], &["--revision", rev]].concat(), "--revision");
        assert!(!err.contains("TOP-SECRET"), "{err}");
    }
    for sub in ["../../..", "/etc", "unet/../../x"] {
        refused(&[&base[..], &["--subfolder", sub]].concat(), "--subfolder");
        let detect = [
            "detect",
            "--repo",
            "acme/tiny-unet",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--offline",
        ];
        refused(&[&detect[..], &["--subfolder", sub]].concat(), "--subfolder");
    }
    // Snapshot files that link out of the cache.
    let snapshot = repo.join("snapshots").join(COMMIT);
    for file in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::remove_file(snapshot.join(file)).unwrap();
        std::os::unix::fs::symlink(outside.join(file), snapshot.join(file)).unwrap();
    }
    refused(&base, "leads out of the Hub cache");
}

/// A cache whose weights blob is a FIFO (the snapshot file links to it): the error says it is not
/// a regular file, not that the file is missing from the cache, and nothing blocks on the FIFO.
#[test]
fn a_fifo_blob_is_reported_as_not_a_file() {
    let (cache, repo, _) = hub_cache("hostile-hub-fifo");
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let blob = blobs.join("ab".repeat(32));
    mkfifo(&blob);
    let weights_file = repo
        .join("snapshots")
        .join(COMMIT)
        .join("diffusion_pytorch_model.safetensors");
    std::fs::remove_file(&weights_file).unwrap();
    std::os::unix::fs::symlink(format!("../../blobs/{}", "ab".repeat(32)), &weights_file).unwrap();
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let (code, out, err) = cli_bounded(&[
        "check",
        bundle.to_str().unwrap(),
        "--repo",
        "acme/tiny-unet",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--offline",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("not a regular file") && !err.contains("not in the cache"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
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

/// `show --out DIR` with a symbolic link planted in DIR under a picture's name: refused, the
/// link's target untouched. A hard link planted there is replaced, its other name untouched.
#[test]
fn show_does_not_write_through_planted_links() {
    let dir = scratch("hostile-show-links");
    let out = dir.join("pictures");
    std::fs::create_dir_all(&out).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "victim").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("output_error.png")).unwrap();
    let bundle = weights().join(BUNDLE);
    let args = ["show", bundle.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let (code, out_text, err) = cli_bounded(&args);
    assert_eq!(code, 2, "{out_text}{err}");
    assert!(
        err.contains("output_error.png: cannot write") && err.contains("symbolic link") && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim");
    std::fs::remove_file(out.join("output_error.png")).unwrap();
    std::fs::hard_link(&victim, out.join("output_error.png")).unwrap();
    let (code, out_text, err) = cli_bounded(&args);
    assert_eq!(code, 0, "{out_text}{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim");
    assert!(std::fs::read(out.join("output_error.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
}

/// A writer that fails as a full disk does.
struct Full;

impl std::io::Write for Full {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::from_raw_os_error(28))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Failures to write are named as such ("cannot write"), not as reads, and an output that could
/// not be written is exit 2, not a silent pass.
#[test]
fn write_failures_are_reported_as_write_failures() {
    let dir = scratch("hostile-write");
    let bundle = weights().join(BUNDLE);
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    for out in ["/dev/full".into(), file.clone(), file.join("sub")] {
        let args = ["show", bundle.to_str().unwrap(), "--out", out.to_str().unwrap()];
        let (code, _, err) = cli_bounded(&args);
        assert_eq!(code, 2, "{out:?}: {err}");
        assert!(
            err.contains("cannot write") && !err.contains("cannot read"),
            "{out:?}: {err}"
        );
    }
    let mut err = vec![];
    let code = unet_parity::cli::run(["unet-parity", "check", bundle.to_str().unwrap()], &mut Full, &mut err);
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot write the output") && err.contains("os error 28"),
        "{err}"
    );
}

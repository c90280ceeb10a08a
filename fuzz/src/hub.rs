//! A Hub cache built from the input (refs holding any text or linking anywhere, snapshot files
//! that are files, folders, FIFOs or links into `blobs/`, out of the cache or to /dev/stdin),
//! then resolved offline with a `--revision` and `--subfolder` from the input too. Whatever the
//! cache holds, a file the resolution returns lies inside the cache (links followed), and nothing
//! blocks (libFuzzer's `-timeout` catches a hang on a FIFO).
use std::path::{Path, PathBuf};
use unet_parity::hub::HubRepo;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const FILES: [&str; 3] = ["config.json", "diffusion_pytorch_model.safetensors", "unet/config.json"];
const LINKS: [&str; 8] = [
    "../../blobs/x",
    "../../../blobs/x",
    "../../../../outside/x",
    "/dev/stdin",
    "../../../../../../../../etc/hostname",
    ".",
    "x",
    "../../refs/main",
];

/// The input split at 0xff bytes into strings (lossy UTF-8).
fn fields(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0xff)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect()
}

fn build(cache: &Path, outside: &Path, ops: &[u8], ref_text: &str) {
    let repo = cache.join("models--acme--tiny");
    for dir in [
        repo.join("refs"),
        repo.join("blobs"),
        repo.join("snapshots").join(COMMIT).join("unet"),
        outside.to_path_buf(),
    ] {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(repo.join("blobs/x"), "{}");
    let _ = std::fs::write(outside.join("x"), COMMIT);
    let snapshot = repo.join("snapshots").join(COMMIT);
    for (i, op) in ops.iter().take(8).enumerate() {
        let file = snapshot.join(FILES[i % FILES.len()]);
        if std::fs::symlink_metadata(&file).is_ok() {
            continue;
        }
        match op % 4 {
            0 => drop(std::fs::write(&file, "{}")),
            1 => drop(std::fs::create_dir(&file)),
            2 => {
                let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid C string; mkfifo only creates a node.
                unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
            }
            _ => drop(std::os::unix::fs::symlink(
                LINKS[(*op as usize / 4) % LINKS.len()],
                &file,
            )),
        }
    }
    let refs = repo.join("refs/main");
    match ops.first().map(|b| b % 3) {
        Some(0) => drop(std::os::unix::fs::symlink(LINKS[ops.len() % LINKS.len()], &refs)),
        _ => drop(std::fs::write(&refs, ref_text)),
    }
}

fn inside(cache: &Path, path: &Path) -> bool {
    match (std::fs::canonicalize(cache), std::fs::canonicalize(path)) {
        (Ok(root), Ok(real)) => real.starts_with(root),
        _ => false,
    }
}

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let f = fields(data);
    let get = |i: usize| f.get(i).cloned().unwrap_or_default();
    let base: PathBuf = std::env::temp_dir().join(format!("unet-parity-fuzz-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (cache, outside) = (base.join("cache"), base.join("outside"));
    build(&cache, &outside, get(0).as_bytes(), &get(1));
    let revision = Some(get(2)).filter(|r| !r.is_empty());
    let subfolder = Some(get(3)).filter(|s| !s.is_empty());
    let repo = HubRepo {
        repo: "acme/tiny".into(),
        revision,
        subfolder,
        cache_dir: Some(cache.clone()),
        offline: true,
        limits: Default::default(),
    };
    for file in ["config.json", "diffusion_pytorch_model.safetensors"] {
        if let Ok(Some(path)) = repo.cached(file) {
            assert!(inside(&cache, &path), "{path:?} lies outside the cache");
        }
    }
    if let Ok((config, weights)) = repo.model_files() {
        assert!(
            inside(&cache, &config) && inside(&cache, &weights),
            "{config:?} {weights:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

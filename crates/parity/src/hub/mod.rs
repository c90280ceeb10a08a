//! Model files from the Hugging Face Hub, local cache first.
//!
//! The cache folder is the one Python's `huggingface_hub` shares: `--cache-dir`, else
//! `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
//! `~/.cache/huggingface/hub`. A file is looked up there first
//! (`models--<org>--<name>/refs/<revision>` → `snapshots/<commit>/<subfolder>/<file>`, a
//! 40-hex revision naming the snapshot directly). Only when it is not cached, and neither
//! `--offline` nor `HF_HUB_OFFLINE=1` is set, is it downloaded into that cache (`hub/download.rs`,
//! with connect and read timeouts).
//!
//! Nothing a cache holds can lead the tool out of it: `--revision` must be a branch, tag or
//! commit name (no `..`, no absolute path), `--subfolder` a relative path without `..`, a ref
//! must hold a 40-hex-digit commit, and the file found (links followed: snapshots link to
//! `blobs/`) must lie inside the cache folder.

#[cfg(feature = "hub")]
mod download;

use crate::error::{ParityError, Result};
use std::path::{Path, PathBuf};

/// Which repository files to resolve.
#[derive(Debug, Clone, Default)]
pub struct HubRepo {
    /// `org/name`.
    pub repo: String,
    /// Branch, tag or commit (`main` by default).
    pub revision: Option<String>,
    /// Folder inside the repository (`unet`, `vae`).
    pub subfolder: Option<String>,
    /// Overrides the cache folder resolution.
    pub cache_dir: Option<PathBuf>,
    /// Never use the network (also set by `HF_HUB_OFFLINE`).
    pub offline: bool,
}

/// The weight files a diffusers model folder may hold, in the order they are tried.
pub const WEIGHT_FILES: &[&str] = &[
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.bin",
];

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The cache folder (see the module docs).
pub fn cache_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(dir) = explicit {
        return dir.to_path_buf();
    }
    env_path("HF_HUB_CACHE")
        .or_else(|| env_path("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env_path("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| env_path("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"))
}

/// `HF_HUB_OFFLINE` set to 1/true/yes/on.
pub fn offline_from_env() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

fn usage(message: String) -> ParityError {
    ParityError::Usage(message)
}

impl HubRepo {
    fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    fn in_repo(&self, file: &str) -> String {
        match self
            .subfolder
            .as_deref()
            .map(|s| s.trim_matches('/'))
            .filter(|s| !s.is_empty())
        {
            Some(sub) => format!("{sub}/{file}"),
            None => file.to_string(),
        }
    }

    fn repo_dir(&self, cache: &Path) -> Result<PathBuf> {
        let parts: Vec<&str> = self.repo.split('/').collect();
        let valid =
            |p: &str| !p.is_empty() && p != "." && p != ".." && !p.contains('\\') && !p.chars().any(char::is_control);
        if parts.len() != 2 || !parts.iter().all(|p| valid(p)) {
            return Err(usage(format!("--repo {:?}: expected `org/name`", self.repo)));
        }
        // A subfolder stays inside the repository: relative, no `..`.
        if let Some(sub) = &self.subfolder {
            let inside = !sub.starts_with('/')
                && !sub.contains('\\')
                && !sub.chars().any(char::is_control)
                && sub.split('/').all(|p| p != "..");
            if !inside {
                return Err(usage(format!(
                    "--subfolder {sub:?}: expected a relative path inside the repository, without `..`"
                )));
            }
        }
        if !is_commit(self.revision()) && !is_ref_name(self.revision()) {
            return Err(usage(format!(
                "--revision {:?} is not a branch, tag or commit (a name like `main`, `v1.0` or `refs/pr/1`, or 40 \
                 hex digits)",
                self.revision()
            )));
        }
        Ok(repo_folder(cache, &self.repo))
    }

    /// The commit `refs/<revision>` names: `Ok(None)` when the ref is not cached.
    fn commit_of_ref(&self, cache: &Path, dir: &Path) -> Result<Option<String>> {
        let refs = dir.join("refs").join(self.revision());
        if std::fs::symlink_metadata(&refs).is_err() {
            return Ok(None);
        }
        confined(cache, &refs)?;
        // A ref names a commit: anything else (`../../..`, an absolute path) would lead the
        // snapshot path out of the cache.
        let commit = crate::files::read_text_limited(&refs, 1024)?.trim().to_string();
        if !is_commit(&commit) {
            let shown: String = commit.chars().take(80).collect();
            return Err(ParityError::Io {
                path: refs,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a Hub cache ref must hold a 40-hex-digit commit hash, found {shown:?}"),
                ),
            });
        }
        Ok(Some(commit))
    }

    /// The cached copy of `file`: `Ok(Some)` when present, `Ok(None)` when not cached.
    pub fn cached(&self, file: &str) -> Result<Option<PathBuf>> {
        let cache = cache_dir(self.cache_dir.as_deref());
        let dir = self.repo_dir(&cache)?;
        let rev = self.revision();
        let commit = if is_commit(rev) {
            rev.to_string()
        } else {
            match self.commit_of_ref(&cache, &dir)? {
                Some(commit) => commit,
                None => return Ok(None),
            }
        };
        let path = dir.join("snapshots").join(&commit).join(self.in_repo(file));
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        confined(&cache, &path)?;
        Ok(path.is_file().then_some(path))
    }

    /// `file` from the cache, else (online) downloaded into it.
    pub fn get(&self, file: &str) -> Result<PathBuf> {
        if let Some(path) = self.cached(file)? {
            return Ok(path);
        }
        let cache = cache_dir(self.cache_dir.as_deref());
        let what = format!(
            "{} (revision {}) file `{}`",
            self.repo,
            self.revision(),
            self.in_repo(file)
        );
        if self.offline || offline_from_env() {
            return Err(usage(format!(
                "{what} is not in the cache {} and the network is off (--offline / HF_HUB_OFFLINE)",
                cache.display()
            )));
        }
        let path = download(&self.repo, self.revision(), &self.in_repo(file), &cache)
            .map_err(|e| usage(format!("{what}: not cached in {} and {e}", cache.display())))?;
        confined(&cache, &path)?;
        Ok(path)
    }

    /// `config.json` and the first weight file of [`WEIGHT_FILES`] the repository has.
    pub fn model_files(&self) -> Result<(PathBuf, PathBuf)> {
        let config = self.get("config.json")?;
        // Cached files first, so an offline run never asks the network about a format it lacks.
        for file in WEIGHT_FILES {
            if let Some(path) = self.cached(file)? {
                return Ok((config, path));
            }
        }
        let mut errors = vec![];
        for file in WEIGHT_FILES {
            match self.get(file) {
                Ok(path) => return Ok((config, path)),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(usage(format!("no weights found: {}", errors.join("; "))))
    }
}

/// The cache folder of `repo` (`org/name`): `models--org--name`.
fn repo_folder(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// `path` (links followed) must lie inside the cache folder: a snapshot's files link to its
/// `blobs/`, and nothing else.
fn confined(cache: &Path, path: &Path) -> Result<()> {
    let io = |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    };
    let real = std::fs::canonicalize(path).map_err(io)?;
    let root = std::fs::canonicalize(cache).map_err(io)?;
    if real.starts_with(&root) {
        return Ok(());
    }
    Err(io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "leads out of the Hub cache {} (to {}); a cache's files must stay inside it",
            root.display(),
            real.display()
        ),
    )))
}

/// `file` of `repo` at `revision`, downloaded into the Hub cache `cache`; the error says why not.
#[cfg(feature = "hub")]
fn download(repo: &str, revision: &str, file: &str, cache: &Path) -> std::result::Result<PathBuf, String> {
    download::download(repo, revision, file, cache)
}

/// Without the `hub` feature nothing is downloaded.
#[cfg(not(feature = "hub"))]
fn download(_repo: &str, _revision: &str, _file: &str, _cache: &Path) -> std::result::Result<PathBuf, String> {
    Err(
        "this unet-parity was built without the `hub` feature, so it cannot download (rebuild with the \
         default features, or put the file in the cache)"
            .to_string(),
    )
}

/// A git commit hash as the Hub cache names snapshots: 40 hex digits.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// A branch or tag name as git allows it (`main`, `v1.0`, `refs/pr/1`), which is also a
/// relative path inside `refs/`: components that are not empty, `.` or `..` nor start with a
/// dot, and none of git's forbidden characters (control characters, space, `~^:?*[\`).
pub fn is_ref_name(s: &str) -> bool {
    let bad = |c: char| c.is_control() || " ~^:?*[\\".contains(c);
    s.len() <= 255
        && !s.chars().any(bad)
        && s.split('/')
            .all(|p| !p.is_empty() && !p.starts_with('.') && !p.ends_with(".lock"))
        && !s.contains("@{")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names() {
        for ok in ["main", "v1.0", "refs/pr/1", "fp16", "release-2024_01"] {
            assert!(is_ref_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/",
            ".hidden",
            "a b",
            "x\ny",
            "a:b",
            "main.lock",
        ] {
            assert!(!is_ref_name(bad), "{bad}");
        }
    }
}

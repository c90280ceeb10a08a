//! Model files from the Hugging Face Hub, local cache first.
//!
//! The cache folder is the one Python's `huggingface_hub` shares: `--cache-dir`, else
//! `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
//! `~/.cache/huggingface/hub`. A file is looked up there first
//! (`models--<org>--<name>/refs/<revision>` → `snapshots/<commit>/<subfolder>/<file>`, a
//! 40-hex revision naming the snapshot directly). Only when it is not cached, and neither
//! `--offline` nor `HF_HUB_OFFLINE=1` is set, is it downloaded with `hf-hub` into that cache.

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
        let valid = |p: &str| !p.is_empty() && p != "." && p != ".." && !p.contains('\\');
        if parts.len() != 2 || !parts.iter().all(|p| valid(p)) {
            return Err(usage(format!("--repo {:?}: expected `org/name`", self.repo)));
        }
        // A subfolder stays inside the repository: relative, no `..`.
        if let Some(sub) = &self.subfolder {
            let inside = !sub.starts_with('/') && !sub.contains('\\') && sub.split('/').all(|p| p != "..");
            if !inside {
                return Err(usage(format!(
                    "--subfolder {sub:?}: expected a relative path inside the repository, without `..`"
                )));
            }
        }
        Ok(cache.join(format!("models--{}--{}", parts[0], parts[1])))
    }

    /// The cached copy of `file`: `Ok(Some)` when present, `Ok(None)` when not cached.
    pub fn cached(&self, file: &str) -> Result<Option<PathBuf>> {
        let cache = cache_dir(self.cache_dir.as_deref());
        let dir = self.repo_dir(&cache)?;
        let rev = self.revision();
        let commit = if is_commit(rev) {
            rev.to_string()
        } else {
            if rev.split('/').any(|p| p == "..") {
                return Err(usage(format!("--revision {rev:?} is not a branch, tag or commit")));
            }
            let refs = dir.join("refs").join(rev);
            if !refs.exists() {
                return Ok(None);
            }
            // A ref names a commit: anything else (`../../..`, an absolute path) would lead the
            // snapshot path out of the cache.
            let commit = crate::bundle::read_regular_string(&refs)?.trim().to_string();
            if !is_commit(&commit) {
                return Err(ParityError::Io {
                    path: refs,
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a Hub cache ref must hold a 40-hex-digit commit hash, found {commit:?}"),
                    ),
                });
            }
            commit
        };
        let path = dir.join("snapshots").join(&commit).join(self.in_repo(file));
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
        download(&self.repo, self.revision(), &self.in_repo(file), &cache)
            .map_err(|e| usage(format!("{what}: not cached in {} and {e}", cache.display())))
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

/// A git commit hash as the Hub cache names snapshots: 40 hex digits.
/// `file` of `repo` at `revision`, downloaded into the Hub cache `cache`; the error says why not.
#[cfg(feature = "hub")]
fn download(repo: &str, revision: &str, file: &str, cache: &Path) -> std::result::Result<PathBuf, String> {
    let api = hf_hub::api::sync::ApiBuilder::new()
        .with_cache_dir(cache.to_path_buf())
        .with_progress(false)
        .build()
        .map_err(|e| format!("the Hub client could not be set up: {e}"))?;
    let repo = hf_hub::Repo::with_revision(repo.to_string(), hf_hub::RepoType::Model, revision.to_string());
    api.repo(repo)
        .get(file)
        .map_err(|e| format!("the download failed: {e}"))
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

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

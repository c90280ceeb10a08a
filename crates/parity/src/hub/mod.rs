//! Model files from the Hugging Face Hub, local cache first, named with `hf-hub`'s types.
//!
//! Two ways in:
//!
//! * [`HubFiles`], built from `hf-hub`'s [`hf_hub::Repo`] and [`hf_hub::Cache`] (re-exported as
//!   [`hf_hub`], so the versions match). [`HubFiles::cached`] looks a file up in the cache; with
//!   the `hub` feature `HubFiles::get` and `HubFiles::model_files` take the
//!   `hf_hub::api::sync::ApiRepo` a Candle program already holds and download what is missing
//!   from the endpoint it names;
//! * [`HubRepo`], the CLI's `--repo ORG/NAME --revision --subfolder --cache-dir --offline`.
//!
//! The cache folder is the one Python's `huggingface_hub` shares: `--cache-dir`, else
//! `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
//! `~/.cache/huggingface/hub` ([`cache_dir`]; `hf-hub`'s own `Cache::from_env` reads `HF_HOME`
//! only). A file is looked up there first (`models--<org>--<name>/refs/<revision>` →
//! `snapshots/<commit>/<subfolder>/<file>`, a 40-hex revision naming the snapshot directly).
//! Only when it is not cached, and neither `--offline` nor `HF_HUB_OFFLINE=1` is set, is it
//! downloaded into that cache (`hub/download.rs`, with connect and read timeouts).
//!
//! Where each guarantee comes from: the layout (folder names, snapshot and blob paths) is
//! `hf-hub`'s; every check on the names that go into it, the confinement to the cache, the
//! timeouts and the transport are this module's (`hub/files.rs`, `hub/download.rs`), because
//! `hf-hub` 0.5 has none of them. Nothing a cache holds can lead the tool out of it:
//! `--revision` must be a branch, tag or commit name (no `..`, no absolute path), `--subfolder`
//! a relative path without `..`, a ref must hold a 40-hex-digit commit, and the file found
//! (links followed: snapshots link to `blobs/`) must lie inside the cache folder.

#[cfg(feature = "hub")]
mod api;
#[cfg(feature = "hub")]
mod download;

mod files;

pub use files::{DownloadLimits, HubFiles};
/// The `hf-hub` this crate is built with: its `Repo`, `Cache` and (with the `hub` feature)
/// `api::sync::{Api, ApiRepo}` are the ones [`HubFiles`] takes.
pub use hf_hub;

use crate::error::{ParityError, Result};
use files::confined;
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
    /// Bounds on each download (`--max-download`, `--min-download-rate`).
    pub limits: DownloadLimits,
}

/// The weight files a diffusers model folder may hold, in the order they are tried.
pub use crate::model::WEIGHT_FILES;

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

/// The endpoint the CLI downloads from: `HF_ENDPOINT`, else `https://huggingface.co`.
pub fn endpoint_from_env() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
}

impl HubRepo {
    fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The repository as [`HubFiles`]; a usage error naming the flag when `--repo` is not
    /// `org/name`, `--revision` not a branch, tag or commit, or `--subfolder` not a relative path
    /// without `..`.
    pub fn files(&self) -> Result<HubFiles> {
        let parts: Vec<&str> = self.repo.split('/').collect();
        let valid =
            |p: &str| !p.is_empty() && p != "." && p != ".." && !p.contains('\\') && !p.chars().any(char::is_control);
        if parts.len() != 2 || !parts.iter().all(|p| valid(p)) {
            return Err(usage(format!("--repo {:?}: expected `org/name`", self.repo)));
        }
        if !is_commit(self.revision()) && !is_ref_name(self.revision()) {
            return Err(usage(format!(
                "--revision {:?} is not a branch, tag or commit (a name like `main`, `v1.0` or `refs/pr/1`, or 40 \
                 hex digits)",
                self.revision()
            )));
        }
        let repo = hf_hub::Repo::with_revision(self.repo.clone(), hf_hub::RepoType::Model, self.revision().into());
        let cache = hf_hub::Cache::new(cache_dir(self.cache_dir.as_deref()));
        let files = HubFiles::new(repo, cache)?.with_download_limits(self.limits);
        match &self.subfolder {
            Some(sub) => files.with_subfolder(sub).map_err(|_| {
                usage(format!(
                    "--subfolder {sub:?}: expected a relative path inside the repository, without `..`"
                ))
            }),
            None => Ok(files),
        }
    }

    /// The cached copy of `file`: `Ok(Some)` when present, `Ok(None)` when not cached.
    pub fn cached(&self, file: &str) -> Result<Option<PathBuf>> {
        self.files()?.cached(file)
    }

    /// `file` from the cache, else (online) downloaded into it from [`endpoint_from_env`].
    pub fn get(&self, file: &str) -> Result<PathBuf> {
        self.files()?
            .get_or_download(file, self.offline, || Ok(endpoint_from_env()))
    }

    /// `config.json` and the first weight file of [`WEIGHT_FILES`] the repository has.
    pub fn model_files(&self) -> Result<(PathBuf, PathBuf)> {
        let files = self.files()?;
        files.model_files_with(|file| files.get_or_download(file, self.offline, || Ok(endpoint_from_env())))
    }
}

impl HubFiles {
    /// `file` from the cache, else (unless `offline` or `HF_HUB_OFFLINE`) downloaded from the
    /// endpoint `endpoint` says, and checked to lie in the cache.
    fn get_or_download(&self, file: &str, offline: bool, endpoint: impl FnOnce() -> Result<String>) -> Result<PathBuf> {
        if let Some(path) = self.cached(file)? {
            return Ok(path);
        }
        let cache = self.cache().path();
        if offline || offline_from_env() {
            return Err(self.error(
                file,
                format!(
                    "not in the cache {} and the network is off (--offline / HF_HUB_OFFLINE)",
                    cache.display()
                ),
            ));
        }
        let in_repo = self.checked_file(file)?;
        let endpoint = endpoint()?;
        let path = download(self, &endpoint, &in_repo)
            .map_err(|e| self.error(file, format!("not cached in {} and {e}", cache.display())))?;
        confined(cache, &path)?;
        Ok(path)
    }

    /// `config.json` and the first of [`WEIGHT_FILES`] that `get` finds: cached files first, so
    /// an offline run never asks the network about a format it lacks.
    fn model_files_with(&self, mut get: impl FnMut(&str) -> Result<PathBuf>) -> Result<(PathBuf, PathBuf)> {
        let config = get("config.json")?;
        for file in WEIGHT_FILES {
            if let Some(path) = self.cached(file)? {
                return Ok((config, path));
            }
        }
        let mut errors = vec![];
        for file in WEIGHT_FILES {
            match get(file) {
                Ok(path) => return Ok((config, path)),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(self.error("", format!("no weights found: {}", errors.join("; "))))
    }
}

/// `file` downloaded into the cache of `files`; the error says why not.
#[cfg(feature = "hub")]
fn download(files: &HubFiles, endpoint: &str, file: &str) -> std::result::Result<PathBuf, String> {
    download::download(files, endpoint, file)
}

/// Without the `hub` feature nothing is downloaded.
#[cfg(not(feature = "hub"))]
fn download(_files: &HubFiles, _endpoint: &str, _file: &str) -> std::result::Result<PathBuf, String> {
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

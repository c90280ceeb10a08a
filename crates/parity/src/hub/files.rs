//! [`HubFiles`]: the files of one Hub repository in the local cache, named with `hf-hub`'s own
//! types ([`Repo`] for the id, type and revision, [`Cache`] for the cache folder).
//!
//! `hf-hub` 0.5 gives the layout (`Repo::folder_name`, `CacheRepo::pointer_path`) but checks
//! nothing: its `CacheRepo::get` joins whatever `refs/<revision>` holds onto the snapshot path
//! and follows links anywhere. Here every name is checked before it becomes a path, and every
//! path found is checked, links followed, to lie inside the cache folder:
//!
//! * the repository's folder name (`models--org--name`) must be one plain path component;
//! * the revision a branch, tag or commit name ([`super::is_ref_name`], [`super::is_commit`]);
//! * a subfolder and a file name relative paths without `..`;
//! * a ref must hold a 40-hex-digit commit, and is read as a small regular file (a FIFO planted
//!   as a ref does not block).

use super::{is_commit, is_ref_name, WEIGHT_FILES};
use crate::error::{ParityError, Result};
use hf_hub::{Cache, Repo};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The files of one Hub repository (optionally one folder of it) in a Hub cache.
///
/// Built from `hf-hub`'s [`Repo`] and [`Cache`]; looks files up in the cache
/// ([`HubFiles::cached`]) and, with the `hub` feature, downloads them through a user's
/// `hf_hub::api::sync::ApiRepo` (`HubFiles::get`, `HubFiles::model_files`).
#[derive(Debug, Clone)]
pub struct HubFiles {
    repo: Repo,
    cache: Cache,
    subfolder: Option<String>,
    pub(super) token: Option<String>,
    pub(super) timeouts: Option<(Duration, Duration)>,
    pub(super) limits: DownloadLimits,
}

/// Bounds on one download besides its timeouts ([`HubFiles::with_download_limits`]; the CLI's
/// `--max-download` and `--min-download-rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadLimits {
    /// The most bytes one file may write into the cache, checked against the size the Hub
    /// declares before the download and against the bytes as they arrive. `None`: the free space
    /// of the cache's file system less a reserve (a tenth of it, and at least 1 GiB), or 64 GiB
    /// where the free space is not known.
    pub max_bytes: Option<u64>,
    /// The slowest a download may go, in bytes a second, averaged over each [`Self::window`]
    /// (default 256 KiB/s): slower, it ends, whatever size it declared.
    pub min_rate: u64,
    /// The time over which [`Self::min_rate`] is averaged. Default: three times the wait for a
    /// byte (`HF_HUB_DOWNLOAD_TIMEOUT`, 10 s), so 30 s.
    pub window: Option<Duration>,
}

impl Default for DownloadLimits {
    fn default() -> Self {
        Self {
            max_bytes: None,
            min_rate: 256 << 10,
            window: None,
        }
    }
}

/// A relative path inside a repository: no leading `/`, no `..`, no `\`, no control character.
fn is_inside(path: &str) -> bool {
    !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && path.split('/').all(|p| p != "..")
}

/// The id `org/name` of `repo` (`datasets/org/name` for a dataset), for messages and URLs.
#[cfg(feature = "hub")]
pub(super) fn repo_name(repo: &Repo) -> String {
    repo.url()
}

/// The id `org/name` of `repo`, for messages (from its cache folder name: without the `hub`
/// feature `hf-hub` does not say the id).
#[cfg(not(feature = "hub"))]
pub(super) fn repo_name(repo: &Repo) -> String {
    let folder = repo.folder_name();
    let id = folder.split_once("--").map_or(folder.as_str(), |(_, id)| id);
    id.replace("--", "/")
}

impl HubFiles {
    /// `repo` in `cache` (for the cache `huggingface_hub` shares:
    /// `Cache::new(unet_parity::hub::cache_dir(None))`). Refused, naming what was found, when the
    /// repository's cache folder name is not one plain path component or the revision is not a
    /// branch, tag or 40-hex-digit commit.
    pub fn new(repo: Repo, cache: Cache) -> Result<Self> {
        let files = HubFiles {
            repo,
            cache,
            subfolder: None,
            token: None,
            timeouts: None,
            limits: DownloadLimits::default(),
        };
        let folder = files.repo.folder_name();
        let plain = !folder.is_empty()
            && folder != "."
            && folder != ".."
            && !folder.contains(['/', '\\'])
            && !folder.chars().any(char::is_control)
            && !folder.ends_with("--");
        if !plain {
            return Err(files.error(
                "",
                format!("the cache folder name {folder:?} is not one plain path component"),
            ));
        }
        // The id goes into URLs: no `.`/`..` segment that would move the request elsewhere.
        if repo_name(&files.repo)
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(files.error("", "a repository id is `org/name`, without empty, `.` or `..` parts"));
        }
        let rev = files.repo.revision();
        if !is_commit(rev) && !is_ref_name(rev) {
            return Err(files.error(
                "",
                "the revision is not a branch, tag or commit (a name like `main`, `v1.0` or `refs/pr/1`, or 40 hex \
                 digits)",
            ));
        }
        Ok(files)
    }

    /// Only the files under `subfolder` (`unet`, `vae`): a relative path without `..`.
    pub fn with_subfolder(mut self, subfolder: &str) -> Result<Self> {
        if !is_inside(subfolder) {
            return Err(self.error(
                "",
                format!("subfolder {subfolder:?}: expected a relative path inside the repository, without `..`"),
            ));
        }
        let sub = subfolder.trim_matches('/');
        self.subfolder = (!sub.is_empty()).then(|| sub.to_string());
        Ok(self)
    }

    /// The token sent to the Hub endpoint (never to the CDN a large file is redirected to).
    /// Default: `HF_TOKEN`, else the file `$HF_HOME/token` (`hf-hub` 0.5 keeps the token an
    /// `Api` was built with private, so it cannot be taken from there).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.trim().is_empty());
        self
    }

    /// Download timeouts: `answer` for resolving, connecting and the headers of each answer,
    /// `idle` the most time without a byte of the body. Default: `HF_HUB_ETAG_TIMEOUT` and
    /// `HF_HUB_DOWNLOAD_TIMEOUT` seconds, else 10 s each. Any duration is accepted; one above
    /// about 11.6 days (up to `Duration::MAX`) is held to that. Each download is also held to a
    /// size cap and a minimum rate ([`Self::with_download_limits`]).
    pub fn with_timeouts(mut self, answer: Duration, idle: Duration) -> Self {
        self.timeouts = Some((answer, idle));
        self
    }

    /// Bounds on the size and speed of each download ([`DownloadLimits`]).
    pub fn with_download_limits(mut self, limits: DownloadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The repository (id, type, revision).
    pub fn repo(&self) -> &Repo {
        &self.repo
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// `file`'s path in the repository (under the subfolder).
    pub fn in_repo(&self, file: &str) -> String {
        match &self.subfolder {
            Some(sub) => format!("{sub}/{file}"),
            None => file.to_string(),
        }
    }

    /// A [`ParityError::Hub`] about `file` of this repository.
    pub(super) fn error(&self, file: &str, message: impl Into<String>) -> ParityError {
        ParityError::Hub {
            repo: repo_name(&self.repo),
            revision: self.repo.revision().to_string(),
            file: if file.is_empty() {
                String::new()
            } else {
                self.in_repo(file)
            },
            message: message.into(),
        }
    }

    /// `file` checked to be a relative path without `..`: its path in the repository.
    pub(super) fn checked_file(&self, file: &str) -> Result<String> {
        if file.trim_matches('/').is_empty() || !is_inside(file) {
            return Err(self.error(
                file,
                "a file must be named by a relative path inside the repository, without `..`",
            ));
        }
        Ok(self.in_repo(file.trim_matches('/')))
    }

    /// `<cache>/models--org--name`.
    pub(super) fn repo_dir(&self) -> PathBuf {
        self.cache.path().join(self.repo.folder_name())
    }

    /// The commit `refs/<revision>` names: `Ok(None)` when the ref is not cached.
    fn commit_of_ref(&self) -> Result<Option<String>> {
        let refs = self.repo_dir().join("refs").join(self.repo.revision());
        if std::fs::symlink_metadata(&refs).is_err() {
            return Ok(None);
        }
        confined(self.cache.path(), &refs)?;
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

    /// The cached copy of `file`: `Ok(Some)` when present, `Ok(None)` when not cached, an error
    /// when the cache holds something that is not a commit, leads out of it, or is not a regular
    /// file (a FIFO, a folder).
    pub fn cached(&self, file: &str) -> Result<Option<PathBuf>> {
        let in_repo = self.checked_file(file)?;
        let rev = self.repo.revision();
        let commit = if is_commit(rev) {
            rev.to_string()
        } else {
            match self.commit_of_ref()? {
                Some(commit) => commit,
                None => return Ok(None),
            }
        };
        let path = self.cache.repo(self.repo.clone()).pointer_path(&commit).join(in_repo);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        confined(self.cache.path(), &path)?;
        // Present but not a file (a FIFO or a folder planted as the blob): say so, rather than
        // "not in the cache" (and a download over it).
        let io = |source| ParityError::Io {
            path: path.clone(),
            source,
        };
        if let Some(what) = crate::files::kind_if_not_regular(&path).map_err(io)? {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, what)));
        }
        Ok(Some(path))
    }

    /// `config.json` and the first of [`WEIGHT_FILES`] the cache holds: `Ok(None)` when either
    /// is not cached.
    pub fn cached_model_files(&self) -> Result<Option<(PathBuf, PathBuf)>> {
        let Some(config) = self.cached("config.json")? else {
            return Ok(None);
        };
        for file in WEIGHT_FILES {
            if let Some(path) = self.cached(file)? {
                return Ok(Some((config, path)));
            }
        }
        Ok(None)
    }
}

/// `path` (links followed) must lie inside the cache folder: a snapshot's files link to its
/// `blobs/`, and nothing else.
pub(super) fn confined(cache: &Path, path: &Path) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn files(id: &str, rev: &str) -> Result<HubFiles> {
        HubFiles::new(
            Repo::with_revision(id.into(), hf_hub::RepoType::Model, rev.into()),
            Cache::new("/nonexistent-cache".into()),
        )
    }

    #[test]
    fn names_are_checked() {
        assert!(files("acme/tiny", "main").is_ok());
        assert!(files("gpt2", "0123456789abcdef0123456789abcdef01234567").is_ok());
        assert!(files("acme/tiny", "../../x").is_err());
        assert!(files("acme\\..", "main").is_err());
        assert!(files("", "main").is_err());
        assert!(files("acme/..", "main").is_err());
        let ok = files("acme/tiny", "main").unwrap();
        assert!(ok.clone().with_subfolder("../x").is_err());
        assert!(ok.clone().with_subfolder("/etc").is_err());
        assert!(ok.checked_file("a/../../b").is_err());
        let unet = ok.with_subfolder("unet/").unwrap();
        assert_eq!(unet.checked_file("config.json").unwrap(), "unet/config.json");
        assert_eq!(repo_name(unet.repo()), "acme/tiny");
    }
}

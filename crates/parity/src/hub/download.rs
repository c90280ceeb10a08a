//! One file of a Hub repository downloaded into the Hub cache, laid out as Python's
//! `huggingface_hub` and `hf-hub` lay it out (`blobs/<etag>`, `snapshots/<commit>/<file>` a
//! relative link to the blob, `refs/<revision>` holding the commit); the paths are `hf-hub`'s
//! (`CacheRepo::blob_path`, `CacheRepo::pointer_path`), the names in them checked here first.
//!
//! The bytes are moved here rather than by `hf-hub` 0.5's `ApiRepo::download`, whose client
//! cannot be given timeouts (a stalled connection waited forever) and which writes paths named
//! by the server's `ETag` and `X-Repo-Commit` headers unchecked (`../../x`, or an absolute path,
//! which replaces the whole path). Here:
//!
//! * every connection has timeouts: resolving and connecting, and the answer's headers, within
//!   `HF_HUB_ETAG_TIMEOUT` seconds; then no more than `HF_HUB_DOWNLOAD_TIMEOUT` seconds without a
//!   byte of the body (a slow download goes on; a stalled one ends). Both default to 10, as in
//!   `huggingface_hub`, whose variables these are ([`super::HubFiles::with_timeouts`] overrides
//!   them);
//! * the commit must be 40 hex digits and the ETag (the blob's name) 16 to 128 hex digits, so
//!   neither can lead a path out of the cache; each folder written into is checked to lie in the
//!   cache (links followed), and files are created new, never written through a planted link;
//! * the token (`HF_TOKEN`, else the file `$HF_HOME/token`, or
//!   [`super::HubFiles::with_token`]) goes to the endpoint only, never to the CDN a large file is
//!   redirected to.

use super::files::{confined, repo_name, DownloadLimits, HubFiles};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ureq::http::{HeaderMap, Response};

/// The longest any one timeout is held to (about 11.6 days): a longer one, up to
/// `Duration::MAX`, means the same, and stays addable to the clock.
const MAX_WAIT: Duration = Duration::from_secs(1_000_000);
/// The default cap where the free disk space is not known.
const UNKNOWN_FREE_CAP: u64 = 64 << 30;
/// What the default cap leaves free on the cache's file system: a tenth of the free space, and
/// at least this.
const MIN_RESERVE: u64 = 1 << 30;

/// Seconds from the environment variable `name` (a positive number), else `default`.
fn seconds(name: &str, default: f64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e6)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

/// Percent-encode everything but unreserved characters (and `/` when `keep_slash`).
fn encode(s: &str, keep_slash: bool) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b'/' if keep_slash => "/".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn token() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Some(t.trim().to_string());
    }
    let home = std::env::var_os("HF_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("huggingface")))?;
    let text = crate::files::read_text_limited(&home.join("token"), 4096).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

fn agent(answer_within: Duration, idle: Duration, connect: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_resolve(Some(connect))
        .timeout_connect(Some(connect))
        .timeout_recv_response(Some(answer_within))
        .timeout_per_read(Some(idle))
        .timeout_per_write(Some(idle))
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into()
}

fn describe(e: ureq::Error, what: &str) -> String {
    match e {
        ureq::Error::Timeout(t) => format!(
            "{what}: timed out ({t}; HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT set the limits, in seconds)"
        ),
        ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => format!(
            "{what}: timed out ({e}; HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT set the limits, in seconds)"
        ),
        other => format!("{what}: {other}"),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// What the Hub says about a file before it is fetched.
struct Meta {
    commit: String,
    etag: String,
    size: Option<u64>,
    /// Where the bytes are: the CDN a large file is redirected to, else the resolve URL.
    location: String,
    /// Whether `location` is on the endpoint (the token may be sent there).
    on_endpoint: bool,
}

/// The file's commit, ETag and size from a HEAD request, following relative redirects (a
/// renamed repository) only.
fn metadata(agent: &ureq::Agent, origin: &str, url: &str, token: Option<&str>) -> Result<Meta, String> {
    let mut url = url.to_string();
    for _ in 0..5 {
        let mut req = agent.head(&url);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp: Response<ureq::Body> = req.call().map_err(|e| describe(e, "the Hub did not answer"))?;
        let status = resp.status();
        let headers = resp.headers();
        let location = header(headers, "location").map(str::to_string);
        if status.is_redirection() {
            if let Some(rel) = location.as_deref().filter(|l| l.starts_with('/')) {
                url = format!("{origin}{rel}");
                continue;
            }
        } else if !status.is_success() {
            let hint = match status.as_u16() {
                401 | 403 => " (a gated or private repository: set HF_TOKEN)",
                404 => " (no such repository, revision or file)",
                _ => "",
            };
            return Err(format!("the Hub answered HTTP {status}{hint}"));
        }
        let commit = header(headers, "x-repo-commit").unwrap_or_default().to_string();
        let etag = header(headers, "x-linked-etag")
            .or_else(|| header(headers, "etag"))
            .unwrap_or_default()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_string();
        let size = header(headers, "x-linked-size")
            .or_else(|| header(headers, "content-length"))
            .and_then(|s| s.parse().ok());
        if !super::is_commit(&commit) {
            return Err(format!(
                "the Hub's answer names commit {:?}, not a 40-hex-digit hash",
                crate::terminal::one_line(&commit.chars().take(80).collect::<String>())
            ));
        }
        let hex = |s: &str| (16..=128).contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit());
        if !hex(&etag) {
            return Err(format!(
                "the Hub's answer names blob {:?}, not a hex hash",
                crate::terminal::one_line(&etag.chars().take(80).collect::<String>())
            ));
        }
        let (location, on_endpoint) = match location.filter(|_| status.is_redirection()) {
            Some(l) => (l, false),
            None => (url, true),
        };
        return Ok(Meta {
            commit,
            etag,
            size,
            location,
            on_endpoint,
        });
    }
    Err("the Hub redirected more than 5 times".into())
}

/// The most bytes a download may write (see [`DownloadLimits::max_bytes`]), and where that number
/// came from, for messages.
fn max_download(limits: &DownloadLimits, blobs: &Path) -> (u64, String) {
    if let Some(bytes) = limits.max_bytes {
        return (bytes, "--max-download".into());
    }
    match free_space(blobs) {
        Some(free) => {
            let reserve = (free / 10).max(MIN_RESERVE);
            (
                free.saturating_sub(reserve),
                format!(
                    "the free space of the cache's file system ({}) less a reserve; --max-download sets another",
                    crate::memory::human(free)
                ),
            )
        }
        None => (
            UNKNOWN_FREE_CAP,
            "the default, the free disk space not being known; --max-download sets another".into(),
        ),
    }
}

/// The space an unprivileged process may still write on the file system of `dir`.
#[cfg(unix)]
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero is a valid `statvfs` (plain integers), which `statvfs` fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a struct to write; statvfs reads nothing else.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between unixes
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(not(unix))]
fn free_space(_dir: &Path) -> Option<u64> {
    None
}

/// The most bytes a download of `file` may write: the size its HEAD declared, when it declared
/// one, within `cap` (and [`crate::files::MAX_JSON_BYTES`] for a JSON file). A declared size over
/// that is refused before a byte is fetched; an undeclared one is held to the cap as the bytes
/// arrive.
fn size_cap(file: &str, declared: Option<u64>, (cap, from): (u64, &str)) -> Result<u64, String> {
    if file.ends_with(".json") && cap > crate::files::MAX_JSON_BYTES {
        return size_cap(
            file,
            declared,
            (crate::files::MAX_JSON_BYTES, "the most a JSON file may have"),
        );
    }
    match declared {
        Some(size) if size > cap => Err(format!(
            "the Hub declares {size} bytes, more than the download cap of {cap} ({from})"
        )),
        Some(size) => Ok(size),
        None => Ok(cap),
    }
}

/// How slow a download may go: at least `min_rate` bytes a second over each `window`.
#[derive(Debug, Clone, Copy)]
struct RateFloor {
    min_rate: u64,
    window: Duration,
}

impl RateFloor {
    /// The bytes a window must bring.
    fn per_window(&self) -> u64 {
        (self.min_rate as f64 * self.window.as_secs_f64()).min(u64::MAX as f64) as u64
    }
}

/// `body` copied into `file`, ending with an error after more than `cap` bytes (`declared`: the
/// size the Hub declared, for the message) or when a window of `floor` brings too few, by the
/// time `now` tells.
fn copy_bounded(
    body: &mut impl Read,
    file: &mut impl Write,
    (cap, declared): (u64, bool),
    floor: RateFloor,
    now: &mut dyn FnMut() -> Instant,
) -> Result<u64, String> {
    let mut buf = vec![0u8; 64 << 10];
    let (mut n, mut window_start, mut at_window_start) = (0u64, now(), 0u64);
    loop {
        let read = match body.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        n = n.saturating_add(read as u64);
        if n > cap {
            return Err(if declared {
                format!("the download sent more than the {cap} bytes the Hub declared")
            } else {
                format!("the download sent more than the download cap of {cap} bytes (--max-download)")
            });
        }
        file.write_all(&buf[..read]).map_err(|e| format!("cannot write: {e}"))?;
        let elapsed = now().saturating_duration_since(window_start);
        if elapsed >= floor.window {
            if n - at_window_start < floor.per_window() {
                return Err(format!(
                    "the download is too slow: {} bytes in {:.0} s, less than the minimum of {} a second \
                     (--min-download-rate)",
                    n - at_window_start,
                    elapsed.as_secs_f64(),
                    crate::memory::human(floor.min_rate)
                ));
            }
            (window_start, at_window_start) = (now(), n);
        }
    }
}

fn read_error(e: std::io::Error) -> String {
    let timeout = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)));
    if timeout || e.kind() == std::io::ErrorKind::TimedOut {
        "the download stalled (no data within HF_HUB_DOWNLOAD_TIMEOUT seconds)".to_string()
    } else {
        format!("the download broke off: {e}")
    }
}

/// The body at `meta.location` written to `blob` (through a temporary file beside it): at most
/// `cap` bytes, at no less than `floor`.
fn fetch(
    agent: &ureq::Agent,
    meta: &Meta,
    token: Option<&str>,
    blob: &Path,
    (cap, floor): (u64, RateFloor),
) -> Result<(), String> {
    let mut req = agent.get(&meta.location);
    if let Some(t) = token.filter(|_| meta.on_endpoint) {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let resp = req.call().map_err(|e| describe(e, "the download did not start"))?;
    if !resp.status().is_success() {
        return Err(format!("the download answered HTTP {}", resp.status()));
    }
    let mut body = resp.into_body().into_reader();
    let tmp = blob.with_extension(format!("incomplete.{}", std::process::id()));
    let written = (|| -> Result<u64, String> {
        let _ = std::fs::remove_file(&tmp);
        // A new file: nothing planted under its name is written through.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        let n = copy_bounded(
            &mut body,
            &mut file,
            (cap, meta.size.is_some()),
            floor,
            &mut Instant::now,
        )?;
        file.flush()
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        Ok(n)
    })();
    let checked = written.and_then(|n| match meta.size {
        Some(size) if size != n => Err(format!("the download ended after {n} of {size} bytes")),
        _ => Ok(()),
    });
    let renamed =
        checked.and_then(|()| std::fs::rename(&tmp, blob).map_err(|e| format!("cannot write {}: {e}", blob.display())));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// `scheme://host` of `endpoint` (where relative redirects lead), or why it is not a URL.
fn origin(endpoint: &str) -> Result<String, String> {
    match endpoint.split_once("://") {
        Some((scheme, rest)) if scheme == "https" || scheme == "http" => {
            Ok(format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest)))
        }
        _ => Err(format!("the endpoint {endpoint:?} is not an http(s) URL")),
    }
}

/// `file` (its path in the repository, checked) of `files` downloaded from `endpoint` into the
/// cache; the error says why not.
pub(super) fn download(files: &HubFiles, endpoint: &str, file: &str) -> Result<PathBuf, String> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    let origin = origin(endpoint)?;
    let repo = files.repo();
    let revision = repo.revision();
    let url = format!(
        "{endpoint}/{}/resolve/{}/{}",
        encode(&repo_name(repo), true),
        encode(revision, false),
        encode(file, true)
    );
    let (answer, idle) = files.timeouts.unwrap_or_else(|| {
        (
            seconds("HF_HUB_ETAG_TIMEOUT", 10.0),
            seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10.0),
        )
    });
    let (answer, idle) = (answer.min(MAX_WAIT), idle.min(MAX_WAIT));
    let token = files.token.clone().or_else(token);
    let meta = metadata(&agent(answer, idle, answer), &origin, &url, token.as_deref())?;
    let cache = files.cache().path();
    let layout = files.cache().repo(repo.clone());
    // Each folder written into must lie inside the cache (a folder of a planted cache may be a
    // link out of it).
    let mkdir = |d: &Path| {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot write {}: {e}", d.display()))?;
        confined(cache, d).map_err(|e| e.to_string())
    };
    let blob = layout.blob_path(&meta.etag);
    mkdir(&files.repo_dir().join("blobs"))?;
    if !blob.is_file() {
        let (max, from) = max_download(&files.limits, &files.repo_dir().join("blobs"));
        let cap = size_cap(file, meta.size, (max, &from))?;
        let floor = RateFloor {
            min_rate: files.limits.min_rate,
            window: files.limits.window.unwrap_or(idle.saturating_mul(3)).min(MAX_WAIT),
        };
        fetch(&agent(idle, idle, answer), &meta, token.as_deref(), &blob, (cap, floor))?;
    }
    let pointer = layout.pointer_path(&meta.commit).join(file);
    let Some(folder) = pointer.parent() else {
        return Err(format!("{} has no folder", pointer.display()));
    };
    mkdir(folder)?;
    link_blob(&blob, &pointer, file).map_err(|e| format!("cannot write {}: {e}", pointer.display()))?;
    if revision != meta.commit {
        // Not `CacheRepo::create_ref`, which opens the ref to truncate it, through a planted link.
        let refs = files.repo_dir().join("refs").join(revision);
        mkdir(refs.parent().unwrap_or(cache))?;
        crate::files::write_new(&refs, |f| f.write_all(meta.commit.as_bytes())).map_err(|e| e.to_string())?;
    }
    Ok(pointer)
}

/// `pointer` made a relative link to `blob` (`../../blobs/<etag>`, one more `..` per folder of
/// `file`), as `huggingface_hub` does; a copy where there are no symbolic links.
fn link_blob(blob: &Path, pointer: &Path, file: &str) -> std::io::Result<()> {
    if std::fs::symlink_metadata(pointer).is_ok() {
        std::fs::remove_file(pointer)?;
    }
    #[cfg(unix)]
    {
        let up = "../".repeat(1 + file.split('/').count());
        let name = blob.file_name().unwrap_or_default().to_string_lossy();
        std::os::unix::fs::symlink(format!("{up}blobs/{name}"), pointer)
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        std::fs::copy(blob, pointer).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_encoded() {
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("unet/config.json", true), "unet/config.json");
        assert_eq!(encode("a b?", true), "a%20b%3F");
    }

    #[test]
    fn downloads_are_capped_and_held_to_a_rate() {
        let cap = (5u64 << 30, "test");
        assert_eq!(
            size_cap("diffusion_pytorch_model.safetensors", Some(5 << 30), cap),
            Ok(5 << 30)
        );
        let e = size_cap("model.safetensors", Some(1_000_000_000_000_000), cap).unwrap_err();
        assert!(e.contains("more than the download cap of 5368709120 (test)"), "{e}");
        assert_eq!(size_cap("config.json", Some(1000), cap), Ok(1000));
        assert!(size_cap("config.json", Some(1 << 40), cap)
            .unwrap_err()
            .contains("JSON"));
        // Undeclared: held to the cap as the bytes arrive.
        assert_eq!(size_cap("model.safetensors", None, cap), Ok(5 << 30));
        assert_eq!(size_cap("config.json", None, cap), Ok(crate::files::MAX_JSON_BYTES));
        let fast = RateFloor {
            min_rate: 1,
            window: Duration::from_secs(3600),
        };
        let mut sink = vec![];
        let start = Instant::now();
        // A clock that moves `step` a look.
        let clock = |step: u64| {
            let mut t = start;
            move || {
                t += Duration::from_secs(step);
                t
            }
        };
        let mut copy =
            |bytes: &[u8], cap, floor, step| copy_bounded(&mut &bytes[..], &mut sink, cap, floor, &mut clock(step));
        let e = copy(&[1u8; 10], (9, true), fast, 0).unwrap_err();
        assert!(e.contains("more than the 9 bytes the Hub declared"), "{e}");
        let e = copy(&[1u8; 10], (9, false), fast, 0).unwrap_err();
        assert!(e.contains("download cap of 9 bytes"), "{e}");
        assert_eq!(copy(&[1u8; 10], (10, true), fast, 0), Ok(10));
        // 10 bytes in a window of 2 s where a thousand a second are needed: too slow; the same
        // bytes within the window (no time passes): not yet judged.
        let slow = RateFloor {
            min_rate: 1000,
            window: Duration::from_secs(2),
        };
        let e = copy(&[1u8; 10], (10, true), slow, 2).unwrap_err();
        assert!(e.contains("too slow: 10 bytes in 2 s"), "{e}");
        assert_eq!(copy(&[1u8; 10], (10, true), slow, 0), Ok(10));
        // No overflow, however long the window or high the rate.
        let huge = RateFloor {
            min_rate: u64::MAX,
            window: MAX_WAIT,
        };
        assert_eq!(huge.per_window(), u64::MAX);
    }

    #[test]
    fn the_default_cap_is_below_the_free_space() {
        let dir = std::env::temp_dir();
        let (cap, from) = max_download(&DownloadLimits::default(), &dir);
        if let Some(free) = free_space(&dir) {
            assert!(cap < free || free == 0, "{cap} {free}");
            assert!(from.contains("free space"), "{from}");
        }
        let given = DownloadLimits {
            max_bytes: Some(7),
            ..DownloadLimits::default()
        };
        assert_eq!(max_download(&given, &dir), (7, "--max-download".to_string()));
    }
}

//! Files a stranger may have named or planted: bundles, checkpoints, configs, Hub cache refs, the
//! folders `check` searches, and the pictures `show` writes.
//!
//! * Reading: through `unet_attention::files`, the reader the library's model loaders use too: a
//!   path is opened only when it is a regular file. It is checked before the `open` (an `open` on
//!   a FIFO blocks until a writer comes; one on a device may have effects) and again on the opened
//!   descriptor, which is opened non-blocking on Unix, so a FIFO swapped in between can neither
//!   block the tool nor be read. Text files are read up to a limit; safetensors files by their
//!   header and the tensors asked for ([`crate::st_file`]), never whole.
//! * The folder walk ([`collect`]) enters real folders only: a symbolic link to a folder is not
//!   followed (it is reported), so links back up the tree (`a -> .`, `self -> .`) cannot loop or
//!   count a bundle twice, and a link to `/` cannot send the walk through the whole machine.
//! * Writing ([`write_new`]): never through a symbolic link planted where the file goes, and
//!   never into another file through a hard link: the bytes go to a new temporary file beside it,
//!   renamed over the name. Write failures are [`ParityError::Write`] ("cannot write").

use crate::error::{ParityError, Result};
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

pub use unet_attention::files::{kind_if_not_regular, MAX_JSON_BYTES};

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ParityError + '_ {
    move |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `path` opened for reading once it is known to be a regular file (`unet_attention::files`, the
/// one reader both crates use; see the module docs).
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    Ok(unet_attention::files::open_regular(path)?)
}

/// The UTF-8 text of a regular file of at most `limit` bytes.
pub fn read_text_limited(path: &Path, limit: u64) -> Result<String> {
    Ok(unet_attention::files::read_text_limited(path, limit)?)
}

/// The JSON of a regular file of at most [`MAX_JSON_BYTES`] (`config.json`, a sharded index).
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    Ok(unet_attention::files::read_json(path)?)
}

fn write_err(path: &Path) -> impl Fn(std::io::Error) -> ParityError + '_ {
    move |source| ParityError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// `dir` created if missing (with its parents); an existing one must be a folder.
pub fn create_dir(dir: &Path) -> Result<()> {
    let err = write_err(dir);
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "exists and is not a folder",
        ))),
        Err(_) => std::fs::create_dir_all(dir).map_err(err),
    }
}

/// Write `path` with what `fill` writes into it: refused when `path` is a symbolic link; the
/// bytes go to a new file beside it (created exclusively, so not through any link), which then
/// replaces `path` by a rename.
pub fn write_new(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<()> {
    let err = write_err(path);
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "is a symbolic link; this tool does not write through links (remove it or write elsewhere)",
        )));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        fill(&mut file)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(err)
}

/// What [`collect`] found.
#[derive(Debug, Default, Clone)]
pub struct Found {
    /// Bundles (files named explicitly, and `*.safetensors` files in folders that are not plainly
    /// model checkpoints), in the order given, each folder's sorted.
    pub bundles: Vec<PathBuf>,
    /// Safetensors files in folders without any `parity.*` metadata or tensors (checkpoints).
    pub skipped: Vec<PathBuf>,
    /// Symbolic links to folders met in the walk, not followed.
    pub links: Vec<PathBuf>,
}

/// Every bundle under `paths`: files as given, folders searched recursively (see the module
/// docs). A folder without bundles is an error.
pub fn collect(paths: &[PathBuf]) -> Result<Found> {
    let mut found = Found::default();
    let mut visited = HashSet::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(io_err(path))?;
        if meta.is_dir() {
            // A folder already searched (named twice, or inside one named before) adds nothing.
            let seen = visited.contains(&std::fs::canonicalize(path).map_err(io_err(path))?);
            let (before, skipped) = (found.bundles.len(), found.skipped.len());
            walk(path, &mut found, &mut visited, 0)?;
            if found.bundles.len() == before && !seen {
                return Err(ParityError::NoBundles {
                    path: path.clone(),
                    checkpoints: found.skipped[skipped..].to_vec(),
                });
            }
        } else {
            found.bundles.push(path.clone());
        }
    }
    Ok(found)
}

/// Folders nested deeper than this end the walk with an error (a path that long is not a tree
/// of bundles).
pub const MAX_DEPTH: usize = 256;

fn walk(dir: &Path, found: &mut Found, visited: &mut HashSet<PathBuf>, depth: usize) -> Result<()> {
    let io = io_err(dir);
    if depth > MAX_DEPTH {
        return Err(io(std::io::Error::other(format!(
            "folders nested more than {MAX_DEPTH} deep"
        ))));
    }
    // Two paths given for one folder are searched once.
    if !visited.insert(std::fs::canonicalize(dir).map_err(&io)?) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(&io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(&io)?;
    entries.sort();
    for p in entries {
        let Ok(own) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        // A dangling link is neither a file nor a folder and is left out.
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if own.file_type().is_symlink() {
                found.links.push(p);
            } else {
                walk(&p, found, visited, depth + 1)?;
            }
        } else if p.extension().is_some_and(|e| e == "safetensors") {
            // Anything but a regular file is kept as a bundle, so that reading it reports it.
            if meta.is_file() && is_plain_checkpoint(&p) {
                found.skipped.push(p);
            } else {
                found.bundles.push(p);
            }
        }
    }
    Ok(())
}

/// Whether a safetensors file is plainly not a bundle: its header parses and names nothing
/// `parity.*`. Unreadable headers count as bundles, so their errors are reported.
fn is_plain_checkpoint(path: &Path) -> bool {
    let Ok(mut f) = open_regular(path) else {
        return false;
    };
    let mut len = [0u8; 8];
    if f.read_exact(&mut len).is_err() {
        return false;
    }
    let n = u64::from_le_bytes(len);
    // safetensors' own limit on a header.
    if n > 100_000_000 {
        return false;
    }
    let mut header = vec![];
    if f.take(n).read_to_end(&mut header).is_err() || header.len() as u64 != n {
        return false;
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&header) {
        Ok(h) => {
            let meta_has = h
                .get("__metadata__")
                .and_then(|m| m.as_object())
                .is_some_and(|m| m.keys().any(|k| k.starts_with("parity.")));
            !meta_has && !h.keys().any(|k| k.starts_with("parity."))
        }
        Err(_) => false,
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A scratch folder, removed when dropped.
    fn scratch(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("unet-parity-files-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn write_new_replaces_files_and_refuses_links() {
        let scratch = scratch("write");
        let dir = scratch.path();
        let target = dir.join("victim");
        std::fs::write(&target, "victim").unwrap();
        let link = dir.join("out.png");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_new(&link, |f| std::io::Write::write_all(f, b"x")).unwrap_err();
        assert!(
            e.to_string().contains("cannot write") && e.to_string().contains("symbolic link"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "victim");
        // A hard link: the name is replaced, the other file keeps its bytes.
        let hard = dir.join("hard.png");
        std::fs::hard_link(&target, &hard).unwrap();
        write_new(&hard, |f| std::io::Write::write_all(f, b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&hard).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "victim");
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 3, "no temporary file left");
    }
}

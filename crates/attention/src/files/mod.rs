//! Files from strangers, read one way for the library's model loaders and for `unet-parity`:
//! `config.json`, sharded indexes, safetensors files and the model folders that hold them.
//!
//! * Opening ([`open_regular`]): a path is opened only when it is a regular file. It is checked
//!   before the `open` (an `open` on a FIFO blocks until a writer comes; one on a device may have
//!   effects) and again on the opened descriptor, which is opened non-blocking on Unix, so a FIFO
//!   swapped in between can neither block the caller nor be read.
//! * Text and JSON ([`read_text_limited`], [`read_json`]): read up to a limit, never whole.
//! * Safetensors ([`safetensors`]): neither mapped nor read whole; the header, checked as the
//!   `safetensors` crate checks it, then each tensor that is asked for.
//! * Shards ([`shards`]): an index's shard names must be plain file names in its folder, and its
//!   `weight_map` is honoured: a tensor in another shard than the index names, or in two shards,
//!   is an error naming both.
//! * Model folders ([`folder`]): a diffusers model folder's `config.json` and weight file.
//!
//! Every error names the file ([`FileError`]).

pub mod folder;
pub mod safetensors;
pub mod shards;

pub use crate::error::FileError;
use std::io::Read;
use std::path::Path;

/// The most a JSON file (`config.json`, a sharded index) may hold: real ones are a few KiB (a
/// config) to a few MB (the largest indexes).
pub const MAX_JSON_BYTES: u64 = 16 << 20;

/// What `meta` describes when it is not a regular file (`None` when it is).
fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    match () {
        _ if meta.is_file() => None,
        _ if meta.is_dir() => Some("a folder"),
        _ => Some("not a regular file (a FIFO, socket or device)"),
    }
}

/// What `path` is when it is not a regular file (following symbolic links), `None` when it is.
pub fn kind_if_not_regular(path: &Path) -> std::io::Result<Option<&'static str>> {
    Ok(not_regular(&std::fs::metadata(path)?))
}

/// `path` opened for reading once it is known to be a regular file (see the module docs); a
/// [`FileError::Io`] of kind `InvalidInput` ("not a regular file ...") otherwise.
pub fn open_regular(path: &Path) -> Result<std::fs::File, FileError> {
    let io = |e| FileError::io(path, e);
    let refuse = |what: &str| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, what));
    if let Some(what) = kind_if_not_regular(path).map_err(io)? {
        return Err(refuse(what));
    }
    let file = open_nonblocking(path).map_err(io)?;
    // The path may have been replaced between the two looks: the descriptor decides.
    if let Some(what) = not_regular(&file.metadata().map_err(io)?) {
        return Err(refuse(what));
    }
    Ok(file)
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // On a regular file O_NONBLOCK changes nothing; on a FIFO it makes `open` return at once.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// The UTF-8 text of a regular file of at most `limit` bytes.
pub fn read_text_limited(path: &Path, limit: u64) -> Result<String, FileError> {
    let io = |e| FileError::io(path, e);
    let mut bytes = vec![];
    open_regular(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes; this file is expected to be small text"),
        )));
    }
    String::from_utf8(bytes).map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// The JSON value of a regular file of at most [`MAX_JSON_BYTES`].
pub fn read_json(path: &Path) -> Result<serde_json::Value, FileError> {
    let text = read_text_limited(path, MAX_JSON_BYTES)?;
    serde_json::from_str(&text).map_err(|e| FileError::content(path, format!("not JSON: {e}")))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A scratch folder, removed when dropped.
    fn scratch(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("unet-attention-files-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn text_is_read_up_to_its_limit() {
        let dir = scratch("text");
        let f = dir.path().join("big.json");
        std::fs::write(&f, vec![b' '; 100]).unwrap();
        assert_eq!(read_text_limited(&f, 100).unwrap().len(), 100);
        let e = read_text_limited(&f, 99).unwrap_err().to_string();
        assert!(e.contains("larger than 99 bytes") && e.contains("big.json"), "{e}");
        let e = read_json(&f).unwrap_err().to_string();
        assert!(e.contains("not JSON") && e.contains("big.json"), "{e}");
    }

    /// A FIFO is refused without blocking (an `open` on it would wait for a writer).
    #[test]
    fn a_fifo_is_refused_not_opened() {
        let dir = scratch("fifo");
        let fifo = dir.path().join("config.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = read_json(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file") && e.contains("config.json"), "{e}");
        let e = open_regular(dir.path()).unwrap_err().to_string();
        assert!(e.contains("a folder"), "{e}");
    }
}

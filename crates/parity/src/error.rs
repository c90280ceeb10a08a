//! Errors of the parity tool. Every one of them means "unusable input" (exit code 2); a
//! numerical mismatch is not an error but a failed check (exit code 1).

use std::path::PathBuf;

/// Why a bundle could not be checked. The message is always one line: newlines and other
/// control characters that a file name, a metadata string or a parser echoes are escaped.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("{}: cannot read: {}", esc(path.display()), esc(source))]
    Io { path: PathBuf, source: std::io::Error },
    /// A file or folder the tool writes (`show --out`) that could not be written.
    #[error("{}: cannot write: {}", esc(path.display()), esc(source))]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{}: not a valid safetensors file: {}", esc(path.display()), esc(message))]
    Format { path: PathBuf, message: String },
    #[error("{}: not a parity bundle: {}", esc(path.display()), esc(message))]
    Bundle { path: PathBuf, message: String },
    /// A well-formed bundle whose content cannot be checked (non-finite weights or inputs).
    #[error("{}: {}", esc(path.display()), esc(message))]
    Invalid { path: PathBuf, message: String },
    /// A checkpoint (`--weights`, `parity.weights`) that cannot be read or has no such prefix.
    #[error("{}: {}", esc(path.display()), esc(message))]
    Checkpoint { path: PathBuf, message: String },
    #[error("{}: unknown block id `{}`; known blocks: {known}", esc(path.display()), esc(id))]
    UnknownBlock { path: PathBuf, id: String, known: String },
    #[error("{}: {}", esc(path.display()), esc(with_block(block, source)))]
    Block {
        path: PathBuf,
        block: String,
        source: Box<unet_attention::Error>,
    },
    /// A panic caught while checking (a bug in this tool; see `guard`).
    #[error("{}: internal error (a bug in unet-parity, please report it): {}", esc(path.display()), esc(message))]
    Internal { path: PathBuf, message: String },
    /// A port checked with [`crate::port::PortCheck`] whose forward failed, asked for an input the
    /// bundle lacks, or returned other outputs than the bundle holds.
    #[error("{}: your port: {}", esc(path.display()), esc(message))]
    Port { path: PathBuf, message: String },
    #[error("{}: no parity bundles (*.safetensors) found", esc(path.display()))]
    NoBundles { path: PathBuf },
    #[error("{}", esc(_0))]
    Usage(String),
    /// A Hugging Face Hub repository or file that cannot be resolved or downloaded (`hub`).
    #[error("{}", esc(hub_message(repo, revision, file, message)))]
    Hub {
        /// `org/name`.
        repo: String,
        revision: String,
        /// The file's path in the repository; empty when the error is about the repository.
        file: String,
        message: String,
    },
}

/// `x` displayed on one line: control characters and bidirectional controls are written as
/// Rust escapes (`\n`, `\u{1b}`, `\u{202e}`).
fn esc(x: impl std::fmt::Display) -> String {
    let s = x.to_string();
    let bad = |c: char| c.is_control() || crate::terminal::is_unsafe(c);
    if !s.chars().any(bad) {
        return s;
    }
    s.chars()
        .map(|c| {
            if bad(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn hub_message(repo: &str, revision: &str, file: &str, message: &str) -> String {
    match file {
        "" => format!("{repo} (revision {revision}): {message}"),
        _ => format!("{repo} (revision {revision}) file `{file}`: {message}"),
    }
}

impl ParityError {
    pub(crate) fn bundle(path: &std::path::Path, message: impl Into<String>) -> Self {
        ParityError::Bundle {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    pub(crate) fn block(path: &std::path::Path, block: &str, source: impl Into<unet_attention::Error>) -> Self {
        ParityError::Block {
            path: path.to_path_buf(),
            block: block.to_string(),
            source: Box::new(source.into()),
        }
    }
}

/// Candle's errors (missing weight, shape mismatch) do not know the block; the others name it.
fn with_block(block: &str, source: &unet_attention::Error) -> String {
    match source {
        unet_attention::Error::Candle(e) => format!("{block}: {e}"),
        other => other.to_string(),
    }
}

pub type Result<T> = std::result::Result<T, ParityError>;

/// `?` on a [`ParityError`] inside code that returns `candle_core::Result` (a forward given to
/// [`crate::port::PortCheck::run`] that asks for an input).
impl From<ParityError> for candle_core::Error {
    fn from(e: ParityError) -> Self {
        candle_core::Error::wrap(e)
    }
}

/// `?` on a [`ParityError`] inside code that returns `unet_attention::Result` (our blocks'
/// forwards, given to [`crate::port::PortCheck::run`]).
impl From<ParityError> for unet_attention::Error {
    fn from(e: ParityError) -> Self {
        unet_attention::Error::Candle(candle_core::Error::wrap(e))
    }
}

//! Errors of the parity tool. Every one of them means "unusable input" (exit code 2); a
//! numerical mismatch is not an error but a failed check (exit code 1).

use std::path::PathBuf;

/// Why a bundle could not be checked. The message is always one line: newlines and other
/// control characters that a file name, a metadata string or a parser echoes are escaped.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("{}: cannot read: {}", esc(path.display()), msg(source))]
    Io { path: PathBuf, source: std::io::Error },
    /// A file or folder the tool writes (`show --out`) that could not be written.
    #[error("{}: cannot write: {}", esc(path.display()), msg(source))]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{}: not a valid safetensors file: {}", esc(path.display()), msg(message))]
    Format { path: PathBuf, message: String },
    #[error("{}: not a parity bundle: {}", esc(path.display()), msg(message))]
    Bundle { path: PathBuf, message: String },
    /// A well-formed bundle whose content cannot be checked (non-finite weights or inputs).
    #[error("{}: {}", esc(path.display()), msg(message))]
    Invalid { path: PathBuf, message: String },
    /// A checkpoint (`--weights`, `parity.weights`) that cannot be read or has no such prefix.
    #[error("{}: {}", esc(path.display()), msg(message))]
    Checkpoint { path: PathBuf, message: String },
    #[error("{}: unknown block id `{}`; known blocks: {known}", esc(path.display()), esc(id))]
    UnknownBlock { path: PathBuf, id: String, known: String },
    #[error("{}: {}", esc(path.display()), msg(with_block(block, source)))]
    Block {
        path: PathBuf,
        block: String,
        source: Box<unet_attention::Error>,
    },
    /// A panic caught while checking (a bug in this tool; see `guard`).
    #[error("{}: internal error (a bug in unet-parity, please report it): {}", esc(path.display()), msg(message))]
    Internal { path: PathBuf, message: String },
    /// A port checked with [`crate::port::PortCheck`] whose forward failed, asked for an input the
    /// bundle lacks, or returned other outputs than the bundle holds.
    #[error("{}: your port: {}", esc(path.display()), msg(message))]
    Port { path: PathBuf, message: String },
    /// A folder without bundles; `checkpoints` are the safetensors files without `parity.*`
    /// metadata found in it (the message says what to do with them, and with a model folder).
    #[error("{}: no parity bundles (*.safetensors) found{}", esc(path.display()), msg(crate::next_step::no_bundles(path, checkpoints)))]
    NoBundles { path: PathBuf, checkpoints: Vec<PathBuf> },
    #[error("{}", msg(_0))]
    Usage(String),
    /// A Hugging Face Hub repository or file that cannot be resolved or downloaded (`hub`).
    #[error("{}", msg(hub_message(repo, revision, file, message)))]
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

/// A message on one line as [`esc`] writes it, without the backtrace candle appends to its errors
/// when `RUST_BACKTRACE` is set (`candle_core::Error::WithBacktrace`: the message, a newline, then
/// the frames `   0: name` / `      at file:line`, each line indented): what follows the
/// backtrace is kept. Paths are never passed through this, only messages.
fn msg(x: impl std::fmt::Display) -> String {
    esc(strip_backtrace(&x.to_string()))
}

fn strip_backtrace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('\n').filter(|_| rest.contains(" 0: ")) {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let after = &after[1..];
        let first = after.lines().next().unwrap_or("");
        if !first.trim_start().starts_with("0: ") || !first.starts_with(' ') {
            out.push('\n');
            rest = after;
            continue;
        }
        // Skip the indented lines of the backtrace.
        let mut tail = after;
        while tail.starts_with(' ') {
            tail = tail.split_once('\n').map_or("", |(_, t)| t);
        }
        rest = tail;
        if !rest.is_empty() {
            out.push(' ');
        }
    }
    out.push_str(rest);
    out
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

/// A file `unet_attention::files` could not read, as this tool reports it: "cannot read", "not a
/// valid safetensors file", or what is wrong with its content.
impl From<unet_attention::FileError> for ParityError {
    fn from(e: unet_attention::FileError) -> Self {
        use unet_attention::FileError as F;
        match e {
            F::Io { path, source } => ParityError::Io { path, source },
            F::Safetensors { path, message } => ParityError::Format { path, message },
            F::Content { path, message } => ParityError::Checkpoint { path, message },
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_backtraces_are_left_out_of_messages() {
        let inner = candle_core::Error::Msg("shape mismatch in add, lhs: [2], rhs: [3]".into());
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let raw = format!("stage q: {e}");
        assert!(raw.lines().count() > 2, "no backtrace to strip: {raw}");
        let line = ParityError::bundle(std::path::Path::new("b.safetensors"), raw).to_string();
        assert_eq!(
            line,
            "b.safetensors: not a parity bundle: stage q: shape mismatch in add, lhs: [2], rhs: [3]"
        );
        let block = ParityError::block(std::path::Path::new("b"), "blk", e).to_string();
        assert_eq!(block, "b: blk: shape mismatch in add, lhs: [2], rhs: [3]");
        // Text after the backtrace stays; other newlines are escaped as before.
        assert_eq!(strip_backtrace("a\n   0: f\n      at x.rs:1\nb"), "a b");
        assert_eq!(msg("a\nb"), "a\\nb");
        // A path is never cut.
        let odd = ParityError::bundle(std::path::Path::new("x\n   0: y"), "m").to_string();
        assert!(odd.starts_with("x\\n   0: y:"), "{odd}");
    }
}

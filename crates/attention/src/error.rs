//! The crate's error types.

use std::path::{Path, PathBuf};

/// Errors from building or running a block.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot describe a valid block (unknown key, wrong type, heads that do
    /// not divide the channels, ...).
    #[error("{block}: invalid config: {message}")]
    Config { block: &'static str, message: String },
    /// A weight has a shape the block cannot use.
    #[error("{block}: weight `{name}` has shape {found:?}, expected {expected}")]
    WeightShape {
        block: &'static str,
        name: String,
        expected: String,
        found: Vec<usize>,
    },
    /// The configuration is valid PyTorch but selects a feature this crate does not implement.
    #[error("{block}: not supported: {message}")]
    Unsupported { block: &'static str, message: String },
    /// A forward input is missing or has the wrong rank or size.
    #[error("{block}: bad input `{input}`: {message}")]
    Input {
        block: &'static str,
        input: String,
        message: String,
    },
    /// A model folder's weights do not fit the model: files missing, a shard name that is not a
    /// file in the folder, or weights the model never read.
    #[error("{block}: weights: {message}")]
    Weights { block: &'static str, message: String },
    /// A file that cannot be read as what it should be (`crate::files`): it names the file.
    #[error(transparent)]
    File(#[from] FileError),
    /// An error from Candle (missing tensor, shape mismatch on load, device error, ...).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Why a file from a stranger (`config.json`, a sharded index, a safetensors file) cannot be read:
/// always naming the file (`crate::files` reads them).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Not there, not a regular file (a FIFO, socket, device or folder), larger than its limit,
    /// not UTF-8, or an I/O error.
    #[error("{}: cannot read: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// Not a valid safetensors file: the `safetensors` crate's message.
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    Safetensors { path: PathBuf, message: String },
    /// Readable, but not what it should hold: not JSON, an index without a `weight_map`, a shard
    /// name outside the folder, shards that disagree with their index.
    #[error("{}: {message}", path.display())]
    Content { path: PathBuf, message: String },
}

impl FileError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        FileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn content(path: &Path, message: impl Into<String>) -> Self {
        FileError::Content {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Io { path, .. } | FileError::Safetensors { path, .. } | FileError::Content { path, .. } => path,
        }
    }
}

/// So that `?` works in Candle code (functions returning `candle_core::Result`): Candle's own
/// errors come back as they were, ours wrapped with their message.
impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(e) => e,
            other => candle_core::Error::wrap(other),
        }
    }
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn config(block: &'static str, message: impl Into<String>) -> Self {
        Error::Config {
            block,
            message: message.into(),
        }
    }

    pub fn unsupported(block: &'static str, message: impl Into<String>) -> Self {
        Error::Unsupported {
            block,
            message: message.into(),
        }
    }

    pub fn weights(block: &'static str, message: impl Into<String>) -> Self {
        Error::Weights {
            block,
            message: message.into(),
        }
    }

    pub fn input(block: &'static str, input: &str, message: impl Into<String>) -> Self {
        Error::Input {
            block,
            input: input.to_string(),
            message: message.into(),
        }
    }
}

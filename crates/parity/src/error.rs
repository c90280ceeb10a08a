//! Errors of the parity tool. Every one of them means "unusable input" (exit code 2); a
//! numerical mismatch is not an error but a failed check (exit code 1).

use std::path::PathBuf;

/// Why a bundle could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: PathBuf, message: String },
    #[error("{path}: not a parity bundle: {message}")]
    Bundle { path: PathBuf, message: String },
    #[error("{path}: unknown block id `{id}`; known blocks: {known}")]
    UnknownBlock { path: PathBuf, id: String, known: String },
    #[error("{path}: {}", with_block(block, source))]
    Block {
        path: PathBuf,
        block: String,
        source: Box<unet_attention::Error>,
    },
    #[error("{path}: no parity bundles (*.safetensors) found")]
    NoBundles { path: PathBuf },
    #[error("{0}")]
    Usage(String),
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

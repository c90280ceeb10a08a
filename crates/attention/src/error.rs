//! The crate's error type.

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
    /// An error from Candle (missing tensor, shape mismatch on load, device error, ...).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
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

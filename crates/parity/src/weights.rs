//! Weights that remember what was read from them: `unet_attention::weights`, the one tracker the
//! library's model-folder loaders and this tool share (a `VarBuilder` backend that records which
//! tensors a block loaded, names a missing key with the closest present one, checks dtype and
//! shape before a byte is read, and records dtype conversions).

pub use unet_attention::weights::*;

//! Safetensors files read neither whole nor mapped: `unet_attention::files::safetensors`, the one
//! reader the library's model loaders and this tool share (the header checked exactly as
//! `safetensors::SafeTensors::read_metadata` checks it, each tensor's bytes read on their own,
//! only when asked for).

pub use unet_attention::files::safetensors::{ReadError as Error, Source, StFile, MAX_HEADER};

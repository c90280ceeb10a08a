//! Check Candle ports of diffusion U-Net attention blocks against PyTorch reference bundles.
//!
//! A bundle (format "1", see docs/bundle-format.md) is one safetensors file with a block's state dict,
//! its forward inputs and PyTorch's outputs. [`check::check_file`] rebuilds the block through
//! the [`registry`], runs it and applies the pass rule of [`compare`]. [`port::PortCheck`] does
//! the same for a forward of your own (any Candle module): same rule, same stage traces.

pub mod bundle;
pub mod check;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub mod compare;
pub mod detect;
pub mod error;
pub mod files;
pub mod guard;
pub mod hub;
pub mod memory;
pub mod model;
mod next_step;
pub mod pickle;
pub mod port;
pub mod registry;
pub mod show;
pub mod st_file;
pub mod terminal;
pub mod trace;
pub mod weights;

pub use bundle::Bundle;
pub use check::{check_file, prepare_bundle, Options, Prepared, Report};
pub use error::ParityError;
pub use port::{PortCheck, PortReport};

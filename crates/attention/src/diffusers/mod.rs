//! Hugging Face diffusers (0.42.1): the `Attention` class with its default processors, and the
//! Stable Diffusion transformer bottleneck (`FeedForward`/`GEGLU`, `BasicTransformerBlock`,
//! `Transformer2DModel`).

pub mod attention;
pub mod feed_forward;
pub mod transformer;

pub use attention::{Attention, AttentionConfig, Processor};

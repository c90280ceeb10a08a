//! CompVis latent-diffusion / Stable Diffusion (`ldm`): the linear attention of
//! `ldm.modules.attention`, the transformer bottleneck (`CrossAttention`,
//! `BasicTransformerBlock`, `SpatialTransformer`, SD 1.x and SD 2.x forms) and the first-stage /
//! DDPM-model mid attention of `ldm.modules.diffusionmodules.model` (`AttnBlock`,
//! `SpatialSelfAttention`, `LinAttnBlock`), and that model's mid block ([`mid_block`]: `ResnetBlock`, `MidBlock`).

pub mod linear;
pub mod mid_block;
pub mod transformer;
pub mod vae;

pub use linear::{LinearAttention, LinearAttentionConfig};
pub use mid_block::{MidBlock, MidBlockConfig, ResnetBlock, ResnetBlockConfig};
pub use transformer::{
    BasicTransformerBlock, BasicTransformerBlockConfig, CrossAttention, CrossAttentionConfig, SpatialTransformer,
    SpatialTransformerConfig,
};
pub use vae::{AttnBlock, AttnBlockConfig, LinAttnBlock, SpatialSelfAttention};

//! diffusers' `models/controlnets/` (0.42.1): `ControlNetModel`'s bottleneck and
//! `UNetControlNetXSModel`'s mid block.

pub mod controlnet;
pub mod controlnet_xs;

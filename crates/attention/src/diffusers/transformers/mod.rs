//! diffusers' `models/transformers/` (0.42.1): `Transformer2DModel` with the
//! `BasicTransformerBlock` of `attention.py`, Versatile Diffusion's `DualTransformer2DModel`, the
//! video blocks' `TransformerTemporalModel` (with `TemporalConvLayer`) and Stable Video Diffusion's
//! `TransformerSpatioTemporalModel`.

pub mod dual_transformer;
pub mod temporal;
pub mod transformer;
pub mod transformer_spatio_temporal;

//! diffusers' `models/unets/` (0.42.1): the U-Net and VAE mid blocks of `unet_2d_blocks.py`,
//! `unet_1d_blocks.py`, `unet_3d_blocks.py` and `unet_motion_model.py`, and [`any_mid_block`]'s
//! typed enums over all of them.

pub mod any_mid_block;
pub mod mid_block;
pub mod mid_block_1d;
pub mod mid_block_1d_temporal;
pub mod mid_block_3d;
pub mod mid_block_motion;
pub mod mid_block_simple_cross;
pub mod mid_block_spatio_temporal;

//! Check Candle ports of diffusion U-Net attention blocks against PyTorch reference bundles.
pub mod registry;

//! Drop-in for candle-transformers 0.11.1's `models::stable_diffusion::vae`: the same public
//! names, config fields, `Default` and signatures, running our diffusers-exact
//! [`models::AutoencoderKL`](crate::models::AutoencoderKL).
//!
//! [`AutoEncoderKLConfig::to_diffusers`] gives the `config.json` kwargs: one
//! `DownEncoderBlock2D` / `UpDecoderBlock2D` per entry of `block_out_channels` (what
//! candle-transformers builds), the rest at diffusers' `AutoencoderKL` defaults (SiLU, a mid
//! block with attention; `scaling_factor` is the pipeline's business, as in candle-transformers).
//!
//! One difference in the result: [`DiagonalGaussianDistribution`] is diffusers', which clamps the
//! log variance to [-30, 20] before taking `std`; candle-transformers' does not clamp (the same
//! for any encoder output whose log variance is in that range).

use crate::models::AutoencoderKL as Diffusers;
use crate::models::AutoencoderKLConfig as DiffusersConfig;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

pub use crate::models::DiagonalGaussianDistribution;

const BLOCK: &str = "stable_diffusion::vae::AutoEncoderKL";

/// Modules of diffusers' `AutoencoderKL` a config may switch off, asked about by name (besides the
/// names near the ones read): the quant convs.
const OPTIONAL: [&str; 2] = ["quant_conv.weight", "post_quant_conv.weight"];

/// What to do when the weights hold more than the config builds.
const HINT: &str = "the config describes another model than these weights (block_out_channels, layers_per_block, \
                    use_quant_conv / use_post_quant_conv); set them from the model's config.json, or load the \
                    folder with unet_attention::models::AutoencoderKL::load";

/// candle-transformers 0.11.1's `AutoEncoderKLConfig`, field for field.
#[derive(Debug, Clone)]
pub struct AutoEncoderKLConfig {
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub latent_channels: usize,
    pub norm_num_groups: usize,
    pub use_quant_conv: bool,
    pub use_post_quant_conv: bool,
}

impl Default for AutoEncoderKLConfig {
    /// diffusers' `AutoencoderKL()` (and candle-transformers' `Default`): one block of 64
    /// channels, one layer, 4 latent channels, 32 groups, both quant convs.
    fn default() -> Self {
        Self {
            block_out_channels: vec![64],
            layers_per_block: 1,
            latent_channels: 4,
            norm_num_groups: 32,
            use_quant_conv: true,
            use_post_quant_conv: true,
        }
    }
}

impl AutoEncoderKLConfig {
    /// The diffusers `config.json` kwargs this config describes, with `in_channels` and
    /// `out_channels` (candle-transformers passes them to `new`).
    pub fn to_diffusers(&self, in_channels: usize, out_channels: usize) -> Result<DiffusersConfig> {
        let n = self.block_out_channels.len();
        if n == 0 {
            return Err(Error::config(BLOCK, "`block_out_channels` is empty"));
        }
        Ok(DiffusersConfig {
            in_channels,
            out_channels,
            down_block_types: vec!["DownEncoderBlock2D".into(); n],
            up_block_types: vec!["UpDecoderBlock2D".into(); n],
            block_out_channels: self.block_out_channels.clone(),
            layers_per_block: self.layers_per_block,
            latent_channels: self.latent_channels,
            norm_num_groups: self.norm_num_groups,
            use_quant_conv: self.use_quant_conv,
            use_post_quant_conv: self.use_post_quant_conv,
            ..DiffusersConfig::default()
        })
    }
}

/// candle-transformers 0.11.1's `AutoEncoderKL` API over our diffusers port.
#[derive(Debug, Clone)]
pub struct AutoEncoderKL {
    inner: Diffusers,
    pub config: AutoEncoderKLConfig,
}

impl AutoEncoderKL {
    /// candle-transformers' constructor: the weights at `vs`'s root under diffusers' names.
    /// Strict: weights under `vs`'s prefix that the model does not read are refused by name
    /// (`super`'s docs), where candle-transformers leaves them.
    pub fn new(vs: VarBuilder, in_channels: usize, out_channels: usize, config: AutoEncoderKLConfig) -> Result<Self> {
        let cfg = config.to_diffusers(in_channels, out_channels)?;
        let extra: Vec<String> = OPTIONAL.iter().map(|s| s.to_string()).collect();
        let inner = super::build_strict(vs, BLOCK, &extra, HINT, |vb| Diffusers::new(vb, &cfg))?;
        Ok(Self { inner, config })
    }

    /// The latent distribution of images `xs` `(B, in_channels, H, W)` in [-1, 1].
    pub fn encode(&self, xs: &Tensor) -> Result<DiagonalGaussianDistribution> {
        self.inner.encode(xs)
    }

    /// Images from latents `xs` `(B, latent_channels, h, w)` (already divided by the scaling
    /// factor).
    pub fn decode(&self, xs: &Tensor) -> Result<Tensor> {
        self.inner.decode(xs)
    }

    /// The diffusers-named model underneath.
    pub fn inner(&self) -> &Diffusers {
        &self.inner
    }

    pub fn into_inner(self) -> Diffusers {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed VAE's `config.json`, written in candle-transformers' terms, gives the same
    /// kwargs (the pipeline's `sample_size` aside).
    #[test]
    fn converts_to_the_config_json_kwargs() {
        let path = format!(
            "{}/../../weights/models/diffusers_vae/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut want = DiffusersConfig::from_config_json(&json).unwrap();
        want.sample_size = None;
        let cfg = AutoEncoderKLConfig {
            block_out_channels: vec![8, 16],
            norm_num_groups: 4,
            ..Default::default()
        };
        let got = cfg.to_diffusers(3, 3).unwrap();
        assert_eq!(serde_json::to_value(got).unwrap(), serde_json::to_value(want).unwrap());
        let empty = AutoEncoderKLConfig {
            block_out_channels: vec![],
            ..Default::default()
        };
        assert!(matches!(empty.to_diffusers(3, 3), Err(Error::Config { .. })));
    }
}

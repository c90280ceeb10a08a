//! Single-file checkpoints in the original `ldm` layout (what diffusers 0.42.1's `from_single_file`
//! reads): one file holding a whole Stable Diffusion 1.x / 2.x model as `LatentDiffusion.state_dict()`
//! lays it out, the U-Net under `model.diffusion_model.`, the VAE under `first_stage_model.`, the
//! text encoder under `cond_stage_model.`.
//!
//! [`UNet2DConditionModel::from_single_file`] and [`AutoencoderKL::from_single_file`] build our
//! diffusers models from such a file in one call. The config is the original one (the inference
//! YAML's `unet_config.params` / `first_stage_config.params`, [`LdmUNetConfig`] / [`LdmVaeConfig`]),
//! given, or inferred from the file as Stable Diffusion 1.x's or 2.x's (the cross-attention width,
//! 768 or 1024, decides, as the text encoder does in diffusers' `infer_diffusers_model_type`); it
//! becomes the diffusers config as diffusers derives it ([`LdmUNetConfig::to_diffusers`]). The
//! weights are read under their ldm names through the key map of diffusers'
//! `convert_ldm_unet_checkpoint` / `convert_ldm_vae_checkpoint` (`keys`), run from the name the
//! model asks for to the ldm key, so that the load is as strict as a folder's: a missing key is
//! named with the closest present one, and a key under the model's prefix that the model never
//! read is refused by name. Other prefixes (the text encoder, EMA copies) are left alone.
//!
//! `unet-parity` checks both against the real ldm forward (blocks `ldm.UNetModel`,
//! `ldm.AutoencoderKL`; bundles by `scripts/export_single_file.py`) and reads `.ckpt` pickles too
//! (`from_ldm` over its checkpoint reader).

mod keys;
pub mod ldm_config;

pub use keys::{unet_stage, vae_stage, LdmKey};
pub use ldm_config::{LdmDdConfig, LdmUNetConfig, LdmVaeConfig};

use crate::files::shards::SafetensorsFiles;
use crate::models::folder::SHOWN;
use crate::models::{AutoencoderKL, UNet2DConditionModel};
use crate::weights::{unused_list, TrackedWeights, WeightSource};
use crate::{Error, Result};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use ldm_config::{UNET_BLOCK, VAE_BLOCK};
use std::path::Path;
use std::sync::Arc;

/// Where a single file keeps the U-Net and the VAE.
pub const UNET_PREFIX: &str = "model.diffusion_model.";
pub const VAE_PREFIX: &str = "first_stage_model.";

type Rename = dyn Fn(&str) -> Option<LdmKey> + Send + Sync;

/// A `VarBuilder` backend that serves diffusers names from ldm-named weights.
struct LdmNames<'a> {
    inner: VarBuilder<'a>,
    rename: Box<Rename>,
    block: &'static str,
}

impl LdmNames<'_> {
    fn lookup(&self, name: &str) -> candle_core::Result<LdmKey> {
        (self.rename)(name).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "{}: the model asks for the diffusers weight `{name}`, which the ldm key map does not place",
                self.block
            ))
        })
    }
}

impl SimpleBackend for LdmNames<'_> {
    fn get(
        &self,
        s: Shape,
        name: &str,
        init: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let key = self.lookup(name)?;
        if !key.conv_as_linear {
            return self
                .inner
                .get_with_hints_dtype(s, &key.name, init, dtype)?
                .to_device(dev);
        }
        // ldm's attention projections are 1×1 convolutions: (C, C, 1, 1) for diffusers' (C, C)
        let t = self.inner.get_unchecked_dtype(&key.name, dtype)?;
        let fits = t.dims() == s.dims() || t.dims().strip_suffix(&[1, 1]) == Some(s.dims());
        if !fits {
            return Err(candle_core::Error::Msg(format!(
                "{}: `{}{}` has shape {:?}, expected {:?} (or {:?} with two trailing 1s)",
                self.block,
                self.inner.prefix(),
                key.name,
                t.dims(),
                s.dims(),
                s.dims()
            )));
        }
        t.reshape(s)?.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let key = self.lookup(name)?;
        self.inner.get_unchecked_dtype(&key.name, dtype)?.to_device(dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        (self.rename)(name).is_some_and(|key| self.inner.contains_tensor(&key.name))
    }
}

fn renamed<'a>(vb: VarBuilder<'a>, block: &'static str, rename: Box<Rename>) -> VarBuilder<'a> {
    let (dtype, device) = (vb.dtype(), vb.device().clone());
    let backend = LdmNames {
        inner: vb,
        rename,
        block,
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device)
}

/// A file's tensors, the model built from those under `prefix`, then the strict check: a tensor
/// under the prefix the model never read is refused by name.
fn build_from<T>(
    source: Arc<dyn WeightSource>,
    prefix: &str,
    block: &'static str,
    dtype: DType,
    device: &Device,
    build: impl FnOnce(VarBuilder<'static>) -> Result<T>,
) -> Result<T> {
    let location = source.location().unwrap_or_else(|| "the checkpoint".into());
    if !source.names().iter().any(|n| n.starts_with(prefix)) {
        return Err(Error::weights(
            block,
            format!("{location}: no tensor under `{prefix}` (not an ldm-layout checkpoint of this model)"),
        ));
    }
    let tracked = TrackedWeights::from_source(source);
    let vb = tracked.var_builder(dtype, device);
    let vb = match prefix.strip_suffix('.') {
        Some(p) => vb.pp(p),
        None => vb,
    };
    let model = build(vb)?;
    let unused: Vec<String> = tracked.unused().into_iter().filter(|n| n.starts_with(prefix)).collect();
    if unused.is_empty() {
        return Ok(model);
    }
    let read = tracked.read();
    Err(Error::weights(
        block,
        format!(
            "{} tensor(s) under `{prefix}` in {location} not used by the model: {}",
            unused.len(),
            unused_list(&unused, &read, SHOWN)
        ),
    ))
}

/// The cross-attention width of a single file's U-Net (`attn2.to_k` of the first transformer).
fn context_width(source: &dyn WeightSource) -> Option<(String, usize)> {
    let mut names = source.names();
    names.sort();
    let name = names
        .into_iter()
        .find(|n| n.starts_with(UNET_PREFIX) && n.ends_with("transformer_blocks.0.attn2.to_k.weight"))?;
    let width = *source.describe(&name)?.1.get(1)?;
    Some((name, width))
}

impl LdmUNetConfig {
    /// Stable Diffusion 1.x's or 2.x's config, told apart by the file's cross-attention width (768
    /// for 1.x's CLIP ViT-L, 1024 for 2.x's OpenCLIP ViT-H); with `label_emb` (added conditions),
    /// SDXL base's (2048 wide, 2,816 features) or the SDXL refiner's (1280, 2,560). Anything else
    /// (another width, no transformer) is an error asking for the config.
    pub fn infer(source: &dyn WeightSource) -> Result<Self> {
        let label = format!("{UNET_PREFIX}label_emb.0.0.weight");
        if let Some((_, shape)) = source.describe(&label) {
            let features = shape.get(1).copied();
            return match (context_width(source), features) {
                (Some((_, 2048)), Some(2816)) => Ok(Self::sdxl()),
                (Some((_, 1280)), Some(2560)) => Ok(Self::sdxl_refiner()),
                (width, _) => Err(Error::config(
                    UNET_BLOCK,
                    format!(
                        "`{label}` is {shape:?} and the cross-attention {}: not SDXL base (2048 wide, 2816 \
                         features) or refiner (1280, 2560); give the config (the YAML's network_config.params)",
                        width.map_or("absent".to_string(), |(name, w)| format!("`{name}` {w} wide")),
                    ),
                )),
            };
        }
        match context_width(source) {
            Some((_, 768)) => Ok(Self::sd1()),
            Some((_, 1024)) => Ok(Self::sd2()),
            Some((name, other)) => Err(Error::config(
                UNET_BLOCK,
                format!(
                    "`{name}` is {other} wide: not Stable Diffusion 1.x (768) or 2.x (1024); give the config \
                     (the inference YAML's unet_config.params)"
                ),
            )),
            None => Err(Error::config(
                UNET_BLOCK,
                format!(
                    "no `{UNET_PREFIX}…attn2.to_k.weight` in the file: give the config (the YAML's unet_config.params)"
                ),
            )),
        }
    }
}

impl LdmVaeConfig {
    /// Stable Diffusion's first stage when the file's `encoder.conv_in` is 128 wide, else an error
    /// asking for the config; in an SDXL file (a U-Net with `label_emb`) with SDXL's
    /// `scale_factor`, 0.13025, as `sd_xl_base.yaml` has it and diffusers infers it.
    pub fn infer(source: &dyn WeightSource) -> Result<Self> {
        let name = format!("{VAE_PREFIX}encoder.conv_in.weight");
        let sdxl = source.describe(&format!("{UNET_PREFIX}label_emb.0.0.weight")).is_some();
        match source.describe(&name).map(|(_, shape)| shape) {
            Some(shape) if shape.first() == Some(&128) && sdxl => Ok(Self {
                scale_factor: Some(0.13025),
                ..Self::sd()
            }),
            Some(shape) if shape.first() == Some(&128) => Ok(Self::sd()),
            found => Err(Error::config(
                VAE_BLOCK,
                format!(
                    "`{name}` is {found:?}, not Stable Diffusion's (128 channels): give the config \
                     (the YAML's first_stage_config.params and scale_factor)"
                ),
            )),
        }
    }
}

/// `error` with the ldm keys of the diffusers names it quotes (`` `name` ``) appended, so that a
/// shape or dtype error raised by a layer (which knows the diffusers name) names the file's key.
fn with_ldm_keys(error: Error, prefix: &str, block: &'static str, rename: &dyn Fn(&str) -> Option<LdmKey>) -> Error {
    let message = error.to_string();
    let keys: Vec<String> = message
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|name| rename(name).map(|key| format!("`{name}` is `{prefix}{}` in the file", key.name)))
        .collect();
    if keys.is_empty() {
        return error;
    }
    Error::weights(block, format!("{message} ({})", keys.join(", ")))
}

fn vb_prefix(vb: &VarBuilder) -> String {
    let p = vb.prefix();
    if p.is_empty() {
        p
    } else {
        format!("{p}.")
    }
}

/// What the two single-file models differ in: their prefix, key map, config and constructor.
trait LdmLayout: Sized {
    type Config: Clone + Send + Sync + 'static;
    const PREFIX: &'static str;
    const BLOCK: &'static str;
    fn key(name: &str, cfg: &Self::Config) -> Option<LdmKey>;
    fn infer(source: &dyn WeightSource) -> Result<Self::Config>;
    /// The model from diffusers-named weights and the original config.
    fn build(vb: VarBuilder, cfg: &Self::Config) -> Result<Self>;
}

impl LdmLayout for UNet2DConditionModel {
    type Config = LdmUNetConfig;
    const PREFIX: &'static str = UNET_PREFIX;
    const BLOCK: &'static str = UNET_BLOCK;
    fn key(name: &str, cfg: &LdmUNetConfig) -> Option<LdmKey> {
        keys::unet(name, cfg)
    }
    fn infer(source: &dyn WeightSource) -> Result<LdmUNetConfig> {
        LdmUNetConfig::infer(source)
    }
    fn build(vb: VarBuilder, cfg: &LdmUNetConfig) -> Result<Self> {
        Self::new(vb, &cfg.to_diffusers()?)
    }
}

impl LdmLayout for AutoencoderKL {
    type Config = LdmVaeConfig;
    const PREFIX: &'static str = VAE_PREFIX;
    const BLOCK: &'static str = VAE_BLOCK;
    fn key(name: &str, cfg: &LdmVaeConfig) -> Option<LdmKey> {
        keys::vae(name, cfg)
    }
    fn infer(source: &dyn WeightSource) -> Result<LdmVaeConfig> {
        LdmVaeConfig::infer(source)
    }
    fn build(vb: VarBuilder, cfg: &LdmVaeConfig) -> Result<Self> {
        Self::new(vb, &cfg.to_diffusers()?)
    }
}

/// The model from ldm-named weights at `vb`, errors naming the file's keys.
fn from_ldm<M: LdmLayout>(vb: VarBuilder, config: &M::Config) -> Result<M> {
    let (cfg, prefix) = (config.clone(), vb_prefix(&vb));
    let vb = renamed(vb, M::BLOCK, Box::new(move |n| M::key(n, &cfg)));
    M::build(vb, config).map_err(|e| with_ldm_keys(e, &prefix, M::BLOCK, &|n| M::key(n, config)))
}

/// The model from a single file's tensors, the config given or inferred, strict under its prefix.
fn from_weights<M: LdmLayout>(
    source: Arc<dyn WeightSource>,
    config: Option<&M::Config>,
    dtype: DType,
    device: &Device,
) -> Result<M> {
    let config = match config {
        Some(c) => c.clone(),
        None => M::infer(source.as_ref())?,
    };
    build_from(source, M::PREFIX, M::BLOCK, dtype, device, |vb| {
        from_ldm::<M>(vb, &config)
    })
}

impl UNet2DConditionModel {
    /// The U-Net from ldm-named weights: `vb` at the U-Net's keys (`input_blocks.0.0.weight`, ...:
    /// a single file's `model.diffusion_model`), with the original config.
    pub fn from_ldm(vb: VarBuilder, config: &LdmUNetConfig) -> Result<Self> {
        from_ldm(vb, config)
    }

    /// The U-Net of a single-file checkpoint (`.safetensors`, the U-Net under
    /// `model.diffusion_model.`), the config given or inferred ([`LdmUNetConfig::infer`]), the
    /// weights converted to `dtype`. Strict as [`Self::load`]; `.ckpt` pickles: `unet-parity`'s
    /// checkpoint reader and [`Self::from_single_file_weights`].
    pub fn from_single_file(
        path: impl AsRef<Path>,
        config: Option<&LdmUNetConfig>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let files = SafetensorsFiles::open_file(path.as_ref())?;
        from_weights(Arc::new(files), config, dtype, device)
    }

    /// [`Self::from_single_file`] over any source of the file's tensors (full names).
    pub fn from_single_file_weights(
        source: Arc<dyn WeightSource>,
        config: Option<&LdmUNetConfig>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        from_weights(source, config, dtype, device)
    }
}

impl AutoencoderKL {
    /// The VAE from ldm-named weights: `vb` at the VAE's keys (`encoder.conv_in.weight`, ...: a
    /// single file's `first_stage_model`), with the original config.
    pub fn from_ldm(vb: VarBuilder, config: &LdmVaeConfig) -> Result<Self> {
        from_ldm(vb, config)
    }

    /// The VAE of a single-file checkpoint (`first_stage_model.`), as
    /// [`UNet2DConditionModel::from_single_file`] loads the U-Net.
    pub fn from_single_file(
        path: impl AsRef<Path>,
        config: Option<&LdmVaeConfig>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let files = SafetensorsFiles::open_file(path.as_ref())?;
        from_weights(Arc::new(files), config, dtype, device)
    }

    /// [`Self::from_single_file`] over any source of the file's tensors (full names).
    pub fn from_single_file_weights(
        source: Arc<dyn WeightSource>,
        config: Option<&LdmVaeConfig>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        from_weights(source, config, dtype, device)
    }
}

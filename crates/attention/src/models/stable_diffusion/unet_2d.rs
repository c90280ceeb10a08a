//! Drop-in for candle-transformers 0.11.1's `models::stable_diffusion::unet_2d`: the same public
//! names, config fields, `Default` and signatures, running our diffusers-exact
//! [`models::UNet2DConditionModel`](crate::models::UNet2DConditionModel).
//!
//! candle-transformers' config describes a U-Net by its down blocks ([`BlockConfig`]: width,
//! cross-attention or not with its transformer depth, head count); [`UNet2DConditionModelConfig::to_diffusers`]
//! turns it into the `config.json` kwargs our model takes, as candle-transformers' `new` builds
//! its blocks:
//!
//! * `use_cross_attn: Some(depth)` is a `CrossAttnDownBlock2D` (and its mirror
//!   `CrossAttnUpBlock2D`) with `depth` transformer layers, `None` a `DownBlock2D` / `UpBlock2D`;
//!   the up blocks are the down blocks reversed; the mid block is always a
//!   `UNetMidBlock2DCrossAttn`, as deep as the last block's `use_cross_attn` (1 when `None`).
//! * `attention_head_dim` is the head count (what SD's `config.json` means by it).
//! * Everything the config cannot express takes diffusers' `UNet2DConditionModel` defaults, which
//!   are what SD 1.x / 2.x / XL use: SiLU, a time embedding 4 × the first width wide, 3 × 3
//!   `conv_in` / `conv_out`, `upcast_attention: false` (SD 2.1's `config.json` sets it; diffusers'
//!   default attention processor, and ours, never read it), no `text_time` addition embedding.
//! * `use_flash_attn` is accepted and ignored: the attention core is this crate's
//!   [`sdpa`](crate::sdpa) dispatch, which picks its kernel per device (the `flash-attn` feature
//!   included). `sliced_attention_size` is ignored: slicing only bounds memory, the result is the
//!   same.
//!
//! Not covered: candle-transformers' U-Net has no `text_time` embedding, so neither does this
//! drop-in: an SDXL checkpoint's `add_embedding` weights would be left unread and the pooled text /
//! time ids never reach the model (as in candle-transformers' SDXL pipeline), so `new` refuses
//! them by name. For SDXL as diffusers runs it, load [`crate::models::UNet2DConditionModel`] from
//! the `unet/` folder and call `forward_with` with `added_cond`.
//!
//! Nor can the config give the mid block another depth than the last block's `use_cross_attn`
//! (diffusers' `transformer_layers_per_block[-1]`): a folder with `transformer_layers_per_block`
//! `[1, 2]` whose last block has no cross-attention has a mid block two layers deep, which no
//! config of this drop-in builds. `new` refuses those weights by name (the second layer is never
//! read); the folder loader builds it.

use crate::diffusers::unets::mid_block::LayersPerBlock;
use crate::models::{ControlNetResiduals, ForwardArgs};
use crate::models::{PerBlock, UNet2DConditionModel as Diffusers, UNet2DConditionModelConfig as DiffusersConfig};
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

const BLOCK: &str = "stable_diffusion::unet_2d::UNet2DConditionModel";

/// Modules of diffusers' `UNet2DConditionModel` this config cannot switch on, asked about by name
/// (besides the names near the ones read): SDXL's addition embedding, LCM's `timestep_cond`,
/// class embeddings, `encoder_hid_proj`.
const OPTIONAL: [&str; 4] = [
    "add_embedding.linear_1.weight",
    "time_embedding.cond_proj.weight",
    "class_embedding.linear_1.weight",
    "encoder_hid_proj.weight",
];

/// What to do when the weights hold more than the config builds.
const HINT: &str = "this config cannot describe the model these weights hold (candle-transformers' config has no \
                    field for it: e.g. a mid block deeper than its last block's use_cross_attn, from \
                    transformer_layers_per_block [1, 2] with a plain last block, or SDXL's add_embedding); load the \
                    model folder with unet_attention::models::UNet2DConditionModel::load, which reads its config.json";

/// One down block (and its mirror up block), as candle-transformers 0.11.1 describes it.
#[derive(Debug, Clone, Copy)]
pub struct BlockConfig {
    /// `block_out_channels[i]`.
    pub out_channels: usize,
    /// `None`: `DownBlock2D` / `UpBlock2D`; `Some(depth)`: the cross-attention blocks with
    /// `depth` transformer layers (`transformer_layers_per_block[i]`).
    pub use_cross_attn: Option<usize>,
    /// The number of heads (`attention_head_dim[i]` of SD's `config.json`).
    pub attention_head_dim: usize,
}

/// candle-transformers 0.11.1's `UNet2DConditionModelConfig`, field for field.
#[derive(Debug, Clone)]
pub struct UNet2DConditionModelConfig {
    pub center_input_sample: bool,
    pub flip_sin_to_cos: bool,
    pub freq_shift: f64,
    pub blocks: Vec<BlockConfig>,
    pub layers_per_block: usize,
    pub downsample_padding: usize,
    pub mid_block_scale_factor: f64,
    pub norm_num_groups: usize,
    pub norm_eps: f64,
    pub cross_attention_dim: usize,
    /// Ignored (the result does not depend on it).
    pub sliced_attention_size: Option<usize>,
    pub use_linear_projection: bool,
}

impl Default for UNet2DConditionModelConfig {
    /// diffusers' `UNet2DConditionModel()` defaults, as candle-transformers' `Default`: four
    /// blocks 320, 640, 1280, 1280 (the last without cross-attention), 8 heads, 2 layers per
    /// block, 32 groups, eps 1e-5, a 1280-wide context.
    fn default() -> Self {
        let block = |out_channels, use_cross_attn| BlockConfig {
            out_channels,
            use_cross_attn,
            attention_head_dim: 8,
        };
        Self {
            center_input_sample: false,
            flip_sin_to_cos: true,
            freq_shift: 0.0,
            blocks: vec![
                block(320, Some(1)),
                block(640, Some(1)),
                block(1280, Some(1)),
                block(1280, None),
            ],
            layers_per_block: 2,
            downsample_padding: 1,
            mid_block_scale_factor: 1.0,
            norm_num_groups: 32,
            norm_eps: 1e-5,
            cross_attention_dim: 1280,
            sliced_attention_size: None,
            use_linear_projection: false,
        }
    }
}

impl UNet2DConditionModelConfig {
    /// The diffusers `config.json` kwargs this config describes, with `in_channels` and
    /// `out_channels` (candle-transformers passes them to `new`); see the module docs for the
    /// values filled in.
    pub fn to_diffusers(&self, in_channels: usize, out_channels: usize) -> Result<DiffusersConfig> {
        if self.blocks.is_empty() {
            return Err(Error::config(
                BLOCK,
                "`blocks` is empty: a U-Net needs at least one block",
            ));
        }
        let kind = |b: &BlockConfig, cross: &str, plain: &str| {
            if b.use_cross_attn.is_some() { cross } else { plain }.to_string()
        };
        let per_block = |f: fn(&BlockConfig) -> usize| PerBlock::List(self.blocks.iter().map(f).collect());
        Ok(DiffusersConfig {
            in_channels,
            out_channels,
            center_input_sample: self.center_input_sample,
            flip_sin_to_cos: self.flip_sin_to_cos,
            freq_shift: self.freq_shift,
            down_block_types: self
                .blocks
                .iter()
                .map(|b| kind(b, "CrossAttnDownBlock2D", "DownBlock2D"))
                .collect(),
            mid_block_type: Some("UNetMidBlock2DCrossAttn".into()),
            up_block_types: self
                .blocks
                .iter()
                .rev()
                .map(|b| kind(b, "CrossAttnUpBlock2D", "UpBlock2D"))
                .collect(),
            block_out_channels: self.blocks.iter().map(|b| b.out_channels).collect(),
            layers_per_block: PerBlock::One(self.layers_per_block),
            downsample_padding: self.downsample_padding,
            mid_block_scale_factor: self.mid_block_scale_factor,
            norm_num_groups: Some(self.norm_num_groups),
            norm_eps: self.norm_eps,
            cross_attention_dim: PerBlock::One(self.cross_attention_dim),
            transformer_layers_per_block: PerBlock::List(
                self.blocks
                    .iter()
                    .map(|b| LayersPerBlock::One(b.use_cross_attn.unwrap_or(1)))
                    .collect(),
            ),
            attention_head_dim: per_block(|b| b.attention_head_dim),
            use_linear_projection: self.use_linear_projection,
            ..DiffusersConfig::default()
        })
    }
}

/// candle-transformers 0.11.1's `UNet2DConditionModel` API over our diffusers port.
#[derive(Debug, Clone)]
pub struct UNet2DConditionModel {
    inner: Diffusers,
}

impl UNet2DConditionModel {
    /// candle-transformers' constructor: the weights at `vs`'s root under diffusers' names.
    /// `use_flash_attn` is ignored (module docs). Strict: weights under `vs`'s prefix that the model
    /// does not read are refused by name (`super`'s docs), where candle-transformers leaves them.
    pub fn new(
        vs: VarBuilder,
        in_channels: usize,
        out_channels: usize,
        use_flash_attn: bool,
        config: UNet2DConditionModelConfig,
    ) -> Result<Self> {
        let _ = use_flash_attn;
        let cfg = config.to_diffusers(in_channels, out_channels)?;
        let n = config.blocks.len();
        let extra: Vec<String> = (0..n)
            .flat_map(|i| {
                [
                    format!("down_blocks.{i}.attentions.0.norm.weight"),
                    format!("up_blocks.{i}.attentions.0.norm.weight"),
                ]
            })
            .chain(OPTIONAL.iter().map(|s| s.to_string()))
            .collect();
        let inner = super::build_strict(vs, BLOCK, &extra, HINT, |vb| Diffusers::new(vb, &cfg))?;
        Ok(Self { inner })
    }

    /// `forward(xs, timestep, encoder_hidden_states)`: `xs` `(B, in_channels, H, W)`,
    /// `encoder_hidden_states` `(B, tokens, cross_attention_dim)`.
    pub fn forward(&self, xs: &Tensor, timestep: f64, encoder_hidden_states: &Tensor) -> Result<Tensor> {
        self.inner.forward(xs, timestep, encoder_hidden_states)
    }

    /// The forward with a ControlNet's residuals: one per skip of the down path and one for the
    /// mid block's output, added as diffusers adds them ([`ControlNetResiduals`]). diffusers takes
    /// them only together (one alone is its T2I-Adapter path, or nothing), so one without the
    /// other is an error here, where candle-transformers adds whichever it is given.
    pub fn forward_with_additional_residuals(
        &self,
        xs: &Tensor,
        timestep: f64,
        encoder_hidden_states: &Tensor,
        down_block_additional_residuals: Option<&[Tensor]>,
        mid_block_additional_residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let controlnet = match (down_block_additional_residuals, mid_block_additional_residual) {
            (Some(down), Some(mid)) => Some(ControlNetResiduals { down, mid }),
            (None, None) => None,
            _ => {
                return Err(Error::input(
                    BLOCK,
                    "down_block_additional_residuals",
                    "a ControlNet's down and mid residuals go together (diffusers ignores one alone)",
                ))
            }
        };
        let args = ForwardArgs {
            controlnet,
            ..ForwardArgs::default()
        };
        self.inner.forward_with(xs, timestep, encoder_hidden_states, args)
    }

    /// The diffusers-named model underneath (its config, `forward_with` for masks and SDXL's
    /// `added_cond`).
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
    use serde_json::Value;

    fn config_json(model: &str) -> Value {
        let path = format!(
            "{}/../../weights/models/{model}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn block(out_channels: usize, use_cross_attn: Option<usize>, attention_head_dim: usize) -> BlockConfig {
        BlockConfig {
            out_channels,
            use_cross_attn,
            attention_head_dim,
        }
    }

    /// The committed models' `config.json`s, written in candle-transformers' terms, give the
    /// same kwargs (SD 2.x's `upcast_attention` and SDXL's `text_time` aside: the config has no
    /// field for them).
    #[test]
    fn converts_to_the_config_json_kwargs() {
        let sd1 = UNet2DConditionModelConfig {
            blocks: vec![block(8, Some(1), 2), block(16, None, 2)],
            layers_per_block: 1,
            norm_num_groups: 4,
            cross_attention_dim: 24,
            ..Default::default()
        };
        let sd2 = UNet2DConditionModelConfig {
            blocks: vec![block(8, Some(1), 2), block(16, None, 4)],
            cross_attention_dim: 32,
            use_linear_projection: true,
            ..sd1.clone()
        };
        let sdxl = UNet2DConditionModelConfig {
            blocks: vec![block(8, None, 1), block(16, Some(2), 2)],
            cross_attention_dim: 24,
            use_linear_projection: true,
            ..sd1.clone()
        };
        for (model, cfg) in [("diffusers_sd1", sd1), ("diffusers_sd2", sd2), ("diffusers_sdxl", sdxl)] {
            let mut want = DiffusersConfig::from_config_json(&config_json(model)).unwrap();
            want.sample_size = None;
            want.upcast_attention = false;
            (want.addition_embed_type, want.addition_time_embed_dim) = (None, None);
            want.projection_class_embeddings_input_dim = None;
            let mut got = cfg.to_diffusers(4, 4).unwrap();
            // An int for every block and a list of equal entries build the same model.
            for c in [&mut want, &mut got] {
                c.attention_head_dim = PerBlock::List(c.attention_head_dim.expand("", 2).unwrap());
                c.cross_attention_dim = PerBlock::List(c.cross_attention_dim.expand("", 2).unwrap());
                let layers = c.transformer_layers_per_block.expand("", 2).unwrap();
                c.transformer_layers_per_block = PerBlock::List(layers);
            }
            let (want, got) = (serde_json::to_value(want).unwrap(), serde_json::to_value(got).unwrap());
            assert_eq!(got, want, "{model}");
        }
    }

    /// ControlNet's residuals: zeros change nothing, one skip too few and one residual alone are
    /// input errors.
    #[test]
    fn controlnet_residuals() {
        use candle_core::{DType, Device};
        let dev = Device::Cpu;
        let folder = format!("{}/../../weights/models/diffusers_sd1", env!("CARGO_MANIFEST_DIR"));
        let files = [format!("{folder}/diffusion_pytorch_model.safetensors")];
        // SAFETY: the committed file is not modified while mapped.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &dev).unwrap() };
        let cfg = UNet2DConditionModelConfig {
            blocks: vec![block(8, Some(1), 2), block(16, None, 2)],
            layers_per_block: 1,
            norm_num_groups: 4,
            cross_attention_dim: 24,
            ..Default::default()
        };
        let unet = UNet2DConditionModel::new(vb, 4, 4, true, cfg).unwrap();
        let x = crate::test_support::seeded_randn(&[1, 4, 8, 8], 1);
        let ehs = crate::test_support::seeded_randn(&[1, 7, 24], 2);
        // conv_in, resnet, attention... : 8, 8, 8 at 8x8, then 16 at 4x4 (conv_in + 2 + 1 skips)
        let shapes: [(usize, usize, usize); 4] = [(8, 8, 8), (8, 8, 8), (8, 4, 4), (16, 4, 4)];
        let down: Vec<Tensor> = shapes
            .iter()
            .map(|&(c, h, w)| Tensor::zeros((1, c, h, w), DType::F32, &dev).unwrap())
            .collect();
        let mid = Tensor::zeros((1, 16, 4, 4), DType::F32, &dev).unwrap();
        let plain = unet.forward(&x, 10.0, &ehs).unwrap();
        let with = unet
            .forward_with_additional_residuals(&x, 10.0, &ehs, Some(&down), Some(&mid))
            .unwrap();
        let diff = (plain - with).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
        let short = unet.forward_with_additional_residuals(&x, 10.0, &ehs, Some(&down[1..]), Some(&mid));
        assert!(matches!(short, Err(Error::Input { .. })), "{short:?}");
        let alone = unet.forward_with_additional_residuals(&x, 10.0, &ehs, Some(&down), None);
        assert!(matches!(alone, Err(Error::Input { .. })), "{alone:?}");
    }

    #[test]
    fn refuses_an_empty_block_list() {
        let cfg = UNet2DConditionModelConfig {
            blocks: vec![],
            ..Default::default()
        };
        assert!(matches!(cfg.to_diffusers(4, 4), Err(Error::Config { .. })));
    }
}

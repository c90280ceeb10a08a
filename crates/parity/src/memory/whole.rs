//! The forward's memory for the whole models (`diffusers.UNet2DConditionModel`,
//! `diffusers.UNet2DModel`, `diffusers.AutoencoderKL`), from their config and input shapes: a whole model's activations
//! follow its widths and resolutions, not copies of its input (an `AutoencoderKL` with 128 channels
//! at 192 × 192 holds tensors 40 times its 3-channel input).
//!
//! Per level of the model (the resolution after each downsampler, as [`Downsample2D::output_size`]
//! computes it; `c` the level's width, `hw` its pixels):
//! * a resnet holds [`RESNET`] copies of its input and output widths at once (norm, activation,
//!   convolution, the time embedding's add, the shortcut, the residual);
//! * a transformer holds [`TRANSFORMER`] widths a token (the GEGLU feed-forward's `8c` projection
//!   and its `4c` gate, `q`, `k`, `v` and the attention's output, the norms and residuals); the
//!   fused attention kernel forms no score matrix (the chunked path's, in half precision, is
//!   counted by the caller); an attention over the image (`UNet2DModel`'s `Attn*` blocks, the
//!   VAE's mid block) holds [`IMAGE_ATTENTION`] widths a pixel;
//! * the U-Net keeps every skip of its down path until the up path takes it;
//! * the strided 3 × 3 convolution of a downsampler runs on Candle's, whose im2col matrix is
//!   `pixels out × 9 c` in f32; so does every 3 × 3 convolution where the packed CPU kernels do not
//!   run (a CPU without AVX2, `UNET_ATTENTION_LAYERS=candle`, a run in another dtype than f32).
//!
//! The forward's peak is the skips plus the largest level's working set, `batch ×` the run
//! dtype's size (at least 4 bytes: half precision computes in f32 in places). Calibrated by peak
//! RSS (`crates/parity/tests/hostile/whole_memory.rs`, the ratios in docs/cli.md).

use crate::bundle::{TensorInfo, INPUT_PREFIX};
use std::collections::BTreeMap;
use unet_attention::models::unet_blocks::Downsample2D;
use unet_attention::models::{
    AutoencoderKL, AutoencoderKLConfig, UNet2DConditionModel, UNet2DConditionModelConfig, UNet2DModel,
    UNet2DModelConfig,
};

/// Copies of a resnet's input plus output width it holds at once.
pub const RESNET: u64 = 3;
/// Widths a token a transformer holds at once.
pub const TRANSFORMER: u64 = 24;
/// Widths a pixel an attention over the image (the VAE's mid block, `UNet2DModel`'s `Attn*`
/// blocks) holds at once.
const IMAGE_ATTENTION: u64 = 8;

/// Whether the bundle is of a whole model.
pub(super) fn is_whole_model(metadata: &BTreeMap<String, String>) -> bool {
    metadata
        .get("parity.block")
        .is_some_and(|b| b == UNet2DConditionModel::BLOCK || b == UNet2DModel::BLOCK || b == AutoencoderKL::BLOCK)
}

/// What a whole model's forward holds at its peak: `(activations, convolution workspace)` in
/// bytes, `None` for other blocks (or a config or input the check will refuse anyway).
pub(super) fn forward_bytes(metadata: &BTreeMap<String, String>, infos: &[TensorInfo], run: u64) -> Option<(u64, u64)> {
    let block = metadata.get("parity.block")?;
    let config: serde_json::Value = serde_json::from_str(metadata.get("parity.config")?).ok()?;
    let sample = infos.iter().find(|i| i.name == format!("{INPUT_PREFIX}sample"))?;
    let &[b, _, h, w] = sample.shape.as_slice() else {
        return None;
    };
    let every_conv = !convs_packed(run);
    let (elements, im2col) = if block == UNet2DConditionModel::BLOCK {
        let cfg: UNet2DConditionModelConfig =
            unet_attention::config::from_json(UNet2DConditionModel::BLOCK, &config).ok()?;
        unet(&cfg, (h, w), every_conv)?
    } else if block == UNet2DModel::BLOCK {
        let cfg: UNet2DModelConfig = unet_attention::config::from_json(UNet2DModel::BLOCK, &config).ok()?;
        let c: Vec<u64> = cfg.block_out_channels.iter().map(|&c| c as u64).collect();
        let n = c.len();
        let attn = |l: usize| cfg.down_block_types.get(l).is_some_and(|t| t.starts_with("Attn"));
        let shape = UNetShape {
            layers: vec![cfg.layers_per_block; n],
            padding: cfg.downsample_padding,
            attention: &|l: usize| {
                if attn(l) || l + 1 == n {
                    IMAGE_ATTENTION * c[l]
                } else {
                    0
                }
            },
            c: &c,
        };
        u_net(&shape, (h, w), every_conv)?
    } else if block == AutoencoderKL::BLOCK {
        let cfg: AutoencoderKLConfig = unet_attention::config::from_json(AutoencoderKL::BLOCK, &config).ok()?;
        vae(&cfg, (h, w), every_conv)?
    } else {
        return None;
    };
    let b = b as u64;
    Some((
        b.saturating_mul(elements).saturating_mul(run.max(4)),
        b.saturating_mul(im2col).saturating_mul(4),
    ))
}

/// Whether this run's 3 × 3 convolutions take the packed CPU kernels (no im2col matrix): f32 on
/// a CPU they run on, unless `UNET_ATTENTION_LAYERS=candle`.
fn convs_packed(run: u64) -> bool {
    use unet_attention::cpu_kernels::{layer_path, LayerPath, PackedConv};
    let probe = candle_core::Tensor::zeros((1, 1, 3, 3), candle_core::DType::F32, &candle_core::Device::Cpu);
    run == 4
        && layer_path().is_ok_and(|p| p != LayerPath::Candle)
        && probe.is_ok_and(|w| PackedConv::new(&w).is_ok_and(|p| p.is_some()))
}

/// The largest im2col matrix (elements): each downsampler's (`pixels out × 9 c`), and with
/// `every_conv` each level's widest 3 × 3 convolution too (`pixels × 9 · widest input`).
fn im2col(hw: &[u64], c: &[u64], widest: impl Fn(usize) -> u64, every_conv: bool) -> u64 {
    let n = c.len();
    let down = largest((0..n - 1).map(|l| hw[l + 1].saturating_mul(9 * c[l])));
    let convs = largest((0..n).map(|l| hw[l].saturating_mul(9 * widest(l))));
    if every_conv {
        down.max(convs)
    } else {
        down
    }
}

/// The pixels of each level: the input's, then after each of `n - 1` downsamplers with `padding`
/// (`None` when the input is too small: the model refuses it).
fn levels(n: usize, (h, w): (usize, usize), padding: usize) -> Option<Vec<u64>> {
    let mut sizes = vec![(h, w)];
    for _ in 1..n {
        let &(h, w) = sizes.last()?;
        sizes.push((
            Downsample2D::output_size(h, padding)?,
            Downsample2D::output_size(w, padding)?,
        ));
    }
    Some(
        sizes
            .iter()
            .map(|&(h, w)| (h as u64).saturating_mul(w as u64))
            .collect(),
    )
}

/// The largest of `items`.
fn largest(items: impl Iterator<Item = u64>) -> u64 {
    items.max().unwrap_or(0)
}

/// The conditional U-Net's elements a batch item and its im2col ([`u_net`]).
fn unet(cfg: &UNet2DConditionModelConfig, size: (usize, usize), every_conv: bool) -> Option<(u64, u64)> {
    let c: Vec<u64> = cfg.block_out_channels.iter().map(|&c| c as u64).collect();
    let n = c.len();
    let cross = |l: usize| cfg.down_block_types.get(l).is_some_and(|t| t.starts_with("CrossAttn"));
    let shape = UNetShape {
        layers: cfg.layers_per_block.expand("layers_per_block", n).ok()?,
        padding: cfg.downsample_padding,
        attention: &|l: usize| if cross(l) || l + 1 == n { TRANSFORMER * c[l] } else { 0 },
        c: &c,
    };
    u_net(&shape, size, every_conv)
}

/// What a U-Net's memory depends on: its widths, resnets a level, downsampler padding, and the
/// widths a pixel its attention at each level holds (0 where it has none).
struct UNetShape<'a> {
    c: &'a [u64],
    layers: Vec<usize>,
    padding: usize,
    attention: &'a dyn Fn(usize) -> u64,
}

/// A U-Net's elements a batch item (skips plus the largest level) and its downsamplers' im2col.
fn u_net(shape: &UNetShape, size: (usize, usize), every_conv: bool) -> Option<(u64, u64)> {
    let (c, layers) = (shape.c, &shape.layers);
    let n = c.len();
    let hw = levels(n, size, shape.padding)?;
    let mut skips = c[0].saturating_mul(hw[0]);
    for l in 0..n {
        skips = skips.saturating_add((layers[l] as u64).saturating_mul(c[l]).saturating_mul(hw[l]));
        if l + 1 < n {
            skips = skips.saturating_add(c[l].saturating_mul(hw[l + 1]));
        }
    }
    let working = |l: usize| {
        let below = c[l.saturating_sub(1)];
        // The up path's resnets take the skip concatenated to their input.
        let widths = 2 * c[l] + below.max(c[l]);
        (RESNET * widths + (shape.attention)(l)).saturating_mul(hw[l])
    };
    // The up path's first resnet of a level takes its input and a skip.
    let widest = |l: usize| c[l] + c[l.saturating_sub(1)].max(c[(l + 1).min(n - 1)]);
    let im2col = im2col(&hw, c, widest, every_conv);
    Some((skips.saturating_add(largest((0..n).map(working))), im2col))
}

/// The VAE's elements a batch item (its largest level, encoder or decoder) and its downsamplers'
/// im2col.
fn vae(cfg: &AutoencoderKLConfig, size: (usize, usize), every_conv: bool) -> Option<(u64, u64)> {
    let c: Vec<u64> = cfg.block_out_channels.iter().map(|&c| c as u64).collect();
    let n = c.len();
    let hw = levels(n, size, 0)?;
    let working = |l: usize| {
        let below = c[l.saturating_sub(1)];
        let above = c[(l + 1).min(n - 1)];
        // The encoder's resnets (from the width below) and the decoder's (from the width above,
        // upsampled to this level).
        let widths = c[l] + below.max(above) + above;
        let attention = if l + 1 == n { IMAGE_ATTENTION * c[l] } else { 0 };
        (RESNET * widths + attention).saturating_mul(hw[l])
    };
    let widest = |l: usize| c[l].max(c[(l + 1).min(n - 1)]);
    let im2col = im2col(&hw, &c, widest, every_conv);
    Some((largest((0..n).map(working)), im2col))
}

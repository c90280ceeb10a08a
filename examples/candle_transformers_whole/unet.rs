//! The whole U-Net: candle-transformers 0.11.1's `stable_diffusion::unet_2d::UNet2DConditionModel`
//! and our drop-in (`unet_attention::models::stable_diffusion::unet_2d`), built from the same
//! candle-transformers-style config (filled from the bundle's diffusers config) and run on a
//! whole-model bundle of `weights/whole/` (module-path stages).
//!
//! Printed per bundle: each model's error against PyTorch's f32 output and its float64 output,
//! f32 and bf16 (through `unet_parity::port::PortCheck`); candle-transformers' public blocks put
//! together as its `UNet2DConditionModel` puts them, recording each block's output, so that the
//! check names its first divergent module (the assembly is checked to give the whole model's
//! output bit for bit); and each of its resnets and transformers on PyTorch's own input to it.

use super::{first_line, max_abs};
use super::{row, Table};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{
    attention as ct_attn, embeddings as ct_emb, resnet as ct_resnet, unet_2d as ct_unet, unet_2d_blocks as ct,
};
use serde_json::Value;
use std::path::Path;
use unet_attention::models::stable_diffusion::unet_2d;
use unet_attention::models::UNet2DConditionModelConfig as DiffusersConfig;
use unet_parity::port::{record, PortCheck, PortInputs};

/// Our drop-in's config from a diffusers config; `Err` names what candle-transformers' config
/// cannot express.
fn sd_config(config: &Value) -> Result<(unet_2d::UNet2DConditionModelConfig, usize, usize)> {
    let c = DiffusersConfig::from_config_json(config)?;
    let n = c.blocks();
    let refuse = |what: &str| bail!("candle-transformers' config cannot express {what}");
    if c.addition_embed_type.is_some() || c.class_embed_type.is_some() || c.time_embedding_dim.is_some() {
        refuse("addition / class embeddings or a time_embedding_dim")?;
    }
    if c.resnet_time_scale_shift != "default" || c.conv_in_kernel != 3 || c.conv_out_kernel != 3 {
        refuse("resnet_time_scale_shift or conv kernels other than diffusers' defaults")?;
    }
    let heads = c.attention_head_dim.expand("attention_head_dim", n)?;
    let depth = c
        .transformer_layers_per_block
        .expand("transformer_layers_per_block", n)?;
    let cross = c.cross_attention_dim.expand("cross_attention_dim", n)?;
    let layers = c.layers_per_block.expand("layers_per_block", n)?;
    if cross.windows(2).any(|w| w[0] != w[1]) || layers.windows(2).any(|w| w[0] != w[1]) {
        refuse("a cross_attention_dim or layers_per_block per block")?;
    }
    let mut blocks = vec![];
    for i in 0..n {
        let use_cross_attn = match c.down_block_types[i].as_str() {
            "CrossAttnDownBlock2D" => match &depth[i] {
                unet_attention::diffusers::unets::mid_block::LayersPerBlock::One(d) => Some(*d),
                other => bail!("candle-transformers takes one transformer depth per block, found {other:?}"),
            },
            "DownBlock2D" => None,
            other => bail!("candle-transformers has no {other}"),
        };
        blocks.push(unet_2d::BlockConfig {
            out_channels: c.block_out_channels[i],
            use_cross_attn,
            attention_head_dim: heads[i],
        });
    }
    let cfg = unet_2d::UNet2DConditionModelConfig {
        center_input_sample: c.center_input_sample,
        flip_sin_to_cos: c.flip_sin_to_cos,
        freq_shift: c.freq_shift,
        blocks,
        layers_per_block: layers[0],
        downsample_padding: c.downsample_padding,
        mid_block_scale_factor: c.mid_block_scale_factor,
        norm_num_groups: c.norm_num_groups.context("norm_num_groups null")?,
        norm_eps: c.norm_eps,
        cross_attention_dim: cross[0],
        sliced_attention_size: None,
        use_linear_projection: c.use_linear_projection,
    };
    Ok((cfg, c.in_channels, c.out_channels))
}

/// The same values in candle-transformers' own type (the two have the same fields).
fn ct_config(cfg: &unet_2d::UNet2DConditionModelConfig) -> ct_unet::UNet2DConditionModelConfig {
    ct_unet::UNet2DConditionModelConfig {
        center_input_sample: cfg.center_input_sample,
        flip_sin_to_cos: cfg.flip_sin_to_cos,
        freq_shift: cfg.freq_shift,
        blocks: cfg
            .blocks
            .iter()
            .map(|b| ct_unet::BlockConfig {
                out_channels: b.out_channels,
                use_cross_attn: b.use_cross_attn,
                attention_head_dim: b.attention_head_dim,
            })
            .collect(),
        layers_per_block: cfg.layers_per_block,
        downsample_padding: cfg.downsample_padding,
        mid_block_scale_factor: cfg.mid_block_scale_factor,
        norm_num_groups: cfg.norm_num_groups,
        norm_eps: cfg.norm_eps,
        cross_attention_dim: cfg.cross_attention_dim,
        sliced_attention_size: cfg.sliced_attention_size,
        use_linear_projection: cfg.use_linear_projection,
    }
}

fn timestep(inputs: &PortInputs) -> Result<f64> {
    inputs
        .kwarg("timestep")
        .and_then(Value::as_f64)
        .context("kwarg `timestep` is missing")
}

/// One whole-U-Net bundle: the error table, the assembled run's first divergence, the parts.
pub fn compare(path: &Path, table: &mut Table, detail: bool) -> Result<()> {
    let check = PortCheck::open(path)?;
    let (cfg, in_ch, out_ch) = sd_config(&check.bundle().config)?;
    let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    println!(
        "{name}: {} blocks {:?}, {} groups",
        cfg.blocks.len(),
        cfg.blocks.iter().map(|b| b.out_channels).collect::<Vec<_>>(),
        cfg.norm_num_groups
    );
    for dtype in [DType::F32, DType::BF16] {
        let check = PortCheck::open(path)?.dtype(dtype);
        let ct_run = check.var_builder().map_err(anyhow::Error::from).and_then(|vb| {
            let model = ct_unet::UNet2DConditionModel::new(vb, in_ch, out_ch, false, ct_config(&cfg))?;
            let report = check.run(|i| {
                let (x, ehs) = (i.get("sample")?, i.get("encoder_hidden_states")?);
                anyhow::Ok(model.forward(x, timestep(i)?, ehs)?)
            })?;
            anyhow::Ok(report)
        });
        table.push(row(&name, "candle-transformers 0.11.1", dtype, ct_run));
        let ours = check.var_builder().map_err(anyhow::Error::from).and_then(|vb| {
            let model = unet_2d::UNet2DConditionModel::new(vb, in_ch, out_ch, false, cfg.clone())?;
            let report = check.run(|i| {
                let (x, ehs) = (i.get("sample")?, i.get("encoder_hidden_states")?);
                anyhow::Ok(model.forward(x, timestep(i)?, ehs)?)
            })?;
            anyhow::Ok(report)
        });
        table.push(row(&name, "ours (drop-in unet_2d)", dtype, ours));
    }
    if !detail {
        return Ok(());
    }
    assembled(&check, &cfg, in_ch, out_ch)?;
    parts(&check, &cfg)
}

/// candle-transformers' public blocks, built as its `UNet2DConditionModel::new` builds them.
struct CtBlocks {
    time_proj: ct_emb::Timesteps,
    time_embedding: ct_emb::TimestepEmbedding,
    conv_in: candle_nn::Conv2d,
    down: Vec<Down>,
    mid: ct::UNetMidBlock2DCrossAttn,
    up: Vec<Up>,
    conv_norm_out: candle_nn::GroupNorm,
    conv_out: candle_nn::Conv2d,
}

enum Down {
    Plain(ct::DownBlock2D),
    Cross(ct::CrossAttnDownBlock2D),
}

enum Up {
    Plain(ct::UpBlock2D),
    Cross(ct::CrossAttnUpBlock2D),
}

fn ct_blocks(
    vb: &VarBuilder,
    cfg: &unet_2d::UNet2DConditionModelConfig,
    in_ch: usize,
    out_ch: usize,
) -> Result<CtBlocks> {
    let ch: Vec<usize> = cfg.blocks.iter().map(|b| b.out_channels).collect();
    let (n, first, temb) = (ch.len(), ch[0], ch[0] * 4);
    let conv = candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let mut down = vec![];
    for (i, b) in cfg.blocks.iter().enumerate() {
        let db = ct::DownBlock2DConfig {
            num_layers: cfg.layers_per_block,
            resnet_eps: cfg.norm_eps,
            resnet_groups: cfg.norm_num_groups,
            add_downsample: i + 1 < n,
            downsample_padding: cfg.downsample_padding,
            ..Default::default()
        };
        let vb = vb.pp(format!("down_blocks.{i}"));
        let input = if i == 0 { first } else { ch[i - 1] };
        down.push(match b.use_cross_attn {
            None => Down::Plain(ct::DownBlock2D::new(vb, input, ch[i], Some(temb), db)?),
            Some(depth) => {
                let c = ct::CrossAttnDownBlock2DConfig {
                    downblock: db,
                    attn_num_head_channels: b.attention_head_dim,
                    cross_attention_dim: cfg.cross_attention_dim,
                    sliced_attention_size: None,
                    use_linear_projection: cfg.use_linear_projection,
                    transformer_layers_per_block: depth,
                };
                Down::Cross(ct::CrossAttnDownBlock2D::new(vb, input, ch[i], Some(temb), false, c)?)
            }
        });
    }
    let last = cfg.blocks[n - 1];
    let mid_cfg = ct::UNetMidBlock2DCrossAttnConfig {
        resnet_eps: cfg.norm_eps,
        output_scale_factor: cfg.mid_block_scale_factor,
        cross_attn_dim: cfg.cross_attention_dim,
        attn_num_head_channels: last.attention_head_dim,
        resnet_groups: Some(cfg.norm_num_groups),
        use_linear_projection: cfg.use_linear_projection,
        transformer_layers_per_block: last.use_cross_attn.unwrap_or(1),
        ..Default::default()
    };
    let mid = ct::UNetMidBlock2DCrossAttn::new(vb.pp("mid_block"), ch[n - 1], Some(temb), false, mid_cfg)?;
    let mut up = vec![];
    for i in 0..n {
        let b = cfg.blocks[n - 1 - i];
        let prev = if i == 0 { ch[n - 1] } else { ch[n - i] };
        let input = ch[if i + 1 == n { 0 } else { n - i - 2 }];
        let ub = ct::UpBlock2DConfig {
            num_layers: cfg.layers_per_block + 1,
            resnet_eps: cfg.norm_eps,
            resnet_groups: cfg.norm_num_groups,
            add_upsample: i + 1 < n,
            ..Default::default()
        };
        let vb = vb.pp(format!("up_blocks.{i}"));
        up.push(match b.use_cross_attn {
            None => Up::Plain(ct::UpBlock2D::new(vb, input, prev, b.out_channels, Some(temb), ub)?),
            Some(depth) => {
                let c = ct::CrossAttnUpBlock2DConfig {
                    upblock: ub,
                    attn_num_head_channels: b.attention_head_dim,
                    cross_attention_dim: cfg.cross_attention_dim,
                    sliced_attention_size: None,
                    use_linear_projection: cfg.use_linear_projection,
                    transformer_layers_per_block: depth,
                };
                Up::Cross(ct::CrossAttnUpBlock2D::new(
                    vb,
                    input,
                    prev,
                    b.out_channels,
                    Some(temb),
                    false,
                    c,
                )?)
            }
        });
    }
    Ok(CtBlocks {
        time_proj: ct_emb::Timesteps::new(first, cfg.flip_sin_to_cos, cfg.freq_shift),
        time_embedding: ct_emb::TimestepEmbedding::new(vb.pp("time_embedding"), first, temb)?,
        conv_in: candle_nn::conv2d(in_ch, first, 3, conv, vb.pp("conv_in"))?,
        down,
        mid,
        up,
        conv_norm_out: candle_nn::group_norm(cfg.norm_num_groups, first, cfg.norm_eps, vb.pp("conv_norm_out"))?,
        conv_out: candle_nn::conv2d(first, out_ch, 3, conv, vb.pp("conv_out"))?,
    })
}

impl CtBlocks {
    /// candle-transformers' forward (timestep broadcast in the sample's dtype, as its
    /// `UNet2DConditionModel::forward`), recording every block's output under its module path.
    fn forward(&self, x: &Tensor, t: f64, ehs: &Tensor) -> Result<Tensor> {
        let b = x.dim(0)?;
        let emb = (Tensor::ones(b, x.dtype(), x.device())? * t)?;
        let emb = self.time_embedding.forward(&self.time_proj.forward(&emb)?)?;
        record("time_embedding", &emb);
        let mut h = self.conv_in.forward(x)?;
        record("conv_in", &h);
        let mut skips = vec![h.clone()];
        for (i, d) in self.down.iter().enumerate() {
            let (out, states) = match d {
                Down::Plain(d) => d.forward(&h, Some(&emb))?,
                Down::Cross(d) => d.forward(&h, Some(&emb), Some(ehs))?,
            };
            record(&format!("down_blocks.{i}"), &out);
            (h, skips) = (out, [skips, states].concat());
        }
        h = self.mid.forward(&h, Some(&emb), Some(ehs))?;
        record("mid_block", &h);
        let n = self.up.len();
        let (_, _, sh, sw) = x.dims4()?;
        let odd = sh % (1 << (n - 1)) != 0 || sw % (1 << (n - 1)) != 0;
        for (i, u) in self.up.iter().enumerate() {
            let count = match u {
                Up::Plain(u) => u.resnets.len(),
                Up::Cross(u) => u.upblock.resnets.len(),
            };
            let res = skips.split_off(skips.len() - count);
            let size = match skips.last() {
                Some(next) if odd && i + 1 < n => Some((next.dim(2)?, next.dim(3)?)),
                _ => None,
            };
            h = match u {
                Up::Plain(u) => u.forward(&h, &res, Some(&emb), size)?,
                Up::Cross(u) => u.forward(&h, &res, Some(&emb), size, Some(ehs))?,
            };
            record(&format!("up_blocks.{i}"), &h);
        }
        let h = self.conv_norm_out.forward(&h)?;
        record("conv_norm_out", &h);
        let h = candle_nn::ops::silu(&h)?;
        record("conv_act", &h);
        Ok(self.conv_out.forward(&h)?)
    }
}

/// candle-transformers' blocks assembled, checked with their outputs recorded: the first
/// divergent module. The assembly must give its whole model's output exactly.
fn assembled(check: &PortCheck, cfg: &unet_2d::UNet2DConditionModelConfig, in_ch: usize, out_ch: usize) -> Result<()> {
    let vb = check.var_builder()?;
    let blocks = ct_blocks(&vb, cfg, in_ch, out_ch)?;
    let whole = ct_unet::UNet2DConditionModel::new(vb, in_ch, out_ch, false, ct_config(cfg))?;
    let mut same = None;
    let report = check.run(|i| {
        let (x, ehs, t) = (i.get("sample")?, i.get("encoder_hidden_states")?, timestep(i)?);
        let out = blocks.forward(x, t, ehs)?;
        same = Some(max_abs(&out, &whole.forward(x, t, ehs)?)?);
        anyhow::Ok(out)
    })?;
    super::print_assembled(&report, same, "UNet2DConditionModel")?;
    println!(
        "    first divergent module: {}",
        report.first_divergence().unwrap_or("none (every output passes)")
    );
    Ok(())
}

/// A PyTorch stage trace of the bundle.
fn trace<'a>(check: &'a PortCheck, stage: &str) -> Result<&'a Tensor> {
    check
        .bundle()
        .tensors
        .get(&format!("parity.trace.{stage}"))
        .with_context(|| format!("stage trace `{stage}` is missing"))
}

/// Each resnet and transformer of candle-transformers' U-Net, built as its blocks build them,
/// on PyTorch's own input to it (the bundle's traces), against PyTorch's output of it.
fn parts(check: &PortCheck, cfg: &unet_2d::UNet2DConditionModelConfig) -> Result<()> {
    let vb = check.var_builder()?;
    let ehs = check.inputs()?.get("encoder_hidden_states")?.clone();
    let temb = trace(check, "time_embedding")?.clone();
    let n = cfg.blocks.len();
    println!("  candle-transformers' parts, each on PyTorch's input to it        max|· − PyTorch f32|");
    let show = |stage: &str, what: &str, out: candle_core::Result<Tensor>| -> Result<Tensor> {
        let torch = trace(check, stage)?;
        match out {
            Ok(y) => println!("    {:<60}  {:>9.2e}", format!("{stage} ({what})"), max_abs(&y, torch)?),
            Err(e) => println!("    {:<60}  fails: {}", format!("{stage} ({what})"), first_line(&e)),
        }
        Ok(torch.clone())
    };
    // Its DownBlock2D / UpBlock2D resnets: the config's groups are not passed on (32).
    let resnet = |stage: &str, x: &Tensor, out: usize, groups: usize| -> Result<Tensor> {
        let c = ct_resnet::ResnetBlock2DConfig {
            out_channels: Some(out),
            temb_channels: Some(temb.dim(1)?),
            eps: cfg.norm_eps,
            groups,
            ..Default::default()
        };
        let what = format!("ResnetBlock2D, {groups} groups");
        let r = ct_resnet::ResnetBlock2D::new(vb.pp(stage.replace('/', ".")), x.dim(1)?, c);
        show(stage, &what, r.and_then(|r| r.forward(x, Some(&temb))))
    };
    let transformer = |stage: &str, x: &Tensor, heads: usize, depth: usize| -> Result<Tensor> {
        let c = ct_attn::SpatialTransformerConfig {
            depth,
            num_groups: cfg.norm_num_groups,
            context_dim: Some(cfg.cross_attention_dim),
            sliced_attention_size: None,
            use_linear_projection: cfg.use_linear_projection,
        };
        let ch = x.dim(1)?;
        let t = ct_attn::SpatialTransformer::new(vb.pp(stage.replace('/', ".")), ch, heads, ch / heads, false, c);
        show(stage, "SpatialTransformer", t.and_then(|t| t.forward(x, Some(&ehs))))
    };
    let mut x = trace(check, "conv_in")?.clone();
    let mut skips = vec![x.clone()];
    for (i, b) in cfg.blocks.iter().enumerate() {
        for j in 0..cfg.layers_per_block {
            x = resnet(&format!("down_blocks.{i}/resnets.{j}"), &x, b.out_channels, 32)?;
            if let Some(depth) = b.use_cross_attn {
                x = transformer(
                    &format!("down_blocks.{i}/attentions.{j}"),
                    &x,
                    b.attention_head_dim,
                    depth,
                )?;
            }
            skips.push(x.clone());
        }
        if i + 1 < n {
            x = trace(check, &format!("down_blocks.{i}/downsamplers.0"))?.clone();
            skips.push(x.clone());
        }
    }
    let last = cfg.blocks[n - 1];
    x = resnet("mid_block/resnets.0", &x, last.out_channels, cfg.norm_num_groups)?;
    let depth = last.use_cross_attn.unwrap_or(1);
    x = transformer("mid_block/attentions.0", &x, last.attention_head_dim, depth)?;
    resnet("mid_block/resnets.1", &x, last.out_channels, cfg.norm_num_groups)?;
    x = trace(check, "mid_block")?.clone();
    for i in 0..n {
        let b = cfg.blocks[n - 1 - i];
        for j in 0..=cfg.layers_per_block {
            let skip = skips.pop().context("skips")?;
            let input = Tensor::cat(&[&x, &skip], 1)?;
            x = resnet(&format!("up_blocks.{i}/resnets.{j}"), &input, b.out_channels, 32)?;
            if let Some(depth) = b.use_cross_attn {
                x = transformer(
                    &format!("up_blocks.{i}/attentions.{j}"),
                    &x,
                    b.attention_head_dim,
                    depth,
                )?;
            }
        }
        x = trace(check, &format!("up_blocks.{i}"))?.clone();
    }
    Ok(())
}

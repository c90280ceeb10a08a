//! The whole VAE: candle-transformers 0.11.1's `stable_diffusion::vae::AutoEncoderKL` and our
//! drop-in (`unet_attention::models::stable_diffusion::vae`), built from the same
//! candle-transformers-style config (filled from the bundle's diffusers config), on a whole
//! `AutoencoderKL` bundle of `weights/whole/`: `decode(encode(x).mode())` at batch 2.
//!
//! candle-transformers' distribution keeps its mean private and offers only `sample()`. Its
//! whole model is run on a copy of the weights whose `quant_conv` gives a log variance of −1000
//! (the rows of the log-variance half zeroed, their bias −1000), so that `std` is exactly 0 and
//! `sample()` is exactly the mean its encoder computed: the mode, through its public API only.
//! Its public blocks are also put together as its private `Encoder` / `Decoder` put them, each
//! block's output recorded under its module path (the first divergent module), checked to give
//! the whole model's output bit for bit; and its decoder and encoder alone are held against
//! PyTorch's latent (`quant_conv`'s mean half).

use super::max_abs;
use super::{row, Table};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{unet_2d_blocks as ct, vae as ct_vae};
use std::collections::HashMap;
use std::path::Path;
use unet_attention::models::stable_diffusion::vae;
use unet_attention::models::AutoencoderKLConfig;
use unet_parity::port::{record, PortCheck};

/// Our drop-in's config from the bundle's diffusers config, refusing what candle-transformers'
/// config cannot express.
fn sd_config(config: &serde_json::Value) -> Result<(vae::AutoEncoderKLConfig, usize, usize)> {
    let c = AutoencoderKLConfig::from_config_json(config)?;
    let plain = |types: &[String], t: &str| types.iter().all(|x| x == t);
    if !plain(&c.down_block_types, "DownEncoderBlock2D") || !plain(&c.up_block_types, "UpDecoderBlock2D") {
        bail!("candle-transformers' VAE builds DownEncoderBlock2D / UpDecoderBlock2D only");
    }
    if !c.mid_block_add_attention {
        bail!("candle-transformers' VAE always has the mid-block attention");
    }
    let cfg = vae::AutoEncoderKLConfig {
        block_out_channels: c.block_out_channels.clone(),
        layers_per_block: c.layers_per_block,
        latent_channels: c.latent_channels,
        norm_num_groups: c.norm_num_groups,
        use_quant_conv: c.use_quant_conv,
        use_post_quant_conv: c.use_post_quant_conv,
    };
    Ok((cfg, c.in_channels, c.out_channels))
}

fn ct_config(c: &vae::AutoEncoderKLConfig) -> ct_vae::AutoEncoderKLConfig {
    ct_vae::AutoEncoderKLConfig {
        block_out_channels: c.block_out_channels.clone(),
        layers_per_block: c.layers_per_block,
        latent_channels: c.latent_channels,
        norm_num_groups: c.norm_num_groups,
        use_quant_conv: c.use_quant_conv,
        use_post_quant_conv: c.use_post_quant_conv,
    }
}

/// The bundle's checkpoint, its `quant_conv` giving a log variance of −1000 (std exactly 0), in
/// `dtype`.
fn zero_std_weights(check: &PortCheck, latent: usize, dtype: DType) -> Result<VarBuilder<'static>> {
    let bundle = check.bundle();
    let rel = bundle
        .metadata
        .get("parity.weights")
        .context("the bundle references no checkpoint")?;
    let file = bundle.path.parent().unwrap_or(Path::new(".")).join(rel);
    let mut map: HashMap<String, Tensor> = candle_core::safetensors::load(&file, &Device::Cpu)?;
    let w = map.get("quant_conv.weight").context("no quant_conv")?;
    let w = Tensor::cat(
        &[&w.narrow(0, 0, latent)?, &w.narrow(0, latent, latent)?.zeros_like()?],
        0,
    )?;
    let b = map.get("quant_conv.bias").context("no quant_conv bias")?;
    let b = Tensor::cat(
        &[
            &b.narrow(0, 0, latent)?,
            &(b.narrow(0, latent, latent)?.zeros_like()? - 1000.0)?,
        ],
        0,
    )?;
    map.insert("quant_conv.weight".into(), w);
    map.insert("quant_conv.bias".into(), b);
    let map = map
        .into_iter()
        .map(|(k, v)| Ok((k, v.to_dtype(dtype)?)))
        .collect::<candle_core::Result<HashMap<_, _>>>()?;
    Ok(VarBuilder::from_tensors(map, dtype, &Device::Cpu))
}

/// One whole-VAE bundle.
pub fn compare(path: &Path, table: &mut Table, detail: bool) -> Result<()> {
    let check = PortCheck::open(path)?;
    let (cfg, in_ch, out_ch) = sd_config(&check.bundle().config)?;
    if !cfg.use_quant_conv {
        bail!("the example reads the mode through quant_conv (use_quant_conv)");
    }
    let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let latent = cfg.latent_channels;
    println!(
        "{name}: blocks {:?}, {} groups",
        cfg.block_out_channels, cfg.norm_num_groups
    );
    for dtype in [DType::F32, DType::BF16] {
        let check = PortCheck::open(path)?.dtype(dtype);
        let ct_model = zero_std_weights(&check, latent, dtype)
            .and_then(|vb| Ok(ct_vae::AutoEncoderKL::new(vb, in_ch, out_ch, ct_config(&cfg))?));
        let ct_run = |per_item: bool| {
            let model = ct_model.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            let report = check.run(|i| {
                let x = i.get("sample")?;
                let items: Vec<Tensor> = if per_item {
                    (0..x.dim(0)?)
                        .map(|b| x.narrow(0, b, 1))
                        .collect::<candle_core::Result<_>>()?
                } else {
                    vec![x.clone()]
                };
                let outs = items
                    .iter()
                    .map(|x| model.decode(&model.encode(x)?.sample()?))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                anyhow::Ok(Tensor::cat(&outs, 0)?)
            })?;
            anyhow::Ok(report)
        };
        table.push(row(&name, "candle-transformers 0.11.1", dtype, ct_run(false)));
        if dtype == DType::F32 {
            table.push(row(&name, "  the same, one image per call", dtype, ct_run(true)));
        }
        let ours = check.var_builder().map_err(anyhow::Error::from).and_then(|vb| {
            let model = vae::AutoEncoderKL::new(vb, in_ch, out_ch, cfg.clone())?;
            let report = check.run(|i| anyhow::Ok(model.decode(model.encode(i.get("sample")?)?.mode())?))?;
            anyhow::Ok(report)
        });
        table.push(row(&name, "ours (drop-in vae)", dtype, ours));
    }
    if !detail {
        return Ok(());
    }
    halves(&check, &cfg, in_ch, out_ch)?;
    assembled(&check, &cfg, in_ch, out_ch)
}

/// A PyTorch stage trace of the bundle.
fn trace<'a>(check: &'a PortCheck, stage: &str) -> Result<&'a Tensor> {
    check
        .bundle()
        .tensors
        .get(&format!("parity.trace.{stage}"))
        .with_context(|| format!("stage trace `{stage}` is missing"))
}

/// candle-transformers' `decode` on PyTorch's latent, and its encoder's mean, at batch 2 and one
/// image per call.
fn halves(check: &PortCheck, cfg: &vae::AutoEncoderKLConfig, in_ch: usize, out_ch: usize) -> Result<()> {
    let latent = cfg.latent_channels;
    let model = ct_vae::AutoEncoderKL::new(
        zero_std_weights(check, latent, DType::F32)?,
        in_ch,
        out_ch,
        ct_config(cfg),
    )?;
    let mode = trace(check, "quant_conv")?.narrow(1, 0, latent)?;
    let torch_out = check.bundle().output("output").context("no output")?;
    let x = check.inputs()?.get("sample")?.clone();
    let per_item = |f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>, t: &Tensor| -> Result<Tensor> {
        let outs = (0..t.dim(0)?)
            .map(|b| f(&t.narrow(0, b, 1)?))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&outs, 0)?)
    };
    let decode = |z: &Tensor| model.decode(z);
    let encode = |x: &Tensor| model.encode(x)?.sample();
    println!("  candle-transformers' halves, against PyTorch                     batch 2   one per call");
    println!(
        "    {:<60}  {:>9.2e}  {:>9.2e}",
        "decode(PyTorch's latent), against PyTorch's output",
        max_abs(&decode(&mode)?, torch_out)?,
        max_abs(&per_item(&decode, &mode)?, torch_out)?
    );
    println!(
        "    {:<60}  {:>9.2e}  {:>9.2e}",
        "encode(x) mean, against PyTorch's (quant_conv's mean half)",
        max_abs(&encode(&x)?, &mode)?,
        max_abs(&per_item(&encode, &x)?, &mode)?
    );
    Ok(())
}

/// candle-transformers' VAE blocks, built as its private `Encoder` / `Decoder` build them.
struct CtBlocks {
    enc_conv_in: candle_nn::Conv2d,
    enc_down: Vec<ct::DownEncoderBlock2D>,
    enc_mid: ct::UNetMidBlock2D,
    enc_norm: candle_nn::GroupNorm,
    enc_conv_out: candle_nn::Conv2d,
    quant_conv: candle_nn::Conv2d,
    post_quant_conv: candle_nn::Conv2d,
    dec_conv_in: candle_nn::Conv2d,
    dec_mid: ct::UNetMidBlock2D,
    dec_up: Vec<ct::UpDecoderBlock2D>,
    dec_norm: candle_nn::GroupNorm,
    dec_conv_out: candle_nn::Conv2d,
}

fn ct_blocks(vb: &VarBuilder, cfg: &vae::AutoEncoderKLConfig, in_ch: usize, out_ch: usize) -> Result<CtBlocks> {
    let ch = &cfg.block_out_channels;
    let (n, g, latent) = (ch.len(), cfg.norm_num_groups, cfg.latent_channels);
    let pad = candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let (enc, dec) = (vb.pp("encoder"), vb.pp("decoder"));
    let mid_cfg = ct::UNetMidBlock2DConfig {
        resnet_eps: 1e-6,
        output_scale_factor: 1.,
        attn_num_head_channels: None,
        resnet_groups: Some(g),
        ..Default::default()
    };
    let mut enc_down = vec![];
    for i in 0..n {
        let c = ct::DownEncoderBlock2DConfig {
            num_layers: cfg.layers_per_block,
            resnet_eps: 1e-6,
            resnet_groups: g,
            add_downsample: i + 1 < n,
            downsample_padding: 0,
            ..Default::default()
        };
        let input = ch[i.saturating_sub(1)];
        enc_down.push(ct::DownEncoderBlock2D::new(
            enc.pp(format!("down_blocks.{i}")),
            input,
            ch[i],
            c,
        )?);
    }
    let rev: Vec<usize> = ch.iter().rev().copied().collect();
    let mut dec_up = vec![];
    for i in 0..n {
        let c = ct::UpDecoderBlock2DConfig {
            num_layers: cfg.layers_per_block + 1,
            resnet_eps: 1e-6,
            resnet_groups: g,
            add_upsample: i + 1 < n,
            ..Default::default()
        };
        let input = rev[i.saturating_sub(1)];
        dec_up.push(ct::UpDecoderBlock2D::new(
            dec.pp(format!("up_blocks.{i}")),
            input,
            rev[i],
            c,
        )?);
    }
    let one = candle_nn::Conv2dConfig::default();
    Ok(CtBlocks {
        enc_conv_in: candle_nn::conv2d(in_ch, ch[0], 3, pad, enc.pp("conv_in"))?,
        enc_down,
        enc_mid: ct::UNetMidBlock2D::new(enc.pp("mid_block"), ch[n - 1], None, mid_cfg)?,
        enc_norm: candle_nn::group_norm(g, ch[n - 1], 1e-6, enc.pp("conv_norm_out"))?,
        enc_conv_out: candle_nn::conv2d(ch[n - 1], 2 * latent, 3, pad, enc.pp("conv_out"))?,
        quant_conv: candle_nn::conv2d(2 * latent, 2 * latent, 1, one, vb.pp("quant_conv"))?,
        post_quant_conv: candle_nn::conv2d(latent, latent, 1, one, vb.pp("post_quant_conv"))?,
        dec_conv_in: candle_nn::conv2d(latent, ch[n - 1], 3, pad, dec.pp("conv_in"))?,
        dec_mid: ct::UNetMidBlock2D::new(dec.pp("mid_block"), ch[n - 1], None, mid_cfg)?,
        dec_up,
        dec_norm: candle_nn::group_norm(g, ch[0], 1e-6, dec.pp("conv_norm_out"))?,
        dec_conv_out: candle_nn::conv2d(ch[0], out_ch, 3, pad, dec.pp("conv_out"))?,
    })
}

impl CtBlocks {
    /// `decode(encode(x) mean)`, recording every block's output under its module path.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let step = |name: &str, h: Tensor| {
            record(name, &h);
            h
        };
        let mut h = step("encoder/conv_in", self.enc_conv_in.forward(x)?);
        for (i, d) in self.enc_down.iter().enumerate() {
            h = step(&format!("encoder/down_blocks.{i}"), d.forward(&h)?);
        }
        h = step("encoder/mid_block", self.enc_mid.forward(&h, None)?);
        h = step("encoder/conv_norm_out", self.enc_norm.forward(&h)?);
        h = step("encoder/conv_act", candle_nn::ops::silu(&h)?);
        h = step("encoder", self.enc_conv_out.forward(&h)?);
        h = step("quant_conv", self.quant_conv.forward(&h)?);
        let mean = h.narrow(1, 0, h.dim(1)? / 2)?;
        h = step("post_quant_conv", self.post_quant_conv.forward(&mean)?);
        h = step("decoder/conv_in", self.dec_conv_in.forward(&h)?);
        h = step("decoder/mid_block", self.dec_mid.forward(&h, None)?);
        for (i, u) in self.dec_up.iter().enumerate() {
            h = step(&format!("decoder/up_blocks.{i}"), u.forward(&h)?);
        }
        h = step("decoder/conv_norm_out", self.dec_norm.forward(&h)?);
        h = step("decoder/conv_act", candle_nn::ops::silu(&h)?);
        Ok(self.dec_conv_out.forward(&h)?)
    }
}

/// candle-transformers' blocks assembled and checked: the first divergent module.
fn assembled(check: &PortCheck, cfg: &vae::AutoEncoderKLConfig, in_ch: usize, out_ch: usize) -> Result<()> {
    let blocks = ct_blocks(&check.var_builder()?, cfg, in_ch, out_ch)?;
    let vb = zero_std_weights(check, cfg.latent_channels, DType::F32)?;
    let whole = ct_vae::AutoEncoderKL::new(vb, in_ch, out_ch, ct_config(cfg))?;
    let mut same = None;
    let report = check.run(|i| {
        let x = i.get("sample")?;
        let out = blocks.forward(x)?;
        same = Some(max_abs(&out, &whole.decode(&whole.encode(x)?.sample()?)?)?);
        anyhow::Ok(out)
    })?;
    super::print_assembled(&report, same, "AutoEncoderKL")?;
    let first = report.first_divergence().unwrap_or("none (every output passes)");
    println!("    first divergent module: {first}");
    Ok(())
}

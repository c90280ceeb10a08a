//! Next to candle-transformers: one diffusers checkpoint loaded into candle-transformers 0.11.1's
//! public mid blocks (`stable_diffusion::unet_2d_blocks::UNetMidBlock2DCrossAttn` and
//! `UNetMidBlock2D`) and into ours, both run on the inputs diffusers gave the mid block inside the
//! whole model, each output held against PyTorch's float32 output and its float64 run.
//!
//! For each bundle (default: `weights/own/diffusers_sd1_mid_block.safetensors`, the mid block of an
//! SD-1.5-layout `UNet2DConditionModel`, and `weights/own/diffusers_vae_decoder_mid_block.safetensors`,
//! an `AutoencoderKL` decoder's; `scripts/export_own.py` writes such bundles for your own model):
//!
//! * the checkpoint the bundle references (`parity.weights`, safetensors) is mapped and both
//!   blocks are built from it under the same prefix (`mid_block`, `decoder.mid_block`). Our
//!   block's kwargs come from the model's `config.json` (`model_config::mid_blocks`);
//!   candle-transformers' config fields are filled from those same kwargs, and a kwarg it cannot
//!   express is an error;
//! * f32: max |output − PyTorch's f32 output| and max |output − PyTorch's float64 output| for each
//!   (candle-transformers' also one batch entry per call), with PyTorch's own f32 error for scale;
//!   then bf16 weights and inputs, where a block that fails prints its error;
//! * where candle-transformers' error arises: its public parts (`ResnetBlock2D`,
//!   `SpatialTransformer`, `AttentionBlock`), each given PyTorch's own input to that part (the
//!   bundle's stage traces), against PyTorch's output of it. Then, for the U-Net block, GEGLU's
//!   gate on PyTorch's `ff/proj_in` with candle's tanh-approximate `gelu` (what
//!   candle-transformers' GEGLU calls) and with `gelu_erf` (diffusers' GELU), against PyTorch's
//!   `ff/act`; for the VAE block, `candle_nn::Linear` on the transposed token view its
//!   `AttentionBlock` passes and on a contiguous copy, against PyTorch's `q`;
//! * then candle-core's `conv2d` and `matmul` in BF16 on the CPU;
//! * last, whole models (`candle_transformers_whole/`): on the 32-group whole-model bundles of
//!   `weights/whole/` (`sd1_g32_unet`, `sd1_g16_unet`, `vae_g32`, `vae_g16`; any such bundle given
//!   as an argument), candle-transformers' whole `UNet2DConditionModel` / `AutoEncoderKL` and our
//!   drop-ins (`unet_attention::models::stable_diffusion`) through `unet_parity::port::PortCheck`,
//!   its public blocks assembled to name its first divergent module, and a Markdown table.
//!
//! docs/candle-transformers.md has the output and what it means ("Whole models" for the last part).
//!
//! ```sh
//! cargo run --release --example candle_transformers --features candle-transformers
//! cargo run --release --example candle_transformers --features candle-transformers -- mine/unet_mid_block.safetensors
//! ```

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{attention as ct_attn, resnet as ct_resnet, unet_2d_blocks as ct};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use unet_attention::diffusers::{model_config::mid_blocks, UNetMidBlock2D, UNetMidBlock2DCrossAttn};
use unet_parity::bundle::Bundle;

const DEFAULT_BUNDLES: [&str; 6] = [
    "weights/own/diffusers_sd1_mid_block.safetensors",
    "weights/own/diffusers_vae_decoder_mid_block.safetensors",
    "weights/whole/sd1_g32_unet.safetensors",
    "weights/whole/sd1_g16_unet.safetensors",
    "weights/whole/vae_g32.safetensors",
    "weights/whole/vae_g16.safetensors",
];

/// Whole models (`weights/whole/` bundles): candle-transformers' and our drop-in's.
#[path = "candle_transformers_whole/mod.rs"]
mod whole;
use whole::{first_line, max_abs};

/// A bundle, the checkpoint it references and the mid block's diffusers kwargs.
struct Case {
    bundle: Bundle,
    checkpoint: PathBuf,
    /// `VarBuilder` prefix: `mid_block`, `decoder.mid_block`.
    prefix: String,
    /// The block's constructor kwargs, from the model's `config.json`.
    kwargs: Value,
}

/// candle-transformers' block and its config, filled from the diffusers kwargs.
#[derive(Clone, Copy)]
enum CtConfig {
    CrossAttn {
        in_channels: usize,
        temb_channels: Option<usize>,
        cfg: ct::UNetMidBlock2DCrossAttnConfig,
    },
    Mid {
        in_channels: usize,
        temb_channels: Option<usize>,
        cfg: ct::UNetMidBlock2DConfig,
    },
}

fn main() -> Result<()> {
    // The main thread one of rayon's workers, as `unet-parity` and the README's advice have it.
    unet_attention::cpu_kernels::join_rayon_pool();
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let paths = if args.is_empty() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        DEFAULT_BUNDLES.iter().map(|p| root.join(p)).collect()
    } else {
        args
    };
    let mut wholes = vec![];
    for path in &paths {
        let block = Bundle::read(path).with_context(|| format!("{}", path.display()))?.block;
        if [
            unet_attention::models::UNet2DConditionModel::BLOCK,
            unet_attention::models::AutoencoderKL::BLOCK,
        ]
        .contains(&block.as_str())
        {
            wholes.push(path.as_path());
            continue;
        }
        let case = load_case(path).with_context(|| format!("{}", path.display()))?;
        let ct_cfg = ct_config(&case)?;
        println!("{} ({})", shown(path), case.bundle.block);
        println!("  weights: {} under `{}`", shown(&case.checkpoint), case.prefix);
        for dtype in [DType::F32, DType::BF16] {
            compare(&case, ct_cfg, dtype)?;
        }
        stages(&case, ct_cfg)?;
        println!();
    }
    bf16_ops()?;
    println!();
    whole::run(&wholes, true)
}

/// Where candle-transformers' BF16 failure comes from: candle-core's own ops in BF16 on the CPU.
fn bf16_ops() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::ones((1, 4, 3, 3), DType::BF16, &dev)?;
    let conv = x.conv2d(&Tensor::ones((4, 4, 3, 3), DType::BF16, &dev)?, 1, 1, 1, 1);
    let matmul = x.flatten_from(1)?.matmul(&Tensor::ones((36, 2), DType::BF16, &dev)?);
    let outcome = |r: candle_core::Result<Tensor>| match r {
        Ok(_) => "runs".to_string(),
        Err(e) => format!("fails: {}", first_line(&e)),
    };
    println!("candle-core on the CPU in BF16 (what candle-transformers' blocks call):");
    println!("  Tensor::conv2d (its ResnetBlock2D's convolutions)  {}", outcome(conv));
    println!(
        "  Tensor::matmul                                      {}",
        outcome(matmul)
    );
    Ok(())
}

/// A path as printed: canonical, relative to the working directory where it lies under it.
fn shown(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok());
    match cwd.as_deref().and_then(|d| path.strip_prefix(d).ok()) {
        Some(rel) => rel.display().to_string(),
        None => path.display().to_string(),
    }
}

/// Read a bundle and resolve the safetensors checkpoint and `config.json` it references.
fn load_case(path: &Path) -> Result<Case> {
    let bundle = Bundle::read(path)?;
    let meta = |key: &str| bundle.metadata.get(key).cloned();
    let (Some(weights), Some(key_prefix)) = (meta("parity.weights"), meta("parity.prefix")) else {
        bail!("this example takes a bundle that references a whole diffusers checkpoint (`parity.weights`, `parity.prefix`; scripts/export_own.py writes them)");
    };
    let checkpoint = path.parent().unwrap_or(Path::new(".")).join(weights);
    if checkpoint.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        bail!(
            "{}: candle-transformers' examples load safetensors; this one is not",
            checkpoint.display()
        );
    }
    let config_path = checkpoint.with_file_name("config.json");
    let text = std::fs::read_to_string(&config_path).with_context(|| format!("{}", config_path.display()))?;
    let model: Value = serde_json::from_str(&text).with_context(|| format!("{}", config_path.display()))?;
    let Some(spec) = mid_blocks(&model, None, false)?
        .into_iter()
        .find(|s| s.key_prefix() == key_prefix)
    else {
        bail!("{} has no mid block at `{key_prefix}`", config_path.display());
    };
    if spec.block != bundle.block {
        bail!(
            "the bundle holds {}, config.json builds {} there",
            bundle.block,
            spec.block
        );
    }
    Ok(Case {
        bundle,
        checkpoint,
        prefix: spec.prefix.to_string(),
        kwargs: spec.config,
    })
}

/// A kwarg as a number, its diffusers default when absent or null.
fn num(kw: &Value, key: &str, default: f64) -> Result<f64> {
    match kw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .with_context(|| format!("kwarg `{key}`: expected a number, found {v}")),
    }
}

fn opt_usize(kw: &Value, key: &str) -> Result<Option<usize>> {
    match kw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(
            v.as_u64()
                .with_context(|| format!("kwarg `{key}`: expected a count, found {v}"))? as usize,
        )),
    }
}

/// Refuse a kwarg candle-transformers' block cannot express (absent and null are fine).
fn only(kw: &Value, key: &str, allowed: &[Value]) -> Result<()> {
    match kw.get(key) {
        Some(v) if !v.is_null() && !allowed.contains(v) => {
            let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
            bail!(
                "candle-transformers' block has no field for `{key}` = {v} (it builds {} only)",
                allowed.join(" or ")
            )
        }
        _ => Ok(()),
    }
}

/// `n` must be positive and divide `channels`.
fn divides(channels: usize, n: usize, what: &str) -> Result<()> {
    if n == 0 || !channels.is_multiple_of(n) {
        bail!("{what} ({n}) must be positive and divide in_channels ({channels})");
    }
    Ok(())
}

/// candle-transformers' config from the diffusers kwargs, refusing what it cannot express.
fn ct_config(case: &Case) -> Result<CtConfig> {
    let kw = &case.kwargs;
    let in_channels = opt_usize(kw, "in_channels")?.context("kwarg `in_channels` is missing")?;
    let temb_channels = opt_usize(kw, "temb_channels")?;
    only(kw, "resnet_time_scale_shift", &[json!("default")])?;
    only(kw, "resnet_act_fn", &[json!("silu"), json!("swish")])?;
    let (resnet_eps, resnet_groups) = (num(kw, "resnet_eps", 1e-6)?, opt_usize(kw, "resnet_groups")?);
    let output_scale_factor = num(kw, "output_scale_factor", 1.0)?;
    let num_layers = opt_usize(kw, "num_layers")?.unwrap_or(1);
    // candle-transformers divides (and candle-nn takes remainders) by these without checking.
    divides(
        in_channels,
        resnet_groups.unwrap_or((in_channels / 4).min(32)),
        "the resnet groups",
    )?;
    if case.bundle.block == UNetMidBlock2DCrossAttn::BLOCK {
        only(kw, "dual_cross_attention", &[json!(false)])?;
        only(kw, "attention_type", &[json!("default")])?;
        only(kw, "out_channels", &[json!(in_channels)])?;
        only(kw, "resnet_groups_out", &[json!(resnet_groups)])?;
        let transformer_layers_per_block = match kw.get("transformer_layers_per_block") {
            Some(Value::Array(list)) if list.windows(2).all(|w| w[0] == w[1]) && !list.is_empty() => {
                list[0].as_u64().context("transformer_layers_per_block")? as usize
            }
            Some(Value::Array(list)) => bail!("candle-transformers takes one transformer depth, found {list:?}"),
            _ => opt_usize(kw, "transformer_layers_per_block")?.unwrap_or(1),
        };
        let heads = opt_usize(kw, "num_attention_heads")?.unwrap_or(1);
        divides(in_channels, heads, "num_attention_heads")?;
        let cfg = ct::UNetMidBlock2DCrossAttnConfig {
            num_layers,
            resnet_eps,
            resnet_groups,
            // candle-transformers' name for what is the number of heads here (unet_2d.rs passes
            // its `attention_head_dim`, which SD's config.json also means as heads).
            attn_num_head_channels: heads,
            output_scale_factor,
            cross_attn_dim: opt_usize(kw, "cross_attention_dim")?.unwrap_or(1280),
            sliced_attention_size: None,
            use_linear_projection: kw.get("use_linear_projection") == Some(&json!(true)),
            transformer_layers_per_block,
        };
        return Ok(CtConfig::CrossAttn {
            in_channels,
            temb_channels,
            cfg,
        });
    }
    if case.bundle.block != UNetMidBlock2D::BLOCK {
        bail!("candle-transformers has no counterpart of {}", case.bundle.block);
    }
    only(kw, "add_attention", &[json!(true)])?;
    only(kw, "attn_groups", &[json!(resnet_groups)])?;
    let head_dim = opt_usize(kw, "attention_head_dim")?;
    divides(in_channels, head_dim.unwrap_or(in_channels), "attention_head_dim")?;
    let cfg = ct::UNetMidBlock2DConfig {
        num_layers,
        resnet_eps,
        resnet_groups,
        attn_num_head_channels: head_dim,
        output_scale_factor,
    };
    Ok(CtConfig::Mid {
        in_channels,
        temb_channels,
        cfg,
    })
}

/// The bundle's checkpoint in `dtype`, at the mid block's prefix.
fn var_builder(case: &Case, dtype: DType) -> Result<VarBuilder<'static>> {
    // SAFETY: the checkpoint is not modified while mapped.
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(std::slice::from_ref(&case.checkpoint), dtype, &Device::Cpu)? };
    Ok(vb.pp(case.prefix.clone()))
}

/// The forward inputs, in `dtype`: hidden states, time embedding, context; with `sample`, that
/// batch entry alone.
fn inputs(bundle: &Bundle, dtype: DType, sample: Option<usize>) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    for name in &bundle.inputs {
        if !["hidden_states", "temb", "encoder_hidden_states"].contains(&name.as_str()) {
            bail!("input `{name}`: candle-transformers' mid blocks take no masks");
        }
    }
    let get = |name: &str| -> Result<Option<Tensor>> {
        let Some(t) = bundle.input(name) else { return Ok(None) };
        let t = match sample {
            Some(i) => t.narrow(0, i, 1)?,
            None => t.clone(),
        };
        Ok(Some(t.to_dtype(dtype)?))
    };
    let x = get("hidden_states")?.context("input `hidden_states` is missing")?;
    Ok((x, get("temb")?, get("encoder_hidden_states")?))
}

/// candle-transformers' block, built from the checkpoint and run (on one batch entry with
/// `sample`).
fn run_ct(case: &Case, ct_cfg: CtConfig, dtype: DType, sample: Option<usize>) -> Result<Tensor> {
    let vb = var_builder(case, dtype)?;
    let (x, temb, context) = inputs(&case.bundle, dtype, sample)?;
    Ok(match ct_cfg {
        CtConfig::CrossAttn {
            in_channels,
            temb_channels,
            cfg,
        } => ct::UNetMidBlock2DCrossAttn::new(vb, in_channels, temb_channels, false, cfg)?.forward(
            &x,
            temb.as_ref(),
            context.as_ref(),
        )?,
        CtConfig::Mid {
            in_channels,
            temb_channels,
            cfg,
        } => ct::UNetMidBlock2D::new(vb, in_channels, temb_channels, cfg)?.forward(&x, temb.as_ref())?,
    })
}

/// Our block, built from the same checkpoint and run.
fn run_ours(case: &Case, dtype: DType) -> Result<Tensor> {
    let vb = var_builder(case, dtype)?;
    let (x, temb, context) = inputs(&case.bundle, dtype, None)?;
    let block = case.bundle.block.as_str();
    Ok(if block == UNetMidBlock2DCrossAttn::BLOCK {
        let cfg = unet_attention::config::from_json(UNetMidBlock2DCrossAttn::BLOCK, &case.kwargs)?;
        UNetMidBlock2DCrossAttn::new(vb, &cfg)?.forward(&x, temb.as_ref(), context.as_ref(), None, None)?
    } else {
        let cfg = unet_attention::config::from_json(UNetMidBlock2D::BLOCK, &case.kwargs)?;
        UNetMidBlock2D::new(vb, &cfg)?.forward(&x, temb.as_ref())?
    })
}

/// max |a − b|, computed in f64.
/// One dtype: each block's error against PyTorch's f32 output and its float64 output.
fn compare(case: &Case, ct_cfg: CtConfig, dtype: DType) -> Result<()> {
    let torch = case.bundle.output("output").context("output `output` is missing")?;
    let f64_out = case
        .bundle
        .output_f64("output")
        .context("the bundle has no float64 output")?;
    let head = format!("{dtype:?}, weights and inputs");
    println!("  {head:<38}  max|· − PyTorch f32|  max|· − float64|");
    if dtype == DType::F32 {
        println!(
            "    {:<36}  {:>20}  {:>16.2e}",
            "PyTorch f32 (for scale)",
            "—",
            max_abs(torch, f64_out)?
        );
    }
    let row = |name: &str, out: Result<Tensor>| -> Result<()> {
        match out {
            Ok(y) => println!(
                "    {name:<36}  {:>20.2e}  {:>16.2e}",
                max_abs(&y, torch)?,
                max_abs(&y, f64_out)?
            ),
            Err(e) => println!("    {name:<36}  fails: {}", first_line(&e)),
        }
        Ok(())
    };
    row("candle-transformers 0.11.1", run_ct(case, ct_cfg, dtype, None))?;
    if dtype == DType::F32 && torch.dim(0)? > 1 {
        row(
            "  the same, one batch entry per call",
            run_ct_per_sample(case, ct_cfg, torch.dim(0)?),
        )?;
    }
    row("unet-attention (ours)", run_ours(case, dtype))
}

/// candle-transformers' block on each batch entry alone, the outputs concatenated.
fn run_ct_per_sample(case: &Case, ct_cfg: CtConfig, batch: usize) -> Result<Tensor> {
    let outs = (0..batch)
        .map(|i| run_ct(case, ct_cfg, DType::F32, Some(i)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outs, 0)?)
}

/// An error's first line (candle's carry a backtrace below it).
/// A stage trace of the bundle (`parity.trace.<stage>`); the block input as `input`.
fn trace<'a>(bundle: &'a Bundle, stage: &str) -> Result<&'a Tensor> {
    let t = match stage {
        "input" => bundle.input("hidden_states"),
        _ => bundle.tensors.get(&format!("parity.trace.{stage}")),
    };
    t.with_context(|| format!("stage trace `{stage}` is missing"))
}

/// A part of candle-transformers' block, run on one stage's PyTorch input.
type Part<'a> = Box<dyn Fn(&Tensor) -> candle_core::Result<Tensor> + 'a>;

/// Where candle-transformers' error arises: each of its parts on PyTorch's input to that part.
fn stages(case: &Case, ct_cfg: CtConfig) -> Result<()> {
    if !case.bundle.tensors.contains_key("parity.trace.resnets.0/output") {
        println!("  (no stage traces in the bundle: the per-part errors are left out)");
        return Ok(());
    }
    let vb = var_builder(case, DType::F32)?;
    let (_, temb, context) = inputs(&case.bundle, DType::F32, None)?;
    let parts = ct_parts(&vb, ct_cfg, temb.as_ref(), context.as_ref())?;
    println!("  candle-transformers' parts, each on PyTorch's input to it  max|· − PyTorch f32|");
    let mut previous = "input".to_string();
    for (stage, kind, part) in &parts {
        let torch = trace(&case.bundle, &format!("{stage}/output"))?;
        let label = format!("{stage} ({kind})");
        match part(trace(&case.bundle, &previous)?) {
            Ok(y) => println!("    {label:<56}  {:>20.2e}", max_abs(&y, torch)?),
            Err(e) => println!("    {label:<56}  fails: {}", first_line(&e)),
        }
        previous = format!("{stage}/output");
    }
    let check = match ct_cfg {
        CtConfig::CrossAttn { .. } => geglu(&case.bundle),
        CtConfig::Mid { .. } => linear_on_view(&case.bundle, &vb),
    };
    if let Err(e) = check {
        println!("  (the last check is left out: {})", first_line(&e));
    }
    Ok(())
}

/// candle-transformers' resnets and attentions, built as its mid blocks' `new` builds them.
fn ct_parts<'a>(
    vb: &VarBuilder,
    ct_cfg: CtConfig,
    temb: Option<&'a Tensor>,
    context: Option<&'a Tensor>,
) -> Result<Vec<(String, &'static str, Part<'a>)>> {
    let (in_channels, temb_channels, num_layers, eps, groups, scale) = match ct_cfg {
        CtConfig::CrossAttn {
            in_channels,
            temb_channels,
            cfg,
        } => (
            in_channels,
            temb_channels,
            cfg.num_layers,
            cfg.resnet_eps,
            cfg.resnet_groups,
            cfg.output_scale_factor,
        ),
        CtConfig::Mid {
            in_channels,
            temb_channels,
            cfg,
        } => (
            in_channels,
            temb_channels,
            cfg.num_layers,
            cfg.resnet_eps,
            cfg.resnet_groups,
            cfg.output_scale_factor,
        ),
    };
    let groups = groups.unwrap_or((in_channels / 4).min(32));
    let resnet_cfg = ct_resnet::ResnetBlock2DConfig {
        eps,
        groups,
        output_scale_factor: scale,
        temb_channels,
        ..Default::default()
    };
    let resnet = |i: usize| -> Result<(String, &'static str, Part<'a>)> {
        let r = ct_resnet::ResnetBlock2D::new(vb.pp(format!("resnets.{i}")), in_channels, resnet_cfg)?;
        Ok((
            format!("resnets.{i}"),
            "ResnetBlock2D",
            Box::new(move |x: &Tensor| r.forward(x, temb)),
        ))
    };
    let mut parts = vec![resnet(0)?];
    for i in 0..num_layers {
        let vb_attn = vb.pp(format!("attentions.{i}"));
        let (kind, part): (&'static str, Part<'a>) = match ct_cfg {
            CtConfig::CrossAttn { cfg, .. } => {
                let heads = cfg.attn_num_head_channels;
                let st_cfg = ct_attn::SpatialTransformerConfig {
                    depth: cfg.transformer_layers_per_block,
                    num_groups: groups,
                    context_dim: Some(cfg.cross_attn_dim),
                    sliced_attention_size: None,
                    use_linear_projection: cfg.use_linear_projection,
                };
                let t =
                    ct_attn::SpatialTransformer::new(vb_attn, in_channels, heads, in_channels / heads, false, st_cfg)?;
                ("SpatialTransformer", Box::new(move |x: &Tensor| t.forward(x, context)))
            }
            CtConfig::Mid { cfg, .. } => {
                let attn_cfg = ct_attn::AttentionBlockConfig {
                    num_head_channels: cfg.attn_num_head_channels,
                    num_groups: groups,
                    rescale_output_factor: scale,
                    eps,
                };
                let a = ct_attn::AttentionBlock::new(vb_attn, in_channels, attn_cfg)?;
                (
                    "AttentionBlock",
                    Box::new(move |x: &Tensor| candle_core::Module::forward(&a, x)),
                )
            }
        };
        parts.push((format!("attentions.{i}"), kind, part));
        parts.push(resnet(i + 1)?);
    }
    Ok(parts)
}

/// GEGLU on PyTorch's own projection (`ff/proj_in`): `value · gelu(gate)` with candle's tanh
/// `gelu` (candle-transformers' GeGlu) and with `gelu_erf` (diffusers' GEGLU), against `ff/act`.
fn geglu(bundle: &Bundle) -> Result<()> {
    let stage = "attentions.0/transformer_blocks.0/ff";
    let (proj, torch) = (
        trace(bundle, &format!("{stage}/proj_in"))?,
        trace(bundle, &format!("{stage}/act"))?,
    );
    let halves = proj.chunk(2, proj.rank() - 1)?;
    let (value, gate) = (&halves[0], &halves[1]);
    let tanh = (value * gate.gelu()?)?;
    let erf = (value * gate.gelu_erf()?)?;
    println!("  GEGLU on PyTorch's `{stage}/proj_in`, against its `ff/act`:");
    println!(
        "    {:<56}  {:>20.2e}",
        "value · gelu(gate), tanh (candle-transformers' GeGlu)",
        max_abs(&tanh, torch)?
    );
    println!(
        "    {:<56}  {:>20.2e}",
        "value · gelu_erf(gate), erf (diffusers' GEGLU, ours)",
        max_abs(&erf, torch)?
    );
    Ok(())
}

/// candle-transformers' `AttentionBlock` applies `candle_nn::Linear` to the tokens as a transposed
/// view `(B, N, C)` of the group norm's `(B, C, N)`; the same `to_q` on that view and on a
/// contiguous copy of it, against PyTorch's `attentions.0/q`.
fn linear_on_view(bundle: &Bundle, vb: &VarBuilder) -> Result<()> {
    let norm = trace(bundle, "attentions.0/norm")?;
    let (b, c, _) = norm.dims3()?;
    let q = trace(bundle, "attentions.0/q")?.transpose(1, 2)?.flatten_from(2)?;
    let name = if vb.contains_tensor("attentions.0.to_q.weight") {
        "to_q"
    } else {
        "query"
    };
    let linear = candle_nn::linear(c, c, vb.pp(format!("attentions.0.{name}")))?;
    let view = norm.transpose(1, 2)?;
    let on_view = candle_core::Module::forward(&linear, &view)?;
    let on_copy = candle_core::Module::forward(&linear, &view.contiguous()?)?;
    println!(
        "  candle_nn::Linear `{name}` on PyTorch's `attentions.0/norm` (batch {b}), against its `attentions.0/q`:"
    );
    println!(
        "    {:<56}  {:>20.2e}",
        "on the transposed view (B, N, C) candle-transformers uses",
        max_abs(&on_view, &q)?
    );
    println!(
        "    {:<56}  {:>20.2e}",
        "on a contiguous copy of it",
        max_abs(&on_copy, &q)?
    );
    Ok(())
}

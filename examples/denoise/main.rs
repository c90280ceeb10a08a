//! A denoising loop on the tiny committed SD 1.x models: DDIM (eta 0) with classifier-free
//! guidance driving our `UNet2DConditionModel`, then our `AutoencoderKL` decoding the latents to
//! a PNG, compared with diffusers' run of the same loop (`scripts/denoise.py`, saved in
//! `weights/whole/denoise_sd1.safetensors`).
//!
//! ```sh
//! cargo run --release --example denoise -- [--steps N] [--out target/denoise.png] [--dtype f32|f16|bf16]
//! ```
//!
//! The picture is a 32 × 32 RGB image that looks like coloured noise: the models are tiny and
//! untrained (random weights), so the loop shows that ours computes PyTorch's pixels, not a
//! recognisable image. It is written under `target/` unless `--out` says otherwise.
//!
//! The initial noise and the two contexts (unconditional, conditional; there is no text encoder)
//! come from the reference file. With the reference's step count (10) it prints, for each step,
//! the max |ours − PyTorch| of the latents, then that of the image and how many of its 8-bit
//! values differ from PyTorch's PNG (`docs/images/denoise_torch.png`). In float16 / bfloat16 the
//! U-Net and VAE run in that dtype and the image is compared with PyTorch's float32 image and with
//! PyTorch's own run in the same dtype.

// The schedulers shared with examples/digits; this example takes DDIM only.
mod sampler;
#[allow(dead_code)]
#[path = "../common/schedule.rs"]
mod schedule;

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

use sampler::{Ddim, Models, Reference};

struct Args {
    steps: Option<usize>,
    out: String,
    dtype: DType,
}

fn args() -> Result<Args> {
    let mut args = Args {
        steps: None,
        out: "target/denoise.png".into(),
        dtype: DType::F32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} takes a value"));
        match flag.as_str() {
            "--steps" => args.steps = Some(value()?.parse().context("--steps")?),
            "--out" => args.out = value()?,
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => bail!("--dtype {other}: f32, f16 or bf16"),
                }
            }
            "-h" | "--help" => {
                println!("usage: denoise [--steps N] [--out FILE.png] [--dtype f32|f16|bf16]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (--help)"),
        }
    }
    Ok(args)
}

fn write_png(path: &str, image: &Tensor) -> Result<()> {
    let (w, h, rgb) = sampler::to_8bit(image)?;
    let file = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&rgb)?;
    Ok(())
}

fn main() -> Result<()> {
    let args = args()?;
    let dev = Device::Cpu;
    let reference = Reference::load(sampler::REFERENCE, &dev)?;
    let steps = args.steps.unwrap_or(reference.steps());
    let ddim = Ddim::new(steps)?;
    let models = Models::load(Path::new("."), args.dtype, &dev)?;
    let start = std::time::Instant::now();
    let out = sampler::denoise(
        &models,
        &ddim,
        &reference.noise,
        &reference.context,
        reference.guidance_scale,
    )?;
    let elapsed = start.elapsed();
    write_png(&args.out, &out.image)?;
    println!(
        "{steps} DDIM steps, guidance {}, {:?}: {:.2?}; wrote {}",
        reference.guidance_scale, args.dtype, elapsed, args.out
    );
    if steps != reference.steps() {
        println!("(PyTorch's run took {} steps: nothing to compare)", reference.steps());
        return Ok(());
    }
    if let Some(source) = reference.metadata.get("denoise.source") {
        println!("reference: {source}");
    }
    println!("schedule: timesteps {:?}", ddim.timesteps);
    if ddim.timesteps != reference.timesteps || ddim.alphas_cumprod != reference.alphas_cumprod {
        println!("warning: our schedule differs from diffusers' DDIMScheduler's");
    }
    println!("{:>4} {:>5} {:>12} {:>12}", "step", "t", "max|latent|", "max|ours-pt|");
    for (i, (ours, &t)) in out.latents.iter().zip(&ddim.timesteps).enumerate() {
        let theirs = reference.latents.get(i)?;
        let size = theirs.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        println!(
            "{:>4} {:>5} {:>12.4} {:>12.3e}",
            i + 1,
            t,
            size,
            sampler::max_abs_diff(ours, &theirs)?
        );
    }
    let n = out.image.elem_count();
    let mut against = vec![("PyTorch f32", &reference.image)];
    match args.dtype {
        DType::F16 => against.push(("PyTorch f16", &reference.image_f16)),
        DType::BF16 => against.push(("PyTorch bf16", &reference.image_bf16)),
        _ => {}
    }
    for (name, theirs) in against {
        println!(
            "image vs {name}: max |diff| {:.3e}, 8-bit values differing {} of {n}",
            sampler::max_abs_diff(&out.image, theirs)?,
            sampler::differing_8bit(&out.image, theirs)?
        );
    }
    Ok(())
}

//! Trained weights, end to end: a tiny DDPM that learned scikit-learn's handwritten digits in
//! PyTorch (`scripts/digits_ddpm.py train`, diffusers' `UNet2DModel`, 948 k parameters, saved in
//! `weights/models/digits_ddpm`), sampled here with our `UNet2DModel` by DDPM (1000 steps) and DDIM
//! (50 steps, eta 0), each grid written beside PyTorch's from the same noise.
//!
//! ```sh
//! cargo run --release --example digits -- [--seed 0] [--ddim-steps 50] [--ddpm-steps 1000] [--dtype f32|f16|bf16]
//!     [--out-dir target] [--reference weights/whole/digits_samples.safetensors]
//! ```
//!
//! Writes `target/digits_ddpm.png` and `target/digits_ddim.png`: 4 × 4 digits of 16 × 16 pixels,
//! each pixel drawn 4 × 4, ours on the left and PyTorch's (`weights/whole/digits_samples.safetensors`)
//! on the right. Both sides draw their noise from the same counter-based generator (SplitMix64 and
//! Box–Muller, `sampler::normal`), so any `--seed` gives a grid; with the reference's seed and
//! step counts (0, 1000, 50) it prints max |ours − PyTorch| of the samples and how many 8-bit
//! pixels differ (with another seed the right half shows the reference's digits, not these).
//! `scripts/digits_ddpm.py sample --seed N --out FILE` writes PyTorch's run for another seed, to
//! compare with `--seed N --reference FILE`.

#[path = "../common/schedule.rs"]
mod schedule;
// The loops shared with tests/e2e/digits.rs, which reads the per-step samples this does not.
#[allow(dead_code)]
mod sampler;

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device, Tensor};

use sampler::{Model, Reference};
use schedule::{Ddim, Ddpm};

struct Args {
    seed: u64,
    ddim_steps: usize,
    ddpm_steps: usize,
    dtype: DType,
    out_dir: String,
    reference: String,
}

fn args() -> Result<Args> {
    let mut args = Args {
        seed: 0,
        ddim_steps: 50,
        ddpm_steps: 1000,
        dtype: DType::F32,
        out_dir: "target".into(),
        reference: sampler::REFERENCE.into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} takes a value"));
        match flag.as_str() {
            "--seed" => args.seed = value()?.parse().context("--seed")?,
            "--ddim-steps" => args.ddim_steps = value()?.parse().context("--ddim-steps")?,
            "--ddpm-steps" => args.ddpm_steps = value()?.parse().context("--ddpm-steps")?,
            "--out-dir" => args.out_dir = value()?,
            "--reference" => args.reference = value()?,
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => bail!("--dtype {other}: f32, f16 or bf16"),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: digits [--seed N] [--ddim-steps N] [--ddpm-steps N] [--dtype f32|f16|bf16] [--out-dir DIR] [--reference FILE]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (--help)"),
        }
    }
    Ok(args)
}

fn write_png(path: &Path, (w, h, grey): (usize, usize, Vec<u8>)) -> Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w as u32, h as u32);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&grey)?;
    Ok(())
}

/// Writes ours beside PyTorch's and, when the run is the reference's, says how far apart they are.
fn report(name: &str, ours: &Tensor, theirs: &Tensor, comparable: bool, args: &Args) -> Result<()> {
    let path = Path::new(&args.out_dir).join(format!("digits_{name}.png"));
    write_png(&path, sampler::side_by_side(ours, theirs, 4)?)?;
    print!("  wrote {} (ours left, PyTorch's right)", path.display());
    if comparable {
        println!(
            "; vs PyTorch: max |diff| {:.3e}, 8-bit pixels differing {} of {}",
            sampler::max_abs_diff(ours, theirs)?,
            sampler::differing_8bit(ours, theirs)?,
            ours.elem_count()
        );
    } else {
        println!("; not the reference's seed / steps: the right half is PyTorch's run of the reference");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = args()?;
    let dev = Device::Cpu;
    let reference = Reference::load(&args.reference, &dev)?;
    let model = Model::load(Path::new(sampler::MODEL), args.dtype, &dev)?;
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir))?;
    let same_seed = args.seed == reference.seed;
    if let Some(source) = reference.metadata.get("digits.source") {
        println!("reference: {source}, seed {}", reference.seed);
    }
    if same_seed
        && sampler::max_abs_diff(&sampler::noise(args.seed, 0, model.shape()?, &dev)?, &reference.noise)? != 0.0
    {
        println!("warning: our noise generator differs from the reference's");
    }

    let ddim = Ddim::with_config(&model.scheduler, args.ddim_steps)?;
    let start = Instant::now();
    let samples = model.ddim(&ddim, args.seed)?;
    let ours = samples.last().context("no DDIM step")?;
    println!(
        "DDIM, {} steps, {:?}: {:.2?}",
        args.ddim_steps,
        args.dtype,
        start.elapsed()
    );
    let comparable = same_seed && ddim.timesteps == reference.ddim_timesteps;
    report("ddim", ours, &reference.ddim, comparable, &args)?;

    let ddpm = Ddpm::with_config(&model.scheduler, args.ddpm_steps)?;
    let start = Instant::now();
    let ours = model.ddpm(&ddpm, args.seed)?;
    println!(
        "DDPM, {} steps, {:?}: {:.2?}",
        args.ddpm_steps,
        args.dtype,
        start.elapsed()
    );
    let comparable = same_seed && ddpm.timesteps == reference.ddpm_timesteps;
    report("ddpm", &ours, &reference.ddpm, comparable, &args)?;
    Ok(())
}

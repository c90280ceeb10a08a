//! The denoising example's loop (`examples/denoise`) against diffusers' run of the same loop
//! (`scripts/denoise.py`, `weights/whole/denoise_sd1.safetensors`), in float32.

#[path = "../../examples/denoise/sampler.rs"]
mod sampler;

use candle_core::{DType, Device};
use unet_attention::models::UNet2DConditionModel;

use sampler::{Ddim, Reference};

fn root(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Our DDIM schedule is diffusers': the same timesteps and bit-identical ᾱ (float32 linspace by
/// fused multiply-adds, cumprod accumulated in float64 as torch does on the CPU).
#[test]
fn ddim_schedule_is_diffusers() {
    let reference = Reference::load(root(sampler::REFERENCE), &Device::Cpu).unwrap();
    let ddim = Ddim::new(reference.steps()).unwrap();
    assert_eq!(ddim.timesteps, reference.timesteps);
    assert_eq!(ddim.timesteps, [901, 801, 701, 601, 501, 401, 301, 201, 101, 1]);
    let differ = ddim.alphas_cumprod.iter().zip(&reference.alphas_cumprod).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "alphas_cumprod values differing from diffusers'");
}

#[test]
fn latents_wip() {
    let dev = Device::Cpu;
    let reference = Reference::load(root(sampler::REFERENCE), &dev).unwrap();
    let ddim = Ddim::new(reference.steps()).unwrap();
    let unet = UNet2DConditionModel::load(root(sampler::UNET), DType::F32, &dev).unwrap();
    let t0 = std::time::Instant::now();
    let out = sampler::denoise(&unet, |z| Ok(z.clone()), 0.18215, &ddim, &reference.noise, &reference.context,
        reference.guidance_scale, DType::F32).unwrap();
    eprintln!("loop {:?}", t0.elapsed());
    for (i, l) in out.latents.iter().enumerate() {
        eprintln!("step {i}: {:.3e}", sampler::max_abs_diff(l, &reference.latents.get(i).unwrap()).unwrap());
    }
}

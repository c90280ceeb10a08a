//! Trained weights end to end (`examples/digits`): the DDPM `scripts/digits_ddpm.py` trained on
//! scikit-learn's digits, sampled by our `UNet2DModel` with DDPM and DDIM from the noise PyTorch
//! drew, against diffusers' own run of both loops (`weights/whole/digits_samples.safetensors`).

#[allow(dead_code)]
#[path = "../../examples/digits/sampler.rs"]
mod sampler;

use candle_core::{DType, Device};

use crate::schedule::{Ddim, Ddpm};
use sampler::{Model, Reference};

fn root(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load() -> (Model, Reference) {
    let dev = Device::Cpu;
    let reference = Reference::load(root(sampler::REFERENCE), &dev).unwrap();
    let model = Model::load(&root(sampler::MODEL), DType::F32, &dev).unwrap();
    (model, reference)
}

/// The generator both sides draw from gives Python's float32 values bit for bit.
#[test]
fn noise_generator_is_pythons() {
    let (model, reference) = load();
    let ours = sampler::noise(reference.seed, 0, model.shape().unwrap(), &Device::Cpu).unwrap();
    let diff = sampler::max_abs_diff(&ours, &reference.noise).unwrap();
    assert_eq!(diff, 0.0, "stream 0 differs from scripts/digits_ddpm.py's");
    // Its moments are a standard normal's (16,384 values: mean within 4 standard errors).
    let v = sampler::normal(7, 3, 1 << 14);
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(
        mean.abs() < 4.0 / 128.0 && (var - 1.0).abs() < 0.05,
        "mean {mean}, variance {var}"
    );
}

/// Both schedules are diffusers': the same timesteps and bit-identical ᾱ.
#[test]
fn schedules_are_diffusers() {
    let (model, reference) = load();
    let ddim = Ddim::with_config(&model.scheduler, reference.ddim_timesteps.len()).unwrap();
    let ddpm = Ddpm::with_config(&model.scheduler, reference.ddpm_timesteps.len()).unwrap();
    assert_eq!(ddim.timesteps, reference.ddim_timesteps);
    assert_eq!(ddpm.timesteps, reference.ddpm_timesteps);
    assert_eq!(ddim.alphas_cumprod, reference.alphas_cumprod);
    assert_eq!(ddpm.alphas_cumprod, reference.alphas_cumprod);
}

/// Max |ours − PyTorch| of DDIM's samples after each step.
fn ddim_errors(model: &Model, ddim: &Ddim, reference: &Reference) -> Vec<f32> {
    let ours = model.ddim(ddim, reference.seed).unwrap();
    ours.iter()
        .enumerate()
        .map(|(i, x)| sampler::max_abs_diff(x, &reference.ddim_steps.get(i).unwrap()).unwrap())
        .collect()
}

fn sci(v: &[f32]) -> String {
    v.iter()
        .step_by(5)
        .map(|x| format!("{x:.1e}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Max |ours − PyTorch| of the samples (in [-1, 1]) of DDIM (50 steps, after each) and DDPM (100
/// steps, at the end). Chosen on seeds 0 to 4 (final samples: largest 5.7e-6; DDIM's steps for seed
/// 0: up to 7.6e-6), checked on seeds 5 to 9 made afterwards (`scripts/digits_ddpm.py sample --seed
/// N --ddpm-steps 100 --out FILE`, run with `examples/digits --reference FILE`): largest 7.8e-6,
/// 2-core Xeon. The error starts as the U-Net's float32 rounding (about 1e-6 of ε on its
/// whole-model bundles) and is carried, not grown, by the steps (each x₀ prediction is clipped to
/// ±1). The bound is 13 times the largest seen and a 78th of one 8-bit level (2/255 in [-1, 1]):
/// the PNGs can differ only where a value lies within 1e-4 of a rounding tie (one pixel of 4,096
/// did for two seeds). Wrong loops land 177 to 18,000 times above it (the negative checks below).
/// DDPM's 1000 steps (the example's) carry more: 7.9e-7 for seed 0, 6.7e-5 for seed 1.
const SAMPLE_TOL: f32 = 1e-4;

/// DDIM (50 steps, eta 0) against PyTorch's at every step, then two wrong loops that must fail by
/// a wide margin: the U-Net given the timestep after the right one (a time embedding one step
/// off) and ᾱ one timestep off.
#[test]
fn ddim_samples_match_pytorch() {
    let (model, reference) = load();
    let ddim = Ddim::with_config(&model.scheduler, reference.ddim_timesteps.len()).unwrap();
    let errors = ddim_errors(&model, &ddim, &reference);
    eprintln!("DDIM vs PyTorch, every 5th step: {}", sci(&errors));
    let worst = errors.iter().cloned().fold(0f32, f32::max);
    assert!(
        worst <= SAMPLE_TOL,
        "DDIM samples off by {worst:.3e} (bound {SAMPLE_TOL:.0e})"
    );

    let mut shifted = ddim.clone();
    shifted.alphas_cumprod.rotate_right(1);
    shifted.alphas_cumprod[0] = ddim.alphas_cumprod[0];
    let wrong = *ddim_errors(&model, &shifted, &reference).last().unwrap();
    eprintln!("alphas one step off: {wrong:.3e}");
    assert!(wrong > 100.0 * SAMPLE_TOL, "alphas one step off passed: {wrong:e}");

    let mut x = reference.noise.clone();
    for &t in &ddim.timesteps {
        let eps = model.unet.forward(&x, (t + 1) as f64).unwrap();
        x = ddim.step(&eps, t, &x).unwrap();
    }
    let wrong = sampler::max_abs_diff(&x, &reference.ddim).unwrap();
    eprintln!("time embedding one step off: {wrong:.3e}");
    assert!(
        wrong > 100.0 * SAMPLE_TOL,
        "time embedding one step off passed: {wrong:e}"
    );
}

/// DDPM (100 steps, the per-step noise from the shared generator) against PyTorch's, and the same
/// loop without its per-step noise, which must fail.
#[test]
fn ddpm_samples_match_pytorch() {
    let (model, reference) = load();
    let ddpm = Ddpm::with_config(&model.scheduler, reference.ddpm_short_timesteps.len()).unwrap();
    assert_eq!(ddpm.timesteps, reference.ddpm_short_timesteps);
    let ours = model.ddpm(&ddpm, reference.seed).unwrap();
    let err = sampler::max_abs_diff(&ours, &reference.ddpm_short).unwrap();
    let differ = sampler::differing_8bit(&ours, &reference.ddpm_short).unwrap();
    eprintln!(
        "DDPM (100 steps) vs PyTorch: {err:.3e}, 8-bit pixels differing {differ} of {}",
        ours.elem_count()
    );
    assert!(
        err <= SAMPLE_TOL,
        "DDPM samples off by {err:.3e} (bound {SAMPLE_TOL:.0e})"
    );

    let mut x = reference.noise.clone();
    for &t in &ddpm.timesteps {
        let eps = model.unet.forward(&x, t as f64).unwrap();
        x = ddpm.step(&eps, t, &x, &x.zeros_like().unwrap()).unwrap();
    }
    let wrong = sampler::max_abs_diff(&x, &reference.ddpm_short).unwrap();
    eprintln!("without the per-step noise: {wrong:.3e}");
    assert!(wrong > 100.0 * SAMPLE_TOL, "DDPM without its noise passed: {wrong:e}");
}

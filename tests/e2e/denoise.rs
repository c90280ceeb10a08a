//! The denoising example's loop (`examples/denoise`) against diffusers' run of the same loop
//! (`scripts/denoise.py`, `weights/whole/denoise_sd1.safetensors`), in float32.

// The example's own loop; the example uses parts the tests do not.
#[allow(dead_code)]
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
    let differ = ddim
        .alphas_cumprod
        .iter()
        .zip(&reference.alphas_cumprod)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(differ, 0, "alphas_cumprod values differing from diffusers'");
}

fn sci(v: &[f32]) -> String {
    v.iter().map(|x| format!("{x:.2e}")).collect::<Vec<_>>().join(" ")
}

/// Max |ours − PyTorch| of each step's latents over that step's max |PyTorch latent|.
fn latent_errors(out: &sampler::Denoised, reference: &Reference) -> Vec<f32> {
    out.latents
        .iter()
        .enumerate()
        .map(|(i, ours)| {
            let theirs = reference.latents.get(i).unwrap();
            let size: f32 = theirs
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar()
                .unwrap();
            sampler::max_abs_diff(ours, &theirs).unwrap() / size
        })
        .collect()
}

/// Each step's latents, relative to their size. Measured (float32, 2-core Zen 4): 1.4e-6 after
/// the first step to 1.6e-6 after the last (max |latent| grows from 7.9 to 55 on this random
/// model). The U-Net's own float32 error (1.8e-6 on its whole-model bundle) is multiplied by the
/// guidance (ε_cond − ε_uncond is scaled by 7.5) and carried through the steps; 1e-5 leaves room
/// for another CPU's summation order and is far below what a wrong loop gives (the negative
/// checks below, measured: guidance 7 instead of 7.5, 5e-2 at every step; ᾱ one timestep off,
/// 1.7e-3 after the first step, 5.1e-3 after the last) or a float16 U-Net (5e-3).
const LATENT_TOL: f32 = 1e-5;

/// The loop's latents against PyTorch's at every step, with the U-Net alone (the decoder is not
/// needed for them), and two wrong loops that must fail the same bound.
#[test]
fn denoised_latents_match_pytorch() {
    let dev = Device::Cpu;
    let reference = Reference::load(root(sampler::REFERENCE), &dev).unwrap();
    let ddim = Ddim::new(reference.steps()).unwrap();
    let unet = UNet2DConditionModel::load(root(sampler::UNET), DType::F32, &dev).unwrap();
    let models = sampler::Models {
        unet,
        decode: Box::new(|z| Ok(z.clone())),
        scaling_factor: 1.0,
        dtype: DType::F32,
    };
    let run = |ddim: &Ddim, guidance: f64| {
        let out = sampler::denoise(&models, ddim, &reference.noise, &reference.context, guidance).unwrap();
        latent_errors(&out, &reference)
    };
    let errors = run(&ddim, reference.guidance_scale);
    eprintln!("latents vs PyTorch, relative to their size, per step: {}", sci(&errors));
    for (i, e) in errors.iter().enumerate() {
        assert!(
            *e <= LATENT_TOL,
            "step {}: latents off by {e:.3e} of their size (bound {LATENT_TOL:.0e})",
            i + 1
        );
    }
    // A guidance scale of 7 instead of 7.5.
    let wrong = run(&ddim, 7.0);
    eprintln!("guidance 7: {}", sci(&wrong));
    assert!(
        wrong.last().unwrap() > &(10.0 * LATENT_TOL),
        "guidance 7 passed: {wrong:?}"
    );
    // ᾱ one timestep off (ᾱ_{t−1} for ᾱ_t, as a loop that forgot steps_offset would use).
    let mut shifted = ddim.clone();
    shifted.alphas_cumprod.rotate_right(1);
    shifted.alphas_cumprod[0] = ddim.alphas_cumprod[0];
    let wrong = run(&shifted, reference.guidance_scale);
    eprintln!("alphas one step off: {}", sci(&wrong));
    assert!(wrong[0] > 10.0 * LATENT_TOL, "alphas one step off passed: {wrong:?}");
}

/// The image, float32, in [0, 1]. Measured (2-core Zen 4): 2.6e-6 max |ours − PyTorch|, no 8-bit
/// value differing. The error model: each step's latents carry float32 rounding of about 1.5e-6
/// of their size (the latents test), which the decoder maps to a few 1e-6 in the image. The
/// bound, 1e-4, is about 40 times that, and a twentieth of half an 8-bit step (1/510), so the two
/// PNGs can differ only where a value lies within 1e-4 of a rounding tie. It is not the PNG's
/// half step itself: a schedule one timestep off moves the image by only 1.3e-3, under 1/510,
/// and must fail; here it lands 13 times above the bound, a wrong guidance scale 670 times.
const IMAGE_TOL: f32 = 1.0e-4;

/// The whole example in float32 (U-Net, DDIM, our VAE's decoder) against PyTorch's image, and
/// the same two wrong loops, which must fail the image's bound too.
#[test]
fn denoised_image_matches_pytorch() {
    let dev = Device::Cpu;
    let reference = Reference::load(root(sampler::REFERENCE), &dev).unwrap();
    let ddim = Ddim::new(reference.steps()).unwrap();
    let models = sampler::Models::load(&root(""), DType::F32, &dev).unwrap();
    let image = |ddim: &Ddim, guidance: f64| {
        let out = sampler::denoise(&models, ddim, &reference.noise, &reference.context, guidance).unwrap();
        out.image
    };
    let ours = image(&ddim, reference.guidance_scale);
    let err = sampler::max_abs_diff(&ours, &reference.image).unwrap();
    let differ = sampler::differing_8bit(&ours, &reference.image).unwrap();
    eprintln!(
        "image vs PyTorch: max |diff| {err:.3e}, 8-bit values differing {differ} of {}",
        ours.elem_count()
    );
    assert!(err <= IMAGE_TOL, "image off by {err:.3e} (bound {IMAGE_TOL:.0e})");
    let wrong = sampler::max_abs_diff(&image(&ddim, 7.0), &reference.image).unwrap();
    eprintln!("guidance 7: {wrong:.3e}");
    assert!(wrong > 10.0 * IMAGE_TOL, "guidance 7 passed: {wrong:.3e}");
    let mut shifted = ddim.clone();
    shifted.alphas_cumprod.rotate_right(1);
    shifted.alphas_cumprod[0] = ddim.alphas_cumprod[0];
    let wrong = sampler::max_abs_diff(&image(&shifted, reference.guidance_scale), &reference.image).unwrap();
    eprintln!("alphas one step off: {wrong:.3e}");
    assert!(wrong > 10.0 * IMAGE_TOL, "alphas one step off passed: {wrong:.3e}");
}

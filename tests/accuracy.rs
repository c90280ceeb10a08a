//! The f32 accuracy of the conv-heavy mid blocks (issue: "ours against the float64 output at
//! most 1.5× PyTorch's own error"): `weights/accuracy/` holds diffusers `ResnetBlock2D` and
//! `UNetMidBlock2D`, ldm's mid block and guided-diffusion's middle block with perturbed weights,
//! two seeds each, exported by `scripts/export_accuracy.py` with PyTorch's f32 and float64
//! outputs.
//!
//! A test binary of its own: it switches the process-wide layer path (`set_layer_path`), which
//! would change the path of every test running beside it in one process (`tests/e2e`'s
//! bit-for-bit comparisons among them).

#[path = "../crates/parity/tests/common/mod.rs"]
mod common;
use common::*;
use unet_attention::cpu_kernels::{set_layer_path, LayerPath};
use unet_parity::check::{check_file, Options};

fn accuracy_bundles() -> Vec<std::path::PathBuf> {
    let paths = unet_parity::bundle::collect(&[weights().join("accuracy")]).unwrap();
    assert_eq!(paths.len(), 8, "weights/accuracy: 4 blocks x 2 seeds");
    paths
}

/// `(ours − f64, torch − f64)` max abs errors of each bundle's output.
fn errors() -> Vec<(String, f64, f64)> {
    accuracy_bundles()
        .iter()
        .map(|path| {
            let report = check_file(path, &Options::default()).unwrap();
            assert!(report.pass, "{}: {:?}", path.display(), report.outputs);
            let out = &report.outputs[0];
            (report.file.clone(), out.ours_vs_f64.unwrap(), out.torch_vs_f64.unwrap())
        })
        .collect()
}

#[test]
fn conv_heavy_blocks_are_within_one_and_a_half_times_pytorch_f32_error() {
    if unet_attention::cpu_kernels::layer_kernel_isa() == "none" {
        // No packed layers on this CPU (or UNET_ATTENTION_ISA=none): every path is Candle's.
        eprintln!("skipped: the packed CPU layers do not run here");
        return;
    }
    // The packed CPU layers (where this CPU runs them) with the convolutions as sized, forced
    // direct, and forced through Winograd's F(2×2, 3×3), one after the other in this one test
    // (the switch is process-wide). Candle's own ops (`LayerPath::Candle`, the debugging
    // reference) are not held to this: their error depends on which `gemm` kernels the CPU
    // gets (within 1.5× on an AVX2 Zen 3, 1.7× with the AVX-512 kernels of a Zen 4).
    for path in [LayerPath::Auto, LayerPath::Direct, LayerPath::Winograd] {
        set_layer_path(Some(path));
        let errs = errors();
        set_layer_path(None);
        for (file, ours, torch) in errs {
            eprintln!("{file} ({path:?}): ours {ours:.3e}, PyTorch {torch:.3e}");
            assert!(
                ours <= 1.5 * torch,
                "{file} ({path:?}): ours {ours:.3e} vs float64, PyTorch's own {torch:.3e}"
            );
        }
    }
}

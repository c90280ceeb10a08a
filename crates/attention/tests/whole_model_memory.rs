//! The whole U-Net's memory, counted by the allocator (a test of memory, not of time): a mid-size
//! `UNet2DConditionModel` (three levels, 64–128 channels, cross-attention at 32 × 32 = 1,024
//! tokens, batch 2) built on made-up weights, then one forward.
//!
//! * The weights are held once, in the dtype they were loaded in: the heap after building is
//!   within 10 % of the checkpoint's bytes in f32, and about half of that in bf16 and f16 (a
//!   packed copy beside the file's, or half weights widened to f32, would double it).
//! * A step's peak over what is held before it (the weights and what the kernels keep between
//!   calls, itself bounded by [`KEPT_BYTES`]) is at most [`PEAK_UNITS`] full-resolution
//!   activations (one `(2, 64, 32, 32)` f32 tensor, 512 KiB): what the up path's skips, a
//!   feed-forward's inner tokens and a convolution's input and output need together. Attention
//!   scores formed whole would be 128 of them (`(2, 8, 1024, 1024)` in f32) and fail the test, as
//!   would a second copy of every skip or a leaked intermediate per layer.
//!
//! The bounds were set from the measured values (2026-12-07, Intel Xeon, main after issue 56: a
//! step's peak 16.0 activations in f32 with the AVX-512 and the AVX2 kernels, 19.5 in bf16 and
//! f16, 28.9 on Candle's ops under `UNET_ATTENTION_ISA=none`, whose convolutions form the whole
//! im2col matrix; kept 24.6 MiB) with room for another CPU's blockings, not tuned to pass; the
//! measured values are printed with `--nocapture`.

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use unet_attention::models::{UNet2DConditionModel, UNet2DConditionModelConfig};

#[path = "../examples/support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static HEAP: counting_alloc::Counting = counting_alloc::Counting;

/// A step's peak heap over what is held before it, in full-resolution activations, at most.
const PEAK_UNITS: f64 = 40.0;

/// What the kernels keep from one call to the next, at most (their caps do not grow with the
/// model: a few MiB of scratch per thread, the attention's packing buffer, the Winograd path's
/// tile blocks of about 16 MiB).
const KEPT_BYTES: usize = 48 << 20;

/// One test at a time: the counter is the process's.
static ONE: Mutex<()> = Mutex::new(());

/// Made-up weights of any shape asked for (scaled like an initialisation, norms near 1).
struct MadeUp;

impl SimpleBackend for MadeUp {
    fn get(&self, s: Shape, name: &str, _: candle_nn::Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let seed = name
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32)) as f32;
        let scale = 1.0 / (s.dims().iter().skip(1).product::<usize>().max(1) as f32).sqrt();
        let norm = name.contains("norm") && name.ends_with("weight");
        let v: Vec<f32> = (0..s.elem_count())
            .map(|i| {
                let x = ((i as f32) * 0.618_034 + seed * 1e-3).sin();
                if norm {
                    1.0 + 0.1 * x
                } else {
                    scale * x
                }
            })
            .collect();
        Tensor::from_vec(v, s, dev)?.to_dtype(dtype)
    }
    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("made-up weights need a shape: {name}")
    }
    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

fn config() -> UNet2DConditionModelConfig {
    UNet2DConditionModelConfig::from_config_json(&serde_json::json!({
        "block_out_channels": [64, 128, 128],
        "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
        "layers_per_block": 1,
        "cross_attention_dim": 64,
        "attention_head_dim": 8,
        "sample_size": 32,
    }))
    .unwrap()
}

/// `(weights' bytes as loaded, heap after building, heap the kernels keep after a first
/// forward, peak of a second forward over the heap before it)`.
fn measure(dtype: DType) -> (usize, usize, usize, usize) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1., (2, 4, 32, 32), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let ctx = Tensor::randn(0f32, 1., (2, 77, 64), &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let before = counting_alloc::now();
    let vb = candle_nn::VarBuilder::from_backend(Box::new(MadeUp), dtype, dev.clone());
    let unet = UNet2DConditionModel::new(vb, &config()).unwrap();
    let held = counting_alloc::now() - before;
    // The checkpoint's bytes: the weights unpacked again.
    let params = count_params(&config());
    let bytes = params * dtype.size_in_bytes();
    let base = counting_alloc::now();
    drop(unet.forward(&x, 500.0, &ctx).unwrap());
    // What the kernels keep for the next call (scratch, the Winograd path's tile blocks).
    let kept = counting_alloc::now() - base;
    let steady = counting_alloc::now();
    counting_alloc::take_peak();
    let y = unet.forward(&x, 500.0, &ctx).unwrap();
    let peak = counting_alloc::take_peak() - steady;
    assert_eq!(y.dims(), [2, 4, 32, 32]);
    (bytes, held, kept, peak)
}

/// The parameter count of the config, from a checkpoint built on the made-up weights.
fn count_params(cfg: &UNet2DConditionModelConfig) -> usize {
    #[derive(Clone, Default)]
    struct Count(std::sync::Arc<AtomicUsize>);
    impl SimpleBackend for Count {
        fn get(&self, s: Shape, n: &str, i: candle_nn::Init, d: DType, dev: &Device) -> candle_core::Result<Tensor> {
            self.0.fetch_add(s.elem_count(), Ordering::SeqCst);
            MadeUp.get(s, n, i, d, dev)
        }
        fn get_unchecked(&self, n: &str, d: DType, dev: &Device) -> candle_core::Result<Tensor> {
            MadeUp.get_unchecked(n, d, dev)
        }
        fn contains_tensor(&self, _: &str) -> bool {
            true
        }
    }
    let count = Count::default();
    let vb = candle_nn::VarBuilder::from_backend(Box::new(count.clone()), DType::F32, Device::Cpu);
    drop(UNet2DConditionModel::new(vb, cfg).unwrap());
    count.0.load(Ordering::SeqCst)
}

#[test]
fn the_unet_holds_its_weights_once_and_its_forward_peak_is_bounded() {
    // One full-resolution activation, (2, 64, 32, 32) in f32.
    let unit = (2 * 64 * 32 * 32 * 4) as f64;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (bytes, held, kept, peak) = measure(dtype);
        let units = peak as f64 / unit;
        let mib = |b: usize| b as f64 / 1048576.0;
        eprintln!(
            "{dtype:?}: weights {:.1} MiB, held {:.1} MiB, kept by the kernels {:.1} MiB, a step's peak {:.1} MiB \
             over that = {units:.1} activations",
            mib(bytes),
            mib(held),
            mib(kept),
            mib(peak)
        );
        assert!(
            kept <= KEPT_BYTES,
            "{dtype:?}: the kernels keep {:.1} MiB between calls (bound {} MiB)",
            mib(kept),
            KEPT_BYTES >> 20
        );
        let ratio = held as f64 / bytes as f64;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{dtype:?}: the built model holds {held} bytes for {bytes} bytes of weights ({ratio:.2}x)"
        );
        assert!(
            units <= PEAK_UNITS,
            "{dtype:?}: the forward's peak is {units:.1} full-resolution activations over the weights (bound {PEAK_UNITS})"
        );
    }
}

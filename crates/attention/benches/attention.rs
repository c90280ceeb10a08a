//! Criterion benches of the attention core (auto path vs the reference path) and of whole
//! mid-block attention blocks. Kept short for a 2-core machine: 10 samples, 2 s of measurement.
//! The 16384-token core shape and the 128×128 VAE block take seconds per call: they are in
//! `examples/bench_sdpa.rs` (see BENCHMARKS.md), not here.
//!
//! ```text
//! cargo bench -p unet-attention --bench attention [-- FILTER]
//! ```

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::Duration;
use unet_attention::sdpa::{default_scale, sdpa_with, SdpaPath};

fn core(c: &mut Criterion) {
    let mut g = c.benchmark_group("sdpa_f32");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for shape in common::CORE_SHAPES.into_iter().filter(|s| s.2 < 16384) {
        let (q, k, v) = common::core_inputs(shape);
        let scale = default_scale(shape.4);
        let id = format!("{shape:?}");
        for path in [SdpaPath::Auto, SdpaPath::Reference] {
            g.bench_with_input(BenchmarkId::new(path.name(), &id), &(), |bench, _| {
                bench.iter(|| sdpa_with(path, &q, &k, &v, None, scale).unwrap())
            });
        }
    }
    g.finish();
}

fn blocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("blocks_f32");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let on = common::On::default();
    for case in [
        common::vae_mid(64, &on),
        common::ddpm_mid(16, &on),
        common::ddpm_mid(32, &on),
    ] {
        g.bench_function(&case.name, |bench| {
            bench.iter(|| case.block.forward(&case.input).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, core, blocks);
criterion_main!(benches);

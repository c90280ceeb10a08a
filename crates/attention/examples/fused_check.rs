//! The fused CUDA attention kernel (`unet_attention::cuda`) against the chunked tensor-op path,
//! on a GPU: the GPU kit's `fused` stage (`scripts/gpu_kit/run.sh fused`).
//!
//! ```text
//! cargo run --release -p unet-attention --features cuda --example fused_check -- [--out FILE] [--quick]
//! ```
//!
//! Random q, k, v (N(0, 1)) on `cuda:0` over every head-dim bucket from 8 to 512 (and head dims
//! that are not multiples of 8), odd query and key counts (never a multiple of the key tile),
//! cross-attention with 77 keys, memory key/values (4 extra keys), the masks the blocks pass
//! (none, additive float broadcast over heads, boolean as −inf, key padding), large finite masks
//! in f32 (`finite(<pattern>)`, issue 55: finfo(f32).min, finfo(f16).min, −1e10, −1e9 and −10000,
//! one a batch, on a wholly masked first key tile and every fifth row, causal, left and right
//! padding, split 1 and 3 ways, in every variant and, at head dim 512, the wide kernels; their
//! chunked reference is itself checked against the CPU's chunked path, `chunked_vs_cpu_*`), f16, bf16 and f32,
//! split-KV automatic, off (1) and forced (3); the VAE and SDXL core shapes once each; and the
//! other f16/bf16 kernel variants (`variant`: 8 warps, `ex2`, head dims over 256 in column chunks) on four of those shapes. Each case
//! writes one JSON line (to `--out`, default stdout): the shape, `max_abs` (fused vs chunked),
//! `tol`, `pass`, `fused_ms` and `chunked_ms` (median of 5 synchronised calls after a warm-up).
//! Tolerances, set before any GPU run from each dtype's rounding (the kernel rounds the
//! probabilities relative to the running row max, the chunked path relative to the final one):
//! `max_abs` at most f32 5e-5, f16 5e-3, bf16 4e-2, and `rel` (`max_abs` over the largest output,
//! which is of order 0.05 at 16384 keys) at most f32 2e-5, f16 4e-3, bf16 2.5e-2. Besides
//! contiguous inputs, q, k and v also come as the blocks make them, `(B, L, H, D)` transposed to
//! `(B, H, L, D)` (`layout: transposed`), and as views at an odd element offset with a padded row
//! stride (`layout: offset`: not 16-byte aligned, so the kernel copies element by element instead
//! of with `cp.async`). Exit 0: every case passed; 1: some failed; 3: no CUDA device or no kernel
//! in this build.

#[cfg(feature = "cuda")]
fn main() {
    std::process::exit(gpu::main())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("fused_check: built without the `cuda` feature");
    std::process::exit(3)
}

#[cfg(feature = "cuda")]
#[path = "support/gpu_check.rs"]
mod gpu_check;

#[cfg(feature = "cuda")]
mod gpu {
    use super::gpu_check::{first_call, median_ms, Report};
    use candle_core::{DType, Device, Result, Tensor};
    use unet_attention::cuda::{fused_sdpa, kernel_built, kernel_image, FusedOptions, FusedVariant};
    use unet_attention::sdpa::{default_scale, sdpa_with, SdpaPath};

    #[derive(Clone, Copy, Debug)]
    enum Mask {
        None,
        Additive,
        Boolean,
        KeyPadding,
        /// Large finite values in f32 (issue 55), batch b masked by `FINITE[b % 5]` as the
        /// pattern says.
        Finite(Pattern),
    }

    /// The finite mask values of the common conventions: finfo(f32).min, finfo(f16).min, −1e10,
    /// −1e9 (`masked_fill`), −10000.
    const FINITE: [f32; 5] = [f32::MIN, -65504.0, -1e10, -1e9, -1e4];

    /// Where a finite mask's value goes (the emulated tests' patterns, `cuda_plan/emulated_masks.rs`).
    #[derive(Clone, Copy, Debug)]
    enum Pattern {
        /// The first 64 keys of every row (a whole first key tile) and every key of every fifth row.
        FirstTile,
        /// Key j masked for query i where j > i (PyTorch's `is_causal`).
        Causal,
        /// Batch b's first keys, `[64, 100, Lk, Lk − 1, 5][b]` of them.
        LeftPad,
        /// Batch b's last keys, `[Lk, 5, 64, 100, Lk − 1][b]` of them.
        RightPad,
    }

    const PATTERNS: [Pattern; 4] = [Pattern::FirstTile, Pattern::Causal, Pattern::LeftPad, Pattern::RightPad];

    /// How q, k and v are laid out in memory.
    #[derive(Clone, Copy, Debug)]
    enum Layout {
        /// Contiguous `(B, H, L, D)`.
        Contiguous,
        /// `(B, L, H, D)` transposed to `(B, H, L, D)`, as the attention blocks pass them.
        Transposed,
        /// A view of `(B, H, L, D + 1)` from element 1: the kernel's unaligned fallback.
        Offset,
    }

    #[derive(Clone, Copy, Debug)]
    struct Case {
        dtype: DType,
        dims: (usize, usize, usize, usize, usize),
        mask: Mask,
        splits: Option<usize>,
        layout: Layout,
        variant: FusedVariant,
    }

    fn cases(quick: bool) -> Vec<Case> {
        let mut out = vec![];
        let head_dims: &[usize] = &[8, 16, 20, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256, 320, 512];
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            out.extend(finite_mask_cases(dtype));
            let mut push_variant = |dims, mask, splits, layout, variant| {
                out.push(Case {
                    dtype,
                    dims,
                    mask,
                    splits,
                    layout,
                    variant,
                })
            };
            // The other f16/bf16 kernels (8 warps, ex2) on a few shapes each (f32 has one).
            if dtype != DType::F32 {
                for (_, variant) in &FusedVariant::ALL[1..] {
                    push_variant((2, 3, 77, 131, 64), Mask::Additive, None, Layout::Contiguous, *variant);
                    push_variant((2, 3, 77, 131, 40), Mask::KeyPadding, Some(3), Layout::Offset, *variant);
                    push_variant((2, 20, 1024, 1024, 64), Mask::None, None, Layout::Transposed, *variant);
                    push_variant((1, 1, 4096, 4096, 512), Mask::None, None, Layout::Contiguous, *variant);
                }
            }
            let mut push =
                |dims, mask, splits, layout| push_variant(dims, mask, splits, layout, FusedVariant::default());
            for &d in head_dims {
                let dims = (2, 3, 77, 131, d);
                for splits in [None, Some(1), Some(3)] {
                    push(dims, Mask::None, splits, Layout::Contiguous);
                }
                if quick && d != 64 && d != 512 {
                    continue;
                }
                for mask in [Mask::Additive, Mask::Boolean, Mask::KeyPadding] {
                    push(dims, mask, None, Layout::Contiguous);
                }
            }
            // Cross-attention with 77 context keys (SD 1.5), memory key/values (lucidrains),
            // a single query, and the core shapes of BENCHMARKS.md.
            for dims in [
                (2, 8, 64, 77, 160),
                (4, 4, 256, 260, 32),
                (1, 2, 1, 300, 64),
                (2, 20, 1024, 1024, 64),
            ] {
                push(dims, Mask::None, None, Layout::Contiguous);
                push(dims, Mask::KeyPadding, Some(2), Layout::Contiguous);
            }
            // Strided and unaligned inputs (the cp.async path and the element-by-element one),
            // with keys split so that the split CTAs' base offsets are exercised too.
            for layout in [Layout::Transposed, Layout::Offset] {
                for d in [40, 64, 512] {
                    push((2, 3, 77, 131, d), Mask::Additive, Some(3), layout);
                }
            }
            push((1, 1, 4096, 4096, 512), Mask::None, None, Layout::Contiguous);
            if !quick {
                push((1, 1, 4096, 4096, 512), Mask::None, Some(1), Layout::Contiguous);
                push((1, 1, 16384, 16384, 512), Mask::None, None, Layout::Contiguous);
            }
        }
        out
    }

    /// Large finite masks (issue 55) in every variant (the wide kernels at head dim 512),
    /// unsplit and split 3 ways (a split then sees only masked keys of some rows): five batches,
    /// one mask value each, 70 queries, 150 keys.
    fn finite_mask_cases(dtype: DType) -> Vec<Case> {
        let (dims, variants): (&[_], &[_]) = match dtype {
            DType::F32 => (&[(5, 2, 70, 150, 64)], &FusedVariant::ALL[..1]),
            _ => (&[(5, 2, 70, 150, 64), (5, 1, 70, 150, 512)], &FusedVariant::ALL),
        };
        let mut out = vec![];
        for &dims in dims {
            for &(_, variant) in variants {
                for pattern in PATTERNS {
                    for splits in [Some(1), Some(3)] {
                        let layout = Layout::Contiguous;
                        out.push(Case {
                            dtype,
                            dims,
                            mask: Mask::Finite(pattern),
                            splits,
                            layout,
                            variant,
                        });
                    }
                }
            }
        }
        out
    }

    /// A finite mask (B, 1, Lq, Lk) in f32 on the CPU: batch b's keys masked by `FINITE[b % 5]`
    /// where `pattern` says.
    fn finite_mask(pattern: Pattern, b: usize, lq: usize, lk: usize) -> Result<Tensor> {
        let pads = |bi: usize| [64, 100, lk, lk - 1, 5][bi % 5].min(lk);
        let m: Vec<f32> = (0..b * lq * lk)
            .map(|x| {
                let (bi, i, j) = (x / (lq * lk), x / lk % lq, x % lk);
                let masked = match pattern {
                    Pattern::FirstTile => j < 64 || i % 5 == 4,
                    Pattern::Causal => j > i,
                    Pattern::LeftPad => j < pads(bi),
                    Pattern::RightPad => j >= lk - pads(bi + 2),
                };
                if masked {
                    FINITE[bi % 5]
                } else {
                    0.0
                }
            })
            .collect();
        Tensor::from_vec(m, (b, 1, lq, lk), &Device::Cpu)
    }

    fn mask_tensor(mask: Mask, b: usize, lq: usize, lk: usize, dev: &Device) -> Result<Option<Tensor>> {
        let neg = f32::NEG_INFINITY;
        Ok(match mask {
            Mask::None => None,
            // (B, 1, Lq, Lk): broadcast over heads.
            Mask::Additive => Some((Tensor::randn(0f32, 1., (b, 1, lq, lk), &Device::Cpu)? * 2.0)?.to_device(dev)?),
            // Every third key masked except key 0 (no row without keys).
            Mask::Boolean => {
                let m: Vec<f32> = (0..lq * lk)
                    .map(|i| if i % lk != 0 && (i * 7) % 3 == 0 { neg } else { 0.0 })
                    .collect();
                Some(Tensor::from_vec(m, (lq, lk), &Device::Cpu)?.to_device(dev)?)
            }
            // (B, 1, 1, Lk): batch i pads its last 5·(i + 1) keys.
            Mask::KeyPadding => {
                let m: Vec<f32> = (0..b * lk)
                    .map(|i| {
                        if i % lk >= lk.saturating_sub(5 * (i / lk + 1)).max(1) {
                            neg
                        } else {
                            0.0
                        }
                    })
                    .collect();
                Some(Tensor::from_vec(m, (b, 1, 1, lk), &Device::Cpu)?.to_device(dev)?)
            }
            Mask::Finite(pattern) => Some(finite_mask(pattern, b, lq, lk)?.to_device(dev)?),
        })
    }

    fn run(c: &Case, dev: &Device) -> Result<serde_json::Value> {
        let (b, h, lq, lk, d) = c.dims;
        let r = |l: usize| -> Result<Tensor> {
            let on_dev = |shape: (usize, usize, usize, usize)| -> Result<Tensor> {
                Tensor::randn(0f32, 1., shape, &Device::Cpu)?
                    .to_device(dev)?
                    .to_dtype(c.dtype)
            };
            match c.layout {
                Layout::Contiguous => on_dev((b, h, l, d)),
                Layout::Transposed => on_dev((b, l, h, d))?.transpose(1, 2),
                Layout::Offset => on_dev((b, h, l, d + 1))?.narrow(3, 1, d),
            }
        };
        let (q, k, v) = (r(lq)?, r(lk)?, r(lk)?);
        // Finite masks stay f32 (finfo(f32).min and −1e10 are −∞ in f16; −1e9 too).
        let mask = match c.mask {
            Mask::Finite(_) => mask_tensor(c.mask, b, lq, lk, dev)?,
            _ => mask_tensor(c.mask, b, lq, lk, dev)?
                .map(|m| m.to_dtype(c.dtype))
                .transpose()?,
        };
        let scale = default_scale(d);
        let opts = FusedOptions {
            splits: c.splits,
            variant: Some(c.variant),
        };
        let Some(got) = fused_sdpa(&q, &k, &v, mask.as_ref(), scale, opts)? else {
            candle_core::bail!("the fused kernel declined this case")
        };
        let want = sdpa_with(SdpaPath::Chunked, &q, &k, &v, mask.as_ref(), scale)?;
        let (max_abs, rel, finite, max_want) = compare(&got, &want)?;
        let (tol, rel_tol) = tolerances(c.dtype);
        let mut pass = finite && max_abs <= tol && rel <= rel_tol;
        let mut line = serde_json::json!({
            "max_abs": max_abs, "tol": tol, "max_want": max_want, "rel": rel, "rel_tol": rel_tol,
            "finite": finite,
        });
        if let Mask::Finite(_) = c.mask {
            // The chunked path on the GPU against the CPU's (one key block of 150: the same
            // arithmetic), so that the comparison above is against a checked reference.
            let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
            let (qc, kc, vc) = (cpu(&q)?, cpu(&k)?, cpu(&v)?);
            let mc = mask.as_ref().map(cpu).transpose()?;
            let on_cpu = sdpa_with(SdpaPath::Chunked, &qc, &kc, &vc, mc.as_ref(), scale)?;
            let (cpu_abs, cpu_rel, chunked_finite, _) = compare(&want.to_device(&Device::Cpu)?, &on_cpu)?;
            pass &= chunked_finite && cpu_abs <= tol && cpu_rel <= rel_tol;
            line["chunked_vs_cpu_max_abs"] = cpu_abs.into();
            line["chunked_vs_cpu_rel"] = cpu_rel.into();
        }
        line["pass"] = pass.into();
        let fused_ms = median_ms(dev, || {
            Ok(fused_sdpa(&q, &k, &v, mask.as_ref(), scale, opts)?.expect("ran above"))
        })?;
        let chunked_ms = median_ms(dev, || sdpa_with(SdpaPath::Chunked, &q, &k, &v, mask.as_ref(), scale))?;
        let flops = 4.0 * (b * h * lq * lk * d) as f64;
        line["fused_ms"] = fused_ms.into();
        line["chunked_ms"] = chunked_ms.into();
        line["fused_tflops"] = (flops / fused_ms / 1e9).into();
        Ok(line)
    }

    /// `(max_abs, rel, finite, max|want|)` of `got` against `want`: the largest difference, it
    /// over the largest |want|, and whether every element of `got` is finite.
    fn compare(got: &Tensor, want: &Tensor) -> Result<(f64, f64, bool, f64)> {
        let (got, want) = (got.to_dtype(DType::F32)?, want.to_dtype(DType::F32)?);
        let max_abs = (&got - &want)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
        let finite = got.flatten_all()?.to_vec1::<f32>()?.iter().all(|x| x.is_finite());
        let max_want = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
        Ok((max_abs, max_abs / max_want.max(f64::MIN_POSITIVE), finite, max_want))
    }

    /// `(max_abs, rel)` bounds of a dtype. The absolute tolerance alone is loose where the
    /// outputs are small: at 4096 – 16384 keys they are of order 0.03 – 0.1, and a kernel that
    /// loses a whole key tile (a split or tile-boundary bug) moves them by only 4e-3 – 2.4e-2,
    /// which 5e-3 (f16) and 4e-2 (bf16) let pass. So the error is also bounded relative to the
    /// largest output. A simulation of both paths' roundings (online softmax on key tiles, p
    /// rounded relative to the running vs the final max, output rounded) gives
    /// max_abs / max|want| up to 6e-4 (f16) and 4.5e-3 (bf16) on these shapes; losing one tile
    /// of 32 keys out of 16384 gives 8e-2 (f16) and 7e-2 (bf16). f32: about 1e-6 in the same
    /// simulation.
    fn tolerances(dtype: DType) -> (f64, f64) {
        match dtype {
            DType::F32 => (5e-5, 2e-5),
            DType::F16 => (5e-3, 4e-3),
            _ => (4e-2, 2.5e-2),
        }
    }

    /// The first fused call of the process on a small f16 shape, loading the kernels included.
    fn first_fused_call(dev: &Device) -> serde_json::Value {
        let inputs = (|| -> Result<(Tensor, Tensor, Tensor)> {
            let r = || Tensor::randn(0f32, 1., (1, 2, 100, 64), dev)?.to_dtype(DType::F16);
            let qkv = (r()?, r()?, r()?);
            dev.synchronize()?;
            Ok(qkv)
        })();
        let image = match dev {
            Device::Cuda(d) => kernel_image(d),
            _ => Ok("not a CUDA device".to_string()),
        };
        first_call("fused", dev, image, || {
            let (q, k, v) = inputs?;
            fused_sdpa(&q, &k, &v, None, default_scale(64), FusedOptions::default())
        })
    }

    pub fn main() -> i32 {
        let mut report = match Report::from_args("fused_check") {
            Ok(r) => r,
            Err(code) => return code,
        };
        let dev = match report.cuda_device() {
            Ok(d) => d,
            Err(code) => return code,
        };
        if !kernel_built() {
            eprintln!("fused_check: this build has no fused kernel");
            return 3;
        }
        report.record(first_fused_call(&dev));
        for c in cases(report.quick) {
            let (b, h, lq, lk, d) = c.dims;
            let line = serde_json::json!({
                "stage": "fused", "dtype": format!("{:?}", c.dtype).to_lowercase(), "b": b, "h": h, "lq": lq,
                "lk": lk, "d": d, "mask": format!("{:?}", c.mask).to_lowercase(), "splits": c.splits,
                "layout": format!("{:?}", c.layout).to_lowercase(), "variant": c.variant.name(),
            });
            report.record(Report::merged(line, run(&c, &dev)));
        }
        report.finish("fused")
    }
}

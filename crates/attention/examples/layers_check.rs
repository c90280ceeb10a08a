//! The fused CUDA layers (`unet_attention::cuda::{group_norm, gated, epilogue}`,
//! `kernels/fused_layers.cu`) and the native half-precision products (`Projection`,
//! `ops::matmul` on CUDA) against references on the CPU: the GPU kit's `layers` stage
//! (`scripts/gpu_kit/run.sh layers`).
//!
//! ```text
//! cargo run --release -p unet-attention --features cuda --example layers_check -- [--out FILE] [--quick]
//! ```
//!
//! Cases: GroupNorm (32 groups, C 64 – 1280, spatial 1×1 – 128×128 and a partial last chunk,
//! inputs with a mean per channel, with and without the pre-add, no swish (eps 1), `F.silu` and
//! ldm's `y * sigmoid(y)` (eps 1e-6)); LayerNorm (n 320 – 1280 and an odd 333, with and
//! without the affine); GEGLU and SwiGLU gates (n 320 – 5120,
//! odd n too); the epilogue in token and channel layout with each optional part; `Projection`
//! (tokens with the bias inside cuBLAS's sum, strided tokens and channels) and `ops::matmul` in half precision on CUDA (cuBLAS, no f32 copies)
//! against the same calls on the CPU (f32 products, one rounding). Every case in f32, f16 and
//! bf16. The kernels' references are computed in f64 on the CPU from the same stored inputs,
//! rounded to the dtype at every point where PyTorch's separate ops round.
//!
//! **Tolerance** (fixed before any GPU run): `|got − want| ≤ k·ε·(|want| + a)` element-wise, ε
//! the dtype's machine epsilon (2⁻²³, 2⁻¹⁰, 2⁻⁷). Half: k = 4, a = 1/64 — each rounding may
//! land one unit in the last place (≤ ε·|v|) away from the reference's where the f32 value
//! sits next to a rounding boundary, at most two roundings chain (norm then swish, activation
//! then product, product then bias), and `a` covers f32 errors of the statistics near zero
//! (≈ 1e-6, below ε/64) and subnormals. f32: k = 64, a = 1 — f32 statistics over up to 262 144
//! elements, `expf`/`erff` within a few ulp. The products (GPU half against CPU f32, outputs of
//! order 1): k = 4, a = 1 (sums of up to 1,280 products in another order; the strided and
//! channel forms round the product before adding the bias, on both sides). Each case writes one JSON line (to `--out`,
//! default stdout): the case, `max_abs`, `worst` (largest |got − want| / tol, pass when ≤ 1),
//! `pass`, `fused_ms` (median of 5 synchronised calls). Exit 0: every case passed (also: built
//! without the `cuda` feature, after one line saying so); 1: some failed; 3: no CUDA device or
//! no kernels in this build.

#[cfg(feature = "cuda")]
fn main() {
    std::process::exit(gpu::main())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("layers_check: built without the `cuda` feature, nothing to check");
}

#[cfg(feature = "cuda")]
#[path = "support/gpu_check.rs"]
mod gpu_check;

#[cfg(feature = "cuda")]
mod gpu {
    use super::gpu_check::{first_call, median_ms, Report};
    use candle_core::{DType, Device, Result, Tensor};
    use unet_attention::cuda::{
        epilogue, gated, group_norm, layer_norm, layers_built, layers_image, BiasAxis, GateAct, NormAct,
    };

    /// A seeded xorshift generator: N(0, 1) samples by Box–Muller.
    struct Rng(u64);

    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f32 {
            let (u, v) = (self.uniform(), self.uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        }
    }

    /// A random tensor `scale·N(0,1) + shift` in `dtype` on `dev`, and its stored values as f64.
    fn random(
        rng: &mut Rng,
        dims: &[usize],
        dtype: DType,
        scale: f32,
        shift: f32,
        dev: &Device,
    ) -> Result<(Tensor, Vec<f64>)> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.normal() * scale + shift).collect();
        let t = Tensor::from_vec(v, dims, &Device::Cpu)?.to_dtype(dtype)?;
        let stored = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        Ok((t.to_device(dev)?, stored))
    }

    /// A GroupNorm input `(b, c, s...)`: `2·N(0,1) + 0.5` plus an offset per channel
    /// (`1.5·N(0,1)`), as feature maps have. With i.i.d. values every chunk of a split group has
    /// the same mean, and a `gn_finalize` that dropped or mis-weighted Chan's `δ²·n_a·n_b/n` term
    /// passed the bf16 cases (worst 0.3 in a numpy model of the kernel); with the offsets it fails
    /// every dtype by orders of magnitude.
    fn random_channels(rng: &mut Rng, dims: &[usize], dtype: DType, dev: &Device) -> Result<(Tensor, Vec<f64>)> {
        let (c, s) = (dims[1], dims[2..].iter().product::<usize>());
        let offsets: Vec<f32> = (0..c).map(|_| 1.5 * rng.normal()).collect();
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| rng.normal() * 2.0 + 0.5 + offsets[(i / s) % c])
            .collect();
        let t = Tensor::from_vec(v, dims, &Device::Cpu)?.to_dtype(dtype)?;
        let stored = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        Ok((t.to_device(dev)?, stored))
    }

    /// `v` rounded to `dtype` (to nearest, ties to even).
    fn round(v: f64, dtype: DType) -> f64 {
        match dtype {
            DType::F16 => half::f16::from_f64(v).to_f64(),
            DType::BF16 => half::bf16::from_f64(v).to_f64(),
            DType::F32 => v as f32 as f64,
            _ => v,
        }
    }

    fn tolerance(dtype: DType) -> (f64, f64) {
        match dtype {
            DType::F16 => (4.0 * 2f64.powi(-10), 1.0 / 64.0),
            DType::BF16 => (4.0 * 2f64.powi(-7), 1.0 / 64.0),
            _ => (64.0 * 2f64.powi(-23), 1.0),
        }
    }

    /// `(max_abs, worst)` of `got` against `want` (worst > 1: outside the tolerance; NaN counts).
    fn compare(got: &Tensor, want: &[f64], dtype: DType) -> Result<(f64, f64)> {
        compare_with(got, want, tolerance(dtype))
    }

    fn compare_with(got: &Tensor, want: &[f64], (k, a): (f64, f64)) -> Result<(f64, f64)> {
        let got = got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        if got.len() != want.len() {
            candle_core::bail!("{} values, expected {}", got.len(), want.len())
        }
        let (mut max_abs, mut worst) = (0f64, 0f64);
        for (g, w) in got.iter().zip(want) {
            let d = (g - w).abs();
            let d = if d.is_nan() { f64::INFINITY } else { d };
            max_abs = max_abs.max(d);
            worst = worst.max(d / (k * (w.abs() + a)));
        }
        Ok((max_abs, worst))
    }

    fn sigmoid(y: f64) -> f64 {
        1.0 / (1.0 + (-y).exp())
    }

    /// The GroupNorm reference: f64 statistics of the (rounded) sum, the affine rounded, the
    /// swish from the rounded value and rounded (ldm's form: the sigmoid rounded first).
    fn group_norm_ref(
        x: &[f64],
        add: Option<&[f64]>,
        (b, c, s): (usize, usize, usize),
        gamma: &[f64],
        beta: &[f64],
        (act, eps): (Option<NormAct>, f64),
        dtype: DType,
    ) -> Vec<f64> {
        let groups = 32;
        let cpg = c / groups;
        let mut out = vec![0.0; x.len()];
        for bg in 0..b * groups {
            let (bi, g) = (bg / groups, bg % groups);
            let base = bg * cpg * s;
            let val = |e: usize| match add {
                Some(a) => round(x[base + e] + a[bi * c + g * cpg + e / s], dtype),
                None => x[base + e],
            };
            let n = cpg * s;
            let mean = (0..n).map(val).sum::<f64>() / n as f64;
            let var = (0..n).map(|e| (val(e) - mean).powi(2)).sum::<f64>() / n as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            for e in 0..n {
                let ch = g * cpg + e / s;
                let y = round((val(e) - mean) * rstd * gamma[ch] + beta[ch], dtype);
                out[base + e] = match act {
                    None => y,
                    Some(NormAct::Silu) => round(y / (1.0 + (-y).exp()), dtype),
                    Some(NormAct::TimesSigmoid) => round(y * round(sigmoid(y), dtype), dtype),
                };
            }
        }
        out
    }

    fn json_case(kernel: &str, dtype: DType, extra: serde_json::Value) -> serde_json::Value {
        let mut line =
            serde_json::json!({"stage": "layers", "kernel": kernel, "dtype": format!("{dtype:?}").to_lowercase()});
        line.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        line
    }

    fn outcome(line: &mut serde_json::Value, (max_abs, worst): (f64, f64), ms: f64) {
        line["max_abs"] = max_abs.into();
        line["worst"] = worst.into();
        line["pass"] = (worst <= 1.0).into();
        line["fused_ms"] = ms.into();
    }

    fn group_norm_cases(
        quick: bool,
        dev: &Device,
        rng: &mut Rng,
        emit: &mut dyn FnMut(Result<serde_json::Value>, serde_json::Value),
    ) {
        let shapes: &[(usize, usize)] = if quick {
            &[(64, 1), (320, 8), (512, 128)]
        } else {
            &[
                (64, 1),
                (96, 7),
                (320, 8),
                (128, 128),
                (640, 64),
                (1280, 16),
                (512, 128),
                // 18 818 elements a group: 10 chunks of 1882, the last 1880 (a partial chunk).
                (64, 97),
            ]
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &(c, hw) in shapes {
                for with_add in [false, true] {
                    for act in [None, Some(NormAct::Silu), Some(NormAct::TimesSigmoid)] {
                        // eps 1 without an activation: with 1e-6 against a variance of about 6,
                        // an eps lost or misplaced on the way (argument order, outside the sqrt)
                        // would pass; 1 moves rstd by about 8 %.
                        let eps = if act.is_none() { 1.0 } else { 1e-6 };
                        let info = serde_json::json!({"c": c, "h": hw, "w": hw, "b": 2, "add": with_add, "act": format!("{act:?}"), "eps": eps});
                        let mut line = json_case("group_norm", dtype, info);
                        let r = (|| -> Result<serde_json::Value> {
                            let (b, s) = (2, hw * hw);
                            let (x, xs) = random_channels(rng, &[b, c, hw, hw], dtype, dev)?;
                            let (add, adds) = random(rng, &[b, c], dtype, 1.0, 0.0, dev)?;
                            let (gamma, gs) = random(rng, &[c], DType::F32, 0.3, 1.0, dev)?;
                            let (beta, bs) = random(rng, &[c], DType::F32, 0.3, 0.0, dev)?;
                            let add = with_add.then_some(&add);
                            let run = || group_norm(&x, add, &gamma, &beta, 32, eps, act);
                            let Some(got) = run()? else {
                                candle_core::bail!("the kernel declined this case")
                            };
                            let want = group_norm_ref(
                                &xs,
                                with_add.then_some(&adds[..]),
                                (b, c, s),
                                &gs,
                                &bs,
                                (act, eps),
                                dtype,
                            );
                            let ms = median_ms(dev, || Ok(run()?.expect("ran above")))?;
                            outcome(&mut line, compare(&got, &want, dtype)?, ms);
                            Ok(line.clone())
                        })();
                        emit(r, line);
                    }
                }
            }
        }
    }

    /// `nn.LayerNorm` over token rows of SD / SDXL widths (and an odd one), with and without the
    /// affine, against f64 statistics of the stored inputs rounded once.
    fn layer_norm_cases(
        quick: bool,
        dev: &Device,
        rng: &mut Rng,
        emit: &mut dyn FnMut(Result<serde_json::Value>, serde_json::Value),
    ) {
        let ns: &[usize] = if quick { &[320] } else { &[320, 333, 640, 1280] };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &n in ns {
                for affine in [true, false] {
                    let rows = 4096;
                    let mut line = json_case(
                        "layer_norm",
                        dtype,
                        serde_json::json!({"rows": rows, "n": n, "affine": affine}),
                    );
                    let r = (|| -> Result<serde_json::Value> {
                        let (x, xs) = random(rng, &[2, rows / 2, n], dtype, 1.5, 2.0, dev)?;
                        let (w, ws) = random(rng, &[n], DType::F32, 1.0, 1.0, dev)?;
                        let (b, bs) = random(rng, &[n], DType::F32, 0.5, 0.0, dev)?;
                        let pair = affine.then_some((&w, &b));
                        let Some(got) = layer_norm(&x, pair, 1e-5)? else {
                            candle_core::bail!("the kernel declined this case")
                        };
                        let mut want = Vec::with_capacity(rows * n);
                        for row in xs.chunks(n) {
                            let mean = row.iter().sum::<f64>() / n as f64;
                            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                            let rstd = 1.0 / (var + 1e-5).sqrt();
                            for (j, v) in row.iter().enumerate() {
                                let y = (v - mean) * rstd;
                                want.push(round(if affine { y * ws[j] + bs[j] } else { y }, dtype));
                            }
                        }
                        let ms = median_ms(dev, || Ok(layer_norm(&x, pair, 1e-5)?.expect("ran above")))?;
                        outcome(&mut line, compare(&got, &want, dtype)?, ms);
                        Ok(line.clone())
                    })();
                    emit(r, line);
                }
            }
        }
    }

    fn gated_cases(
        quick: bool,
        dev: &Device,
        rng: &mut Rng,
        emit: &mut dyn FnMut(Result<serde_json::Value>, serde_json::Value),
    ) {
        let ns: &[usize] = if quick {
            &[320, 1280]
        } else {
            &[320, 333, 640, 1280, 2560, 5120]
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &n in ns {
                for act in [GateAct::Gelu, GateAct::Silu] {
                    let rows = if n >= 2560 { 1024 } else { 4096 };
                    let mut line = json_case(
                        "gated",
                        dtype,
                        serde_json::json!({"rows": rows, "n": n, "act": format!("{act:?}")}),
                    );
                    let r = (|| -> Result<serde_json::Value> {
                        let (h, hs) = random(rng, &[2, rows / 2, 2 * n], dtype, 1.5, 0.0, dev)?;
                        let Some(got) = gated(&h, act)? else {
                            candle_core::bail!("the kernel declined this case")
                        };
                        let want: Vec<f64> = (0..rows * n)
                            .map(|i| {
                                let (r, j) = (i / n, i % n);
                                let (x, g) = (hs[r * 2 * n + j], hs[r * 2 * n + n + j]);
                                let a = match act {
                                    GateAct::Gelu => g * 0.5 * (1.0 + libm::erf(g * std::f64::consts::FRAC_1_SQRT_2)),
                                    GateAct::Silu => g * sigmoid(g),
                                };
                                round(x * round(a, dtype), dtype)
                            })
                            .collect();
                        let ms = median_ms(dev, || Ok(gated(&h, act)?.expect("ran above")))?;
                        outcome(&mut line, compare(&got, &want, dtype)?, ms);
                        Ok(line.clone())
                    })();
                    emit(r, line);
                }
            }
        }
    }

    fn epilogue_cases(
        quick: bool,
        dev: &Device,
        rng: &mut Rng,
        emit: &mut dyn FnMut(Result<serde_json::Value>, serde_json::Value),
    ) {
        let parts: &[(bool, bool, Option<f64>)] = &[
            (true, false, None),
            (false, true, None),
            (false, false, Some(3.0)),
            (true, true, None),
            (true, true, Some(0.7)),
        ];
        let cs: &[usize] = if quick { &[320] } else { &[320, 640, 1280] };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &c in cs {
                for axis in [BiasAxis::Last, BiasAxis::Channels] {
                    for &(with_bias, with_res, div) in parts {
                        let info = serde_json::json!({"c": c, "axis": format!("{axis:?}"), "bias": with_bias, "residual": with_res, "div": div});
                        let mut line = json_case("epilogue", dtype, info);
                        let r = (|| -> Result<serde_json::Value> {
                            let dims: Vec<usize> = match axis {
                                BiasAxis::Last => vec![2, 1024, c],
                                BiasAxis::Channels => vec![2, c, 32, 32],
                            };
                            let inner = if axis == BiasAxis::Last { 1 } else { 1024 };
                            let (h, hs) = random(rng, &dims, dtype, 3.0, 0.0, dev)?;
                            let (bias, bs) = random(rng, &[c], dtype, 1.0, 0.0, dev)?;
                            let (res, rs) = random(rng, &dims, dtype, 1.0, 0.0, dev)?;
                            let run =
                                || epilogue(&h, with_bias.then_some((&bias, axis)), with_res.then_some(&res), div);
                            let Some(got) = run()? else {
                                candle_core::bail!("the kernel declined this case")
                            };
                            let want: Vec<f64> = (0..hs.len())
                                .map(|i| {
                                    let mut v = hs[i];
                                    if with_bias {
                                        v = round(v + bs[(i / inner) % c], dtype);
                                    }
                                    if with_res {
                                        v = round(v + rs[i], dtype);
                                    }
                                    match div {
                                        Some(d) => round(v / (d as f32 as f64), dtype),
                                        None => v,
                                    }
                                })
                                .collect();
                            let ms = median_ms(dev, || Ok(run()?.expect("ran above")))?;
                            outcome(&mut line, compare(&got, &want, dtype)?, ms);
                            Ok(line.clone())
                        })();
                        emit(r, line);
                    }
                }
            }
        }
    }

    /// `Projection` (tokens, channels) and `ops::matmul` in half precision on CUDA against the
    /// same calls on the CPU (f32 products rounded once).
    fn product_cases(
        quick: bool,
        dev: &Device,
        rng: &mut Rng,
        emit: &mut dyn FnMut(Result<serde_json::Value>, serde_json::Value),
    ) {
        use candle_nn::VarBuilder;
        use std::collections::HashMap;
        use unet_attention::layers::Projection;
        let dims: &[(usize, usize, usize)] = if quick {
            &[(77, 320, 640)]
        } else {
            &[(77, 320, 640), (1024, 1280, 1280), (4096, 512, 512)]
        };
        for dtype in [DType::F16, DType::BF16] {
            for &(n, cin, cout) in dims {
                let mut line = json_case("projection", dtype, serde_json::json!({"n": n, "in": cin, "out": cout}));
                let r = (|| -> Result<serde_json::Value> {
                    let (w, _) = random(rng, &[cout, cin], dtype, 0.02, 0.0, &Device::Cpu)?;
                    let (b, _) = random(rng, &[cout], dtype, 0.5, 0.0, &Device::Cpu)?;
                    let load = |d: &Device| -> Result<Projection> {
                        let ts = HashMap::from([
                            ("p.weight".to_string(), w.to_device(d)?),
                            ("p.bias".to_string(), b.to_device(d)?),
                        ]);
                        let vb = VarBuilder::from_tensors(ts, dtype, d);
                        Projection::load(vb.pp("p"), "layers_check", cin, cout, true).map_err(candle_core::Error::wrap)
                    };
                    let (gpu, cpu) = (load(dev)?, load(&Device::Cpu)?);
                    let (x, _) = random(rng, &[2, n, cin], dtype, 1.0, 0.0, &Device::Cpu)?;
                    let xg = x.to_device(dev)?;
                    // Off the native path the GPU would run the f32 copies the CPU runs and pass
                    // without testing the half products at all.
                    if !unet_attention::ops::native_half(&xg) {
                        candle_core::bail!("the native half products are off for this input")
                    }
                    let want = cpu
                        .forward_tokens(&x)?
                        .to_dtype(DType::F64)?
                        .flatten_all()?
                        .to_vec1::<f64>()?;
                    // cuBLAS with the bias in its f32 sum (`cuda::linear_with_bias`), rounded
                    // once as the CPU's.
                    let got = gpu.forward_tokens(&xg)?;
                    // Outputs of order 1 from sums of `cin` products: a = 1 (the sums' order
                    // differs; the strided and channel forms round the product, then the sum
                    // with the bias, on both sides).
                    let tol = (tolerance(dtype).0, 1.0);
                    let tokens = compare_with(&got, &want, tol)?;
                    let xc = x.transpose(1, 2)?.contiguous()?;
                    // The same tokens as a strided view: `matmul`, then the bias (two roundings).
                    let xs = xc.transpose(1, 2)?;
                    let want_s = cpu
                        .forward_tokens_strided(&xs)?
                        .to_dtype(DType::F64)?
                        .flatten_all()?
                        .to_vec1::<f64>()?;
                    let got_s = gpu.forward_tokens_strided(&xc.to_device(dev)?.transpose(1, 2)?)?;
                    let strided = compare_with(&got_s, &want_s, tol)?;
                    let want_c = cpu
                        .forward_channels(&xc)?
                        .to_dtype(DType::F64)?
                        .flatten_all()?
                        .to_vec1::<f64>()?;
                    let got_c = gpu.forward_channels(&xc.to_device(dev)?)?;
                    let channels = compare_with(&got_c, &want_c, tol)?;
                    let (k, _) = random(rng, &[2, 8, n.min(512), cin / 8], dtype, 0.3, 0.0, &Device::Cpu)?;
                    let kt = k.transpose(2, 3)?;
                    let want_m = unet_attention::ops::matmul(&k, &kt)?
                        .to_dtype(DType::F64)?
                        .flatten_all()?
                        .to_vec1::<f64>()?;
                    let got_m = unet_attention::ops::matmul(&k.to_device(dev)?, &kt.to_device(dev)?)?;
                    let matmul = compare_with(&got_m, &want_m, tol)?;
                    let worst = tokens.1.max(strided.1).max(channels.1).max(matmul.1);
                    let max_abs = tokens.0.max(strided.0).max(channels.0).max(matmul.0);
                    line["worst_tokens"] = tokens.1.into();
                    line["worst_strided"] = strided.1.into();
                    line["worst_channels"] = channels.1.into();
                    line["worst_matmul"] = matmul.1.into();
                    let ms = median_ms(dev, || gpu.forward_tokens(&xg))?;
                    outcome(&mut line, (max_abs, worst), ms);
                    Ok(line.clone())
                })();
                emit(r, line);
            }
        }
    }

    /// The first layer-kernel call of the process (a GroupNorm in f16), loading the kernels included.
    fn first_layers_call(dev: &Device) -> serde_json::Value {
        let inputs = (|| -> Result<(Tensor, Tensor, Tensor)> {
            let x = Tensor::randn(0f32, 1., (1, 64, 8, 8), dev)?.to_dtype(DType::F16)?;
            let (gamma, beta) = (Tensor::ones(64, DType::F32, dev)?, Tensor::zeros(64, DType::F32, dev)?);
            dev.synchronize()?;
            Ok((x, gamma, beta))
        })();
        let image = match dev {
            Device::Cuda(d) => layers_image(d),
            _ => Ok("not a CUDA device".to_string()),
        };
        first_call("layers", dev, image, || {
            let (x, gamma, beta) = inputs?;
            group_norm(&x, None, &gamma, &beta, 32, 1e-5, None)
        })
    }

    pub fn main() -> i32 {
        let mut report = match Report::from_args("layers_check") {
            Ok(r) => r,
            Err(code) => return code,
        };
        let dev = match report.cuda_device() {
            Ok(d) => d,
            Err(code) => return code,
        };
        if !layers_built() {
            eprintln!("layers_check: this build has no layer kernels");
            return 3;
        }
        if let Err(code) = report.require_cuda_layers() {
            return code;
        }
        report.record(first_layers_call(&dev));
        let quick = report.quick;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // A case's result is its whole line; an error keeps the case's description.
        let mut emit = |r: Result<serde_json::Value>, line: serde_json::Value| {
            report.record(match r {
                Ok(v) => v,
                Err(e) => Report::merged(line, Err(e)),
            })
        };
        group_norm_cases(quick, &dev, &mut rng, &mut emit);
        layer_norm_cases(quick, &dev, &mut rng, &mut emit);
        gated_cases(quick, &dev, &mut rng, &mut emit);
        epilogue_cases(quick, &dev, &mut rng, &mut emit);
        product_cases(quick, &dev, &mut rng, &mut emit);
        report.finish("layers")
    }
}

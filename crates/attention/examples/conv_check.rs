//! This crate's cuDNN convolution (`unet_attention::cuda::conv`) and the `Conv2d` layer on it,
//! on a GPU, against an f64 CPU reference: the GPU kit's `conv` stage
//! (`scripts/gpu_kit/run.sh conv`).
//!
//! ```text
//! cargo run --release -p unet-attention --features cudnn --example conv_check -- [--out FILE] [--quick]
//! ```
//!
//! Cases: fixed shapes from the mid blocks (3 input channels, 320 – 1280 channels at 8×8, a 1×1
//! image under a 3×3 kernel, 64×64 images, 1×1 shortcuts) and random ones (kernel 1×1 or 3×3,
//! channels 3 – 1280, batch 1 – 2, images 1×1 – 64×64; fixed seed), each in f32, f16 and bf16,
//! some with a non-contiguous input (a transposed view), with a bias, and with the extras the
//! ResNet blocks fuse (`+ temb[:, :, None, None]`, `residual +`, `/ √2`). Inputs N(0, 1), the
//! weight scaled by `1/√K` (K = in channels × kernel area, the reduction length), all rounded to
//! the dtype first; the reference is f64 on the CPU from those rounded values. Then the video
//! blocks' frame convolution, a (3, 1) filter with padding (1, 0), straight on `cudnn_conv2d`
//! (`frame_conv` lines).
//!
//! **Tolerance**, per output element, from the dtype's unit roundoff `u` (2⁻²⁴ f32, 2⁻¹¹ f16,
//! 2⁻⁸ bf16), the compute type's `u_c` (2⁻²⁴: f32 accumulation for every dtype here), the
//! reduction length `K`, `S = Σ|x·w|` over the element's window (the f64 conv of `|x|` and `|w|`)
//! and `B = (S + |bias| + |temb| + |residual|) / div`:
//!
//! ```text
//! tol = 8·√K·u_c·S / div  +  r·u·B  +  r·(the dtype's smallest normal)
//! ```
//!
//! The first term bounds the accumulation error of a K-term f32 sum in any order (worst case
//! `K·u_c·S`; `√K` is the usual statistical bound for random signs, ×8 for the algorithms' own
//! orders, Winograd and FFT included); the second the `r` roundings to the dtype (the
//! convolution's output, then each of bias, temb, residual and div applied, as PyTorch's separate
//! ops round). Strict f32 must fit it; TF32 (rounding inputs to 10 mantissa bits, error about
//! 2⁻¹¹·√K·|x·w|) does not for short reductions, so its numbers are recorded, not judged: each f32
//! case also runs with the TF32 mode on (`tf32_max_abs`, `tf32_worst_ratio`).
//!
//! Each case writes one JSON line (to `--out`, default stdout): the shape and flags, `cudnn`
//! (whether the cuDNN convolution took the case; it must), `max_abs` and `worst_ratio`
//! (max |ours − f64| / tol; pass ≤ 1) of the layer's output, `max_abs_vs_candle_f32` (against
//! Candle's f32 conv of the same inputs, which under `cudnn` is cuDNN's default math: TF32 on
//! Ampere and later), `ours_ms` and `candle_f32_ms` (median of 5 synchronised calls of the
//! convolution alone: the cuDNN convolution, and the old path of f32 copies + Candle's f32 conv +
//! rounding; with `tf32_*` for f32, after the strict run). Then a `plan_cache` line (a
//! repeated shape must hit the algorithm cache) and a summary. Exit 0: every case passed; 1: some
//! failed; 2: usage; 3: no CUDA device, or built without the `cudnn` feature.

#[cfg(feature = "cudnn")]
fn main() {
    std::process::exit(gpu::main())
}

#[cfg(not(feature = "cudnn"))]
fn main() {
    eprintln!("conv_check: built without the `cudnn` feature");
    std::process::exit(3)
}

#[cfg(feature = "cudnn")]
#[path = "support/gpu_check.rs"]
mod gpu_check;

#[cfg(feature = "cudnn")]
mod gpu {
    use super::gpu_check::{median_ms, Report};
    use candle_core::{DType, Device, Result, Tensor};
    use candle_nn::VarBuilder;
    use std::collections::HashMap;
    use unet_attention::cpu_kernels::ConvExtras;
    use unet_attention::cuda::conv::{cudnn_conv2d, plan_cache_stats};
    use unet_attention::cuda::set_tf32;
    use unet_attention::layers::Conv2d;

    #[derive(Clone, Copy, Debug)]
    struct Case {
        b: usize,
        cin: usize,
        cout: usize,
        k: usize,
        h: usize,
        w: usize,
        noncontig: bool,
        bias: bool,
        extras: bool,
    }

    impl Case {
        fn macs(&self) -> usize {
            self.b * self.cout * self.h * self.w * self.cin * self.k * self.k
        }
    }

    /// xorshift64*: the cases and the data, reproducible without a crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn uniform(&mut self) -> f64 {
            ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f32 {
            let (u, v) = (self.uniform(), self.uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        }
        fn tensor(&mut self, dims: &[usize], scale: f32) -> Result<Tensor> {
            let n = dims.iter().product();
            let v: Vec<f32> = (0..n).map(|_| self.normal() * scale).collect();
            Tensor::from_vec(v, dims, &Device::Cpu)
        }
    }

    /// The reference's MAC budget per case (two f64 convolutions on the CPU).
    const MAX_MACS: usize = 1_500_000_000;

    fn cases(quick: bool) -> Vec<Case> {
        let c = |b, cin, cout, k, h, w, noncontig, extras| Case {
            b,
            cin,
            cout,
            k,
            h,
            w,
            noncontig,
            bias: true,
            extras,
        };
        let mut out = vec![
            c(1, 3, 32, 3, 16, 16, false, false),
            c(2, 320, 320, 3, 8, 8, false, true),
            c(1, 1280, 1280, 3, 8, 8, true, true),
            c(2, 1280, 1280, 1, 8, 8, false, false),
            c(1, 640, 1280, 1, 16, 16, true, false),
            c(2, 64, 64, 3, 64, 64, false, true),
            c(1, 4, 8, 3, 1, 1, false, false),
            Case {
                bias: false,
                ..c(2, 512, 512, 3, 16, 16, true, false)
            },
        ];
        let channels = [3, 4, 32, 64, 96, 128, 320, 512, 640, 960, 1280];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for i in 0..if quick { 4 } else { 14 } {
            let mut case = Case {
                b: 1 + rng.below(2),
                cin: channels[rng.below(channels.len())],
                cout: channels[rng.below(channels.len())],
                k: if rng.below(2) == 0 { 1 } else { 3 },
                h: 1 + rng.below(64),
                w: 1 + rng.below(64),
                noncontig: i % 3 == 0,
                bias: i % 4 != 3,
                extras: i % 2 == 1,
            };
            while case.macs() > MAX_MACS {
                (case.h, case.w) = (case.h.div_ceil(2), case.w.div_ceil(2));
            }
            out.push(case);
        }
        out
    }

    /// The case's tensors in f32 on the CPU (not yet rounded to a dtype).
    struct Data {
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        temb: Option<Tensor>,
        residual: Option<Tensor>,
    }

    const DIV: f64 = std::f64::consts::SQRT_2;

    fn data(c: &Case, seed: u64) -> Result<Data> {
        let mut rng = Rng(seed | 1);
        let kk = (c.cin * c.k * c.k) as f32;
        let extra = |rng: &mut Rng, dims: &[usize], on: bool| on.then(|| rng.tensor(dims, 1.0)).transpose();
        Ok(Data {
            x: rng.tensor(&[c.b, c.cin, c.h, c.w], 1.0)?,
            w: rng.tensor(&[c.cout, c.cin, c.k, c.k], 1.0 / kk.sqrt())?,
            bias: extra(&mut rng, &[c.cout], c.bias)?,
            temb: extra(&mut rng, &[c.b, c.cout], c.extras)?,
            residual: extra(&mut rng, &[c.b, c.cout, c.h, c.w], c.extras)?,
        })
    }

    /// `t` rounded to `dtype`, as f64 on the CPU.
    fn rounded64(t: &Tensor, dtype: DType) -> Result<Tensor> {
        t.to_dtype(dtype)?.to_dtype(DType::F64)
    }

    /// The f64 reference of the layer's output and `B`, `S` (see the module docs), as vectors.
    fn reference(c: &Case, d: &Data, dtype: DType) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (x, w) = (rounded64(&d.x, dtype)?, rounded64(&d.w, dtype)?);
        let p = c.k / 2;
        let mut y = x.conv2d(&w, p, 1, 1, 1)?;
        let s = x.abs()?.conv2d(&w.abs()?, p, 1, 1, 1)?;
        let mut mag = s.clone();
        let per_channel = |t: &Tensor, b: bool| -> Result<Tensor> {
            let t = rounded64(t, dtype)?;
            if b {
                t.reshape((1, (), 1, 1))
            } else {
                t.unsqueeze(2)?.unsqueeze(3)
            }
        };
        for (t, is_bias) in [(&d.bias, true), (&d.temb, false)] {
            if let Some(t) = t {
                let t = per_channel(t, is_bias)?;
                y = y.broadcast_add(&t)?;
                mag = mag.broadcast_add(&t.abs()?)?;
            }
        }
        if let Some(r) = &d.residual {
            let r = rounded64(r, dtype)?;
            y = (y + &r)?;
            mag = (mag + r.abs()?)?;
        }
        // The divisor as the layer divides by it: an f32 scalar (`ops::div`).
        let div = if c.extras { DIV as f32 as f64 } else { 1.0 };
        let flat = |t: Tensor| t.affine(1.0 / div, 0.0)?.flatten_all()?.to_vec1::<f64>();
        Ok((flat(y)?, flat(mag)?, flat(s)?))
    }

    /// `(unit roundoff, smallest normal)` of a dtype.
    fn roundoff(dtype: DType) -> (f64, f64) {
        match dtype {
            DType::F16 => (2f64.powi(-11), 2f64.powi(-14)),
            DType::BF16 => (2f64.powi(-8), 2f64.powi(-126)),
            _ => (2f64.powi(-24), 2f64.powi(-126)),
        }
    }

    /// The case's tensors in `dtype` on `dev`; `x` a transposed view when `noncontig`.
    struct OnDevice {
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        temb: Option<Tensor>,
        residual: Option<Tensor>,
    }

    fn on_device(c: &Case, d: &Data, dtype: DType, dev: &Device) -> Result<OnDevice> {
        let put = |t: &Tensor| t.to_dtype(dtype)?.to_device(dev);
        let x = if c.noncontig {
            put(&d.x.transpose(2, 3)?.contiguous()?)?.transpose(2, 3)?
        } else {
            put(&d.x)?
        };
        Ok(OnDevice {
            x,
            w: put(&d.w)?,
            bias: d.bias.as_ref().map(put).transpose()?,
            temb: d.temb.as_ref().map(put).transpose()?,
            residual: d.residual.as_ref().map(put).transpose()?,
        })
    }

    /// The `Conv2d` layer over `t`'s weight and bias, on their device.
    fn layer(c: &Case, t: &OnDevice) -> Result<Conv2d> {
        let mut m = HashMap::from([("weight".to_string(), t.w.clone())]);
        if let Some(b) = &t.bias {
            m.insert("bias".to_string(), b.clone());
        }
        let vb = VarBuilder::from_tensors(m, t.w.dtype(), t.w.device());
        Ok(Conv2d::load(vb, c.cin, c.cout, c.k, c.bias)?)
    }

    fn forward(conv: &Conv2d, c: &Case, t: &OnDevice) -> Result<Tensor> {
        let extras = ConvExtras {
            channel_add: t.temb.as_ref(),
            residual: t.residual.as_ref(),
            div: c.extras.then_some(DIV),
        };
        conv.forward_with(&t.x, extras)
    }

    /// `(max |got − want|, max |got − want| / tol)`.
    fn judge(got: &Tensor, want: &[f64], mag: &[f64], s: &[f64], c: &Case, dtype: DType) -> Result<(f64, f64)> {
        let got = got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let (u, tiny) = roundoff(dtype);
        let kk = (c.cin * c.k * c.k) as f64;
        let r = (1 + usize::from(c.bias) + 3 * usize::from(c.extras)) as f64;
        let (mut max_abs, mut worst) = (0f64, 0f64);
        // `mag` and `s` come from `reference` already divided by the divisor.
        for (((g, w), m), s) in got.iter().zip(want).zip(mag).zip(s) {
            let tol = 8.0 * kk.sqrt() * 2f64.powi(-24) * s + r * (u * m + tiny);
            let e = (g - w).abs();
            let e = if e.is_nan() { f64::INFINITY } else { e };
            max_abs = max_abs.max(e);
            worst = worst.max(e / tol);
        }
        if got.len() != want.len() {
            candle_core::bail!("{} outputs, the reference has {}", got.len(), want.len())
        }
        Ok((max_abs, worst))
    }

    fn run(c: &Case, d: &Data, dtype: DType, dev: &Device) -> Result<serde_json::Value> {
        let t = on_device(c, d, dtype, dev)?;
        let p = c.k / 2;
        let took = cudnn_conv2d(&t.x, &t.w, [p, p])?.is_some();
        let conv = layer(c, &t)?;
        let got = forward(&conv, c, &t)?.to_device(&Device::Cpu)?;
        let (want, mag, s) = reference(c, d, dtype)?;
        let (max_abs, worst) = judge(&got, &want, &mag, &s, c, dtype)?;
        // The old path: f32 copies, Candle's f32 conv, rounded to the dtype (conv alone, no bias).
        let old = || -> Result<Tensor> {
            let w32 = t.w.to_dtype(DType::F32)?;
            t.x.to_dtype(DType::F32)?.conv2d(&w32, p, 1, 1, 1)?.to_dtype(dtype)
        };
        let ours_conv = cudnn_conv2d(&t.x, &t.w, [p, p])?;
        let vs_candle = match &ours_conv {
            Some(y) => Some(
                (y.to_dtype(DType::F32)? - old()?.to_dtype(DType::F32)?)?
                    .abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_scalar::<f32>()? as f64,
            ),
            None => None,
        };
        let ours = || cudnn_conv2d(&t.x, &t.w, [p, p])?.ok_or_else(|| candle_core::Error::msg("declined"));
        let ours_ms = median_ms(dev, ours)?;
        let candle_ms = median_ms(dev, old)?;
        let mut v = serde_json::json!({
            "cudnn": took, "max_abs": max_abs, "worst_ratio": worst, "pass": took && worst <= 1.0,
            "max_abs_vs_candle_f32": vs_candle, "ours_ms": ours_ms, "candle_f32_ms": candle_ms,
        });
        if dtype == DType::F32 {
            set_tf32(true);
            let tf = forward(&conv, c, &t).and_then(|y| y.to_device(&Device::Cpu));
            set_tf32(false);
            let (tf_abs, tf_ratio) = judge(&tf?, &want, &mag, &s, c, dtype)?;
            v["tf32_max_abs"] = tf_abs.into();
            v["tf32_worst_ratio"] = tf_ratio.into();
        }
        Ok(v)
    }

    /// The video blocks' frame convolution (`FrameConv`: `Conv3d` (3, 1, 1) as a (3, 1) filter
    /// with padding (1, 0) on `(B, C, F, H·W)`): the only non-square filter and padding the
    /// crate hands cuDNN, which the square cases above cannot tell from their transposes. The
    /// convolution alone (no bias) against the f64 reference of the zero-padded input; the
    /// tolerance of `judge` with one rounding (`mag` = `S`).
    fn frame_case(
        (b, cin, cout, f, n): (usize, usize, usize, usize, usize),
        dtype: DType,
        dev: &Device,
    ) -> Result<serde_json::Value> {
        let mut rng = Rng(0x5EED ^ (cin * 31 + f) as u64);
        let kk = (cin * 3) as f32;
        let x = rng.tensor(&[b, cin, f, n], 1.0)?;
        let w = rng.tensor(&[cout, cin, 3, 1], 1.0 / kk.sqrt())?;
        let (x64, w64) = (rounded64(&x, dtype)?, rounded64(&w, dtype)?);
        let xp = x64.pad_with_zeros(2, 1, 1)?;
        let flat = |t: Tensor| t.flatten_all()?.to_vec1::<f64>();
        let want = flat(xp.conv2d(&w64, 0, 1, 1, 1)?)?;
        let s = flat(xp.abs()?.conv2d(&w64.abs()?, 0, 1, 1, 1)?)?;
        let (xd, wd) = (x.to_dtype(dtype)?.to_device(dev)?, w.to_dtype(dtype)?.to_device(dev)?);
        let Some(got) = cudnn_conv2d(&xd, &wd, [1, 0])? else {
            return Ok(serde_json::json!({"cudnn": false, "pass": false}));
        };
        if got.dims() != [b, cout, f, n] {
            candle_core::bail!("output {:?}, expected {:?}", got.dims(), [b, cout, f, n])
        }
        let got = got.to_device(&Device::Cpu)?;
        // `judge`'s K is `cin·k·k`: K = 3·cin carried in `cin` with k = 1; one rounding (no
        // bias, no extras).
        let as_case = Case {
            b,
            cin: cin * 3,
            cout,
            k: 1,
            h: f,
            w: n,
            noncontig: false,
            bias: false,
            extras: false,
        };
        let (max_abs, worst) = judge(&got, &want, &s, &s, &as_case, dtype)?;
        Ok(serde_json::json!({"cudnn": true, "max_abs": max_abs, "worst_ratio": worst, "pass": worst <= 1.0}))
    }

    /// A repeated shape must find its algorithm in the cache: one more hit, no more misses.
    fn plan_cache(dev: &Device) -> Result<serde_json::Value> {
        let mut rng = Rng(7);
        let x = rng
            .tensor(&[1, 96, 24, 24], 1.0)?
            .to_dtype(DType::F16)?
            .to_device(dev)?;
        let w = rng
            .tensor(&[96, 96, 3, 3], 0.03)?
            .to_dtype(DType::F16)?
            .to_device(dev)?;
        cudnn_conv2d(&x, &w, [1, 1])?;
        let before = plan_cache_stats();
        let again = cudnn_conv2d(&x, &w, [1, 1])?.is_some();
        let after = plan_cache_stats();
        let pass = again && after.hits == before.hits + 1 && after.misses == before.misses;
        Ok(serde_json::json!({
            "stage": "conv", "check": "plan_cache", "pass": pass, "hits_before": before.hits,
            "hits_after": after.hits, "misses_before": before.misses, "misses_after": after.misses,
        }))
    }

    pub fn main() -> i32 {
        let mut report = match Report::from_args("conv_check") {
            Ok(r) => r,
            Err(code) => return code,
        };
        let dev = match report.cuda_device() {
            Ok(d) => d,
            Err(code) => return code,
        };
        if let Err(code) = report.require_cuda_layers() {
            return code;
        }
        set_tf32(false);
        for (i, c) in cases(report.quick).into_iter().enumerate() {
            let d = match data(&c, 1000 + i as u64) {
                Ok(d) => d,
                Err(e) => {
                    report.record(serde_json::json!({"stage": "conv", "pass": false, "error": e.to_string()}));
                    continue;
                }
            };
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let line = serde_json::json!({
                    "stage": "conv", "dtype": format!("{dtype:?}").to_lowercase(), "b": c.b, "cin": c.cin,
                    "cout": c.cout, "k": c.k, "h": c.h, "w": c.w, "noncontig": c.noncontig, "bias": c.bias,
                    "extras": c.extras,
                });
                report.record(Report::merged(line, run(&c, &d, dtype, &dev)));
            }
        }
        for shape in [(1, 320, 320, 8, 64), (2, 64, 128, 16, 256)] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let (b, cin, cout, f, n) = shape;
                let line = serde_json::json!({
                    "stage": "conv", "check": "frame_conv", "dtype": format!("{dtype:?}").to_lowercase(),
                    "b": b, "cin": cin, "cout": cout, "frames": f, "hw": n,
                });
                report.record(Report::merged(line, frame_case(shape, dtype, &dev)));
            }
        }
        let cache = plan_cache(&dev).unwrap_or_else(
            |e| serde_json::json!({"stage": "conv", "check": "plan_cache", "pass": false, "error": e.to_string()}),
        );
        report.record(cache);
        report.finish("conv")
    }
}

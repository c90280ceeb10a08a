//! The linear layers and convolutions of the blocks on the CPU: weights packed once when a layer
//! is built ([`PackedLinear`], [`PackedConv`]), each call one [`gemm`](super::gemm) with the
//! bias (and a conv's time-embedding add, residual and output divisor) applied as the output is
//! written (large 3×3 convolutions: [`winograd`](super::winograd), 16 such GEMMs). f32 only; the layers in `crate::layers` keep Candle's ops for every other dtype and
//! device, and for every call while [`LayerPath::Candle`] is chosen.
//!
//! [`LayerPath`] picks the implementation per call: the programmatic override
//! ([`set_layer_path`]), else the environment variable `UNET_ATTENTION_LAYERS` (`auto`,
//! `direct`, `winograd` or `candle`, read once), else [`LayerPath::Auto`].

use super::gemm::{self, Bias, Blocking, ColsOf, Epilogue, Held, PackedCols, PackedRows, RowsOf};
use super::{im2col, winograd};
use crate::cpu::isa::{self, Isa};
use crate::cpu::microkernel::avx512;
use crate::cpu::{caches, contiguous, cpu_slice, setting};
use candle_core::{DType, Device, Result, Tensor};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// Which implementation the linear layers and convolutions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerPath {
    /// The packed-weight CPU GEMM for f32 layers on CPUs with AVX2+FMA or AVX-512, Candle's ops
    /// everywhere else.
    Auto,
    /// Candle's ops everywhere (for parity debugging; packed weights are unpacked per call).
    Candle,
    /// The packed-weight GEMM as `Auto`, but every 3×3 convolution computed directly (no
    /// Winograd transform: the summation order of the im2col product).
    Direct,
    /// The packed-weight GEMM as `Auto`, with every 3×3 convolution by Winograd's F(2×2, 3×3),
    /// whatever its size (to test and debug that path on small inputs).
    Winograd,
}

static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Force a path for every later call in this process (`None`: back to `UNET_ATTENTION_LAYERS`
/// or [`LayerPath::Auto`]).
pub fn set_layer_path(path: Option<LayerPath>) {
    let code = match path {
        None => 0,
        Some(LayerPath::Auto) => 1,
        Some(LayerPath::Candle) => 2,
        Some(LayerPath::Direct) => 3,
        Some(LayerPath::Winograd) => 4,
    };
    OVERRIDE.store(code, Ordering::Relaxed);
}

/// The path calls take now. An unparsable `UNET_ATTENTION_LAYERS` (or `UNET_ATTENTION_ISA`, the
/// cap on the vector instructions the kernels use, `UNET_ATTENTION_CACHE`, the cache sizes they
/// block for, or `UNET_ATTENTION_GEMM_TILE`, the AVX-512 GEMM loop) is an error on every call.
pub fn layer_path() -> Result<LayerPath> {
    isa::setting().map_err(candle_core::Error::msg)?;
    caches::setting().map_err(candle_core::Error::msg)?;
    avx512::rows_tile_setting().map_err(candle_core::Error::msg)?;
    match OVERRIDE.load(Ordering::Relaxed) {
        1 => return Ok(LayerPath::Auto),
        2 => return Ok(LayerPath::Candle),
        3 => return Ok(LayerPath::Direct),
        4 => return Ok(LayerPath::Winograd),
        _ => {}
    }
    static ENV: OnceLock<std::result::Result<LayerPath, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let choices = [
            ("auto", LayerPath::Auto),
            ("direct", LayerPath::Direct),
            ("winograd", LayerPath::Winograd),
            ("candle", LayerPath::Candle),
        ];
        setting::choice("UNET_ATTENTION_LAYERS", &choices)
    })
    .clone()
    .map_err(candle_core::Error::msg)
}

/// The register tile the layer GEMM runs on this CPU: `"avx512"` (`"avx512-rows3"` under
/// `UNET_ATTENTION_GEMM_TILE=rows3`), `"avx2"`, or `"none"` (Candle's ops for every layer).
pub fn layer_kernel_isa() -> &'static str {
    match Isa::detect() {
        Isa::Avx512 if avx512::rows_tile_setting() == Ok(avx512::RowsTile::RowBases) => "avx512-rows3",
        isa => isa.name(),
    }
}

/// The tiles bf16 linear layers and convolutions with bf16 weights run on: `"amx"` where the
/// AMX bf16 tiles run (`cpu::microkernel::amx`), else [`layer_kernel_isa`]'s f32 tiles.
pub fn bf16_layer_kernel() -> &'static str {
    match Isa::with_tiles() {
        Some(isa) if gemm::bf16_tiles(isa, Held::Bf16) => "amx",
        _ => layer_kernel_isa(),
    }
}

/// Whether a weight is packed: an f32, f16 or bf16 CPU tensor on a CPU the GEMM runs on (a
/// half-precision weight held in its own type, [`Held`]).
fn packable(w: &Tensor) -> Option<(Isa, Blocking)> {
    let isa = Isa::with_tiles()?;
    (held(w.dtype()).is_some() && w.device().is_cpu()).then(|| (isa, Blocking::for_isa(isa)))
}

/// How a weight of `dtype` is held once packed.
fn held(dtype: DType) -> Option<Held> {
    match dtype {
        DType::F32 => Some(Held::F32),
        DType::BF16 => Some(Held::Bf16),
        DType::F16 => Some(Held::F16),
        _ => None,
    }
}

/// The elements of a CPU tensor as f32 values, copied (exact from f16 and bf16).
fn f32_vec(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()
}

/// `f` on the elements of a CPU tensor as f32 values: in place for a contiguous f32 tensor (a
/// weight being packed is not copied first), else converted.
fn with_f32_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if t.dtype() == DType::F32 && t.is_contiguous() {
        let (storage, layout) = t.storage_and_layout();
        if let Some(values) = cpu_slice::<f32>(&storage, layout) {
            return Ok(f(&values[..t.elem_count()]));
        }
    }
    Ok(f(&f32_vec(t)?))
}

/// An `nn.Linear` weight `(out, in)` packed for the GEMM.
#[derive(Debug, Clone)]
pub struct PackedLinear {
    packed: Arc<PackedCols>,
    /// The dtype the weight was loaded in (its values held in it).
    dtype: DType,
    isa: Isa,
    blocking: Blocking,
}

impl PackedLinear {
    /// `None` where the weight is not packed (not f32, not on the CPU, or a CPU without the
    /// GEMM's instructions).
    pub fn new(weight: &Tensor) -> Result<Option<Self>> {
        Self::packed(weight, false)
    }

    /// A GEGLU projection's weight `(2·n, in)` (`[hidden | gate]`), packed so that
    /// [`Self::forward_geglu`] writes `hidden · gelu(gate)` straight from the GEMM (no `(.., 2·n)`
    /// intermediate); [`Self::forward`] still gives both halves. `None` as [`Self::new`], or for an
    /// odd output width.
    pub fn new_gated(weight: &Tensor) -> Result<Option<Self>> {
        Self::packed(weight, true)
    }

    fn packed(weight: &Tensor, gated: bool) -> Result<Option<Self>> {
        let Some((isa, blocking)) = packable(weight) else {
            return Ok(None);
        };
        let (out, inp) = weight.dims2()?;
        if out == 0 || inp == 0 || (gated && out % 2 == 1) {
            return Ok(None);
        }
        let packed = with_f32_values(weight, |w| {
            if gated {
                PackedCols::new_paired(w, out / 2, inp, isa, blocking)
            } else {
                PackedCols::new(w, out, inp, isa, blocking)
            }
        })?;
        let held = held(weight.dtype()).expect("a packable dtype");
        Ok(Some(Self {
            packed: Arc::new(packed.held_as(held)),
            dtype: weight.dtype(),
            isa,
            blocking,
        }))
    }

    /// The weight as a tensor again `(out, in)`, in the dtype it was loaded in.
    pub fn weight(&self) -> Result<Tensor> {
        Tensor::from_vec(
            self.packed.unpack(),
            (self.packed.out_cols(), self.packed.k),
            &Device::Cpu,
        )?
        .to_dtype(self.dtype)
    }

    /// `x · Wᵀ (+ bias)` over the last dimension of an f32, f16 or bf16 CPU tensor `(.., in)`, in
    /// f32 (half-precision inputs are exact in it; bf16 rows with a weight held in bf16 on the
    /// AMX tiles where the CPU has them); `None` where the call does not apply (another dtype or
    /// device, [`LayerPath::Candle`]).
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
        self.run(x, bias, false)
    }

    /// GEGLU of the projection, `hidden · gelu(gate)` (`(.., n)`, each element the same f32
    /// steps as [`Self::forward`] then [`super::geglu`]), for a weight packed by
    /// [`Self::new_gated`]; `None` where the call does not apply or the weight is not paired.
    pub fn forward_geglu(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
        // (In f16 / bf16 PyTorch rounds the projection, the GELU and the product each: not fused.)
        if self.packed.pairs.is_none() || x.dtype() != DType::F32 {
            return Ok(None);
        }
        self.run(x, bias, true)
    }

    fn run(&self, x: &Tensor, bias: Option<&Tensor>, geglu: bool) -> Result<Option<Tensor>> {
        let in_dim = self.packed.k;
        // Empty inputs stay with Candle's ops (views of an empty output with offsets break its
        // `cat`).
        let applies = x.device().is_cpu() && x.rank() >= 1 && x.elem_count() > 0;
        if !applies || x.dims()[x.rank() - 1] != in_dim || layer_path()? == LayerPath::Candle {
            return Ok(None);
        }
        // bf16 token rows go to the AMX tiles as they are, with a weight held in bf16; other
        // half-precision rows are widened (exact) for the f32 tiles.
        let bf16_tiles = x.dtype() == DType::BF16 && gemm::bf16_tiles(self.isa, self.packed.held());
        let x = match x.dtype() {
            DType::F32 => x.clone(),
            DType::BF16 if bf16_tiles => x.clone(),
            DType::F16 | DType::BF16 => widen(x)?,
            _ => return Ok(None),
        };
        // Token rows read in place where they are evenly spaced (a contiguous tensor, or one
        // narrowed along its last dimension, as `forward_geglu`'s output is); else copied.
        let (x, lda) = match row_stride(&x) {
            Some(lda) => (x, lda),
            None => (contiguous(&x)?, in_dim),
        };
        let bias = match bias {
            Some(b) => Some(self.packed.column_order(&f32_vec(b)?)),
            None => None,
        };
        let tokens = x.elem_count() / in_dim.max(1);
        let (storage, layout) = x.storage_and_layout();
        let used = (tokens - 1) * lda + in_dim;
        let a = if bf16_tiles {
            use half::slice::HalfFloatSliceExt;
            let src = &cpu_slice::<half::bf16>(&storage, layout).expect("a CPU tensor")[..used];
            RowsOf::Bf16Matrix(src.reinterpret_cast(), lda)
        } else {
            RowsOf::Matrix(&cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..used], lda)
        };
        let width = match self.packed.pairs {
            Some(n) if geglu => n,
            _ => self.packed.out_cols(),
        };
        // GEGLU rows a multiple of 4 KiB long are written 64 bytes further apart: read in place
        // by the next layer's tile, twelve such rows would share one L1 set (64 sets of 64-byte
        // lines, 4 KiB per way, on every x86 CPU), more rows than the set has ways (SD's and
        // SDXL's feed-forward output layer, K = 5120: 180 against 205 GFLOP/s on a Zen 4).
        let out_ld = (geglu && width.is_multiple_of(1024)).then_some(width + 16);
        let mut out = vec![0f32; tokens * out_ld.unwrap_or(width)];
        let epi = Epilogue {
            bias: bias.as_deref().map_or(Bias::None, Bias::PerCol),
            geglu,
            out_ld,
            ..Epilogue::NONE
        };
        gemm::gemm(self.isa, self.blocking, a, ColsOf::Packed(&self.packed), epi, &mut out);
        drop(storage);
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = out_ld.unwrap_or(width);
        let out = Tensor::from_vec(out, dims, &Device::Cpu)?;
        Ok(Some(match out_ld {
            Some(_) => out.narrow(x.rank() - 1, 0, width)?,
            None => out,
        }))
    }
}

/// A half-precision CPU tensor's values in f32 (exact), contiguous.
fn widen(x: &Tensor) -> Result<Tensor> {
    let x = contiguous(x)?;
    match crate::cpu::cast(&x, DType::F32)? {
        Some(y) => Ok(y),
        None => x.to_dtype(DType::F32),
    }
}

/// The distance between consecutive rows (last-dimension runs) of a CPU tensor whose rows are
/// contiguous and evenly spaced, `None` otherwise (including rank 0).
fn row_stride(x: &Tensor) -> Option<usize> {
    let (dims, stride) = (x.dims(), x.layout().stride());
    let r = dims.len();
    if r == 0 || (stride[r - 1] != 1 && dims[r - 1] > 1) {
        return None;
    }
    if r == 1 {
        return Some(dims[0]);
    }
    let lda = stride[r - 2];
    // Every outer dimension (of more than one) steps over all the rows inside it.
    let mut rows_inside = dims[r - 2];
    for i in (0..r - 2).rev() {
        if dims[i] > 1 && stride[i] != lda * rows_inside {
            return None;
        }
        rows_inside *= dims[i];
    }
    (lda >= dims[r - 1]).then_some(lda)
}

/// A `Conv2d` weight `(out, in, k, k)` packed for the GEMM.
#[derive(Debug, Clone)]
pub struct PackedConv {
    packed: Arc<PackedRows>,
    /// The dtype the weight was loaded in (its values held in it).
    dtype: DType,
    ksize: usize,
    isa: Isa,
    blocking: Blocking,
}

/// What a convolution adds to its output after the bias, in this order (f32 operations).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvExtras<'a> {
    /// `(B, out)`: added per batch item and channel (`h + temb[:, :, None, None]`).
    pub channel_add: Option<&'a Tensor>,
    /// Added elementwise (`residual + h`), the output's shape.
    pub residual: Option<&'a Tensor>,
    /// The sum divided by this (`/ output_scale_factor`).
    pub div: Option<f64>,
}

impl PackedConv {
    /// `None` where the weight is not packed (as [`PackedLinear::new`]) or the kernel is even.
    pub fn new(weight: &Tensor) -> Result<Option<Self>> {
        let Some((isa, blocking)) = packable(weight) else {
            return Ok(None);
        };
        let (out, inp, kh, kw) = weight.dims4()?;
        if kh != kw || kh.is_multiple_of(2) || out == 0 || inp == 0 {
            return Ok(None);
        }
        let taps = kh * kw;
        let held = held(weight.dtype()).expect("a packable dtype");
        // For the AMX tiles the rows are row-major (read in place as tile rows; the same blocks,
        // so the same f32 sums on the f32 tiles: deeper blocks measured slower, 8.7 s against 7.6
        // for a bf16 SD 1.5 step).
        let il = if gemm::bf16_tiles(isa, held) { 1 } else { isa.mr() };
        let blocks = im2col::conv_blocks(inp, taps, blocking.kc);
        // Each row reordered tap-major on its own (no reordered copy of the whole weight).
        let packed = with_f32_values(weight, |w| {
            let mut packed = PackedRows::zeros_with(out, inp * taps, il, blocks);
            let mut row = vec![0f32; inp * taps];
            for (r, src) in w.chunks_exact(inp * taps).enumerate() {
                im2col::tap_major_row(src, inp, taps, &mut row);
                packed.set_row(r, &row);
            }
            packed
        })?;
        Ok(Some(Self {
            packed: Arc::new(packed.held_as(held)),
            dtype: weight.dtype(),
            ksize: kh,
            isa,
            blocking,
        }))
    }

    /// The weight as a tensor again `(out, in, k, k)`.
    pub fn weight(&self) -> Result<Tensor> {
        let (out, k) = (self.packed.rows, self.ksize);
        let inp = self.packed.k / (k * k);
        let w = im2col::torch_order(&self.packed.unpack(), inp, k * k);
        Tensor::from_vec(w, (out, inp, k, k), &Device::Cpu)?.to_dtype(self.dtype)
    }

    /// The stride-1, `k / 2`-padded convolution of an f32 CPU `(B, in, H, W)` with `extras`
    /// applied; `None` where the call does not apply (as [`PackedLinear::forward`]).
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>, extras: ConvExtras) -> Result<Option<Tensor>> {
        self.forward_on(layer_path()?, x, bias, extras)
    }

    /// [`PackedConv::forward`] on the path `path`.
    fn forward_on(
        &self,
        path: LayerPath,
        x: &Tensor,
        bias: Option<&Tensor>,
        extras: ConvExtras,
    ) -> Result<Option<Tensor>> {
        let taps = self.ksize * self.ksize;
        let f32_cpu = |t: &Tensor| t.dtype() == DType::F32 && t.device().is_cpu();
        let extras_ok = extras.channel_add.is_none_or(f32_cpu) && extras.residual.is_none_or(f32_cpu);
        let empty = x.elem_count() == 0;
        let dtype_ok = matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) && x.device().is_cpu();
        if !dtype_ok || !extras_ok || x.rank() != 4 || empty || path == LayerPath::Candle {
            return Ok(None);
        }
        // A half-precision image widened (exact); bf16 values with a weight held in bf16 run on
        // the AMX tiles where the CPU has them, and then never by Winograd (its transformed
        // values are not bf16 values).
        let bf16_values = x.dtype() == DType::BF16;
        let bf16_tiles = bf16_values && gemm::bf16_tiles(self.isa, self.packed.held());
        let x = match x.dtype() {
            DType::F32 => x.clone(),
            DType::BF16 if bf16_tiles => x.clone(),
            _ => widen(x)?,
        };
        let (batch, channels, h, w) = x.dims4()?;
        if channels * taps != self.packed.k {
            return Ok(None);
        }
        let out_c = self.packed.rows;
        let out_dims = (batch, out_c, h, w);
        let bias = bias.map(f32_vec).transpose()?;
        let add = match extras.channel_add {
            Some(t) if t.dims() == [batch, out_c] => Some(f32_vec(t)?),
            Some(_) => return Ok(None),
            None => None,
        };
        let residual = match extras.residual {
            Some(r) if r.dims() == [batch, out_c, h, w] => Some(contiguous(r)?),
            Some(_) => return Ok(None),
            None => None,
        };
        let x = contiguous(&x)?;
        let (xs, xl) = x.storage_and_layout();
        // The image: f32 values, or on the AMX tiles its bf16 bits as they are.
        let (src, bits): (&[f32], _) = if bf16_tiles {
            use half::slice::HalfFloatSliceExt;
            let bits = &cpu_slice::<half::bf16>(&xs, xl).expect("a CPU tensor")[..x.elem_count()];
            (&[], Some(HalfFloatSliceExt::reinterpret_cast(bits)))
        } else {
            (
                &cpu_slice::<f32>(&xs, xl).expect("a CPU tensor")[..x.elem_count()],
                None,
            )
        };
        let res_guard = residual.as_ref().map(|r| r.storage_and_layout());
        let res = res_guard
            .as_ref()
            .map(|(s, l)| &cpu_slice::<f32>(s, l).expect("a CPU tensor")[..batch * out_c * h * w]);
        let mut out = vec![0f32; batch * out_c * h * w];
        let epi = Epilogue {
            bias: bias.as_deref().map_or(Bias::None, Bias::PerRow),
            item_row: add.as_deref(),
            residual: res,
            div: extras.div.map(|d| d as f32),
            geglu: false,
            out_ld: None,
        };
        let shape = winograd::Shape {
            batch,
            c_in: channels,
            c_out: out_c,
            h,
            w,
        };
        let winograd = match path {
            _ if bf16_tiles => false,
            LayerPath::Auto => winograd::pays(self.isa, shape),
            LayerPath::Winograd => true,
            LayerPath::Direct | LayerPath::Candle => false,
        };
        if self.ksize == 3 && winograd {
            // (A weight held in half precision is widened a run at a time by the transform.)
            winograd::conv(self.isa, self.blocking, &self.packed, src, shape, epi, &mut out);
        } else {
            let image = im2col::Image {
                x: src,
                batch,
                channels,
                h,
                w,
                ksize: self.ksize,
                bits,
            };
            let (a, b) = (RowsOf::Packed(&self.packed), ColsOf::Image(image));
            gemm::gemm(self.isa, self.blocking, a, b, epi, &mut out);
        }
        drop(res_guard);
        drop(xs);
        Ok(Some(Tensor::from_vec(out, out_dims, &Device::Cpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Normal values from a fixed seed (per shape), so that a test's outcome does not depend on
    /// the draw: the same numbers on every run, every kernel choice judged on the same inputs.
    fn randn(shape: &[usize]) -> Tensor {
        crate::test_support::seeded_randn(shape, 0)
    }

    /// The bit patterns of a tensor's f32 values.
    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Largest `|a − b|` over `max(1, |b|)`, in f64.
    fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
        let f = |t: &Tensor| {
            t.to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        f(a).iter()
            .zip(f(b))
            .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
            .fold(0.0, f64::max)
    }

    /// The packed linear layer against an f64 matmul and against Candle's f32 `Linear`, on
    /// shapes with partial tiles, partial panels and several reduction blocks.
    #[test]
    fn packed_linear_matches_the_candle_ops() {
        if Isa::with_tiles().is_none() {
            return;
        }
        for (lead, inp, out) in [
            (vec![1usize, 1], 3usize, 1usize),
            (vec![2, 77], 768, 320),
            (vec![13], 1100, 45),
        ] {
            let w = randn(&[out, inp]);
            let b = randn(&[out]);
            let mut dims = lead.clone();
            dims.push(inp);
            let x = randn(&dims);
            let p = PackedLinear::new(&w).unwrap().unwrap();
            assert_eq!(rel_err(&p.weight().unwrap(), &w), 0.0);
            let got = p.forward(&x, Some(&b)).unwrap().unwrap();
            let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
            let want = candle_nn::Module::forward(&candle_nn::Linear::new(f(&w), Some(f(&b))), &f(&x)).unwrap();
            let candle = candle_nn::Module::forward(&candle_nn::Linear::new(w.clone(), Some(b.clone())), &x).unwrap();
            let (ours, theirs) = (rel_err(&got, &want), rel_err(&candle, &want));
            assert_eq!(got.dims(), want.dims());
            assert!(
                ours < 1e-4 && ours <= 2.0 * theirs.max(1e-6),
                "{dims:?}→{out}: {ours} vs Candle {theirs}"
            );
        }
    }

    /// A GEGLU projection packed paired gives the same bits as packed plainly: both halves from
    /// `forward`, and `hidden · gelu(gate)` from `forward_geglu` as `geglu` of them; widths that
    /// leave partial panels, with and without bias, and the weight unpacked in its own order.
    #[test]
    fn paired_projection_gives_the_plain_bits() {
        if Isa::with_tiles().is_none() {
            return;
        }
        // n = 1024: GEGLU rows 4 KiB long, written further apart (a narrowed view).
        for (tokens, inp, n) in [
            (13usize, 50usize, 37usize),
            (70, 300, 64),
            (5, 7, 1),
            (40, 64, 700),
            (29, 48, 1024),
        ] {
            let w = randn(&[2 * n, inp]);
            let b = randn(&[2 * n]);
            let x = randn(&[tokens, inp]);
            let plain = PackedLinear::new(&w).unwrap().unwrap();
            let paired = PackedLinear::new_gated(&w).unwrap().unwrap();
            assert_eq!(bits(&paired.weight().unwrap()), bits(&w));
            for bias in [Some(&b), None] {
                let h = plain.forward(&x, bias).unwrap().unwrap();
                assert_eq!(bits(&paired.forward(&x, bias).unwrap().unwrap()), bits(&h));
                let fused = paired.forward_geglu(&x, bias).unwrap().unwrap();
                assert_eq!(fused.dims(), &[tokens, n]);
                assert_eq!(bits(&fused), bits(&super::super::geglu(&h).unwrap().unwrap()));
                assert_eq!(fused.is_contiguous(), n % 1024 != 0);
            }
            assert!(plain.forward_geglu(&x, Some(&b)).unwrap().is_none());
        }
    }

    /// Token rows read in place from evenly spaced views (narrowed along the last dimension,
    /// leading dimensions of one) give the bits of their contiguous copies; views whose rows are
    /// not evenly spaced (transposed, broadcast, narrowed in the middle) are copied first.
    #[test]
    fn packed_linear_reads_spaced_rows_in_place() {
        if Isa::with_tiles().is_none() {
            return;
        }
        let p = PackedLinear::new(&randn(&[45, 40])).unwrap().unwrap();
        let base = randn(&[2, 1, 13, 56]);
        let cases = [
            (base.narrow(3, 16, 40).unwrap(), true),
            (base.narrow(3, 0, 40).unwrap().narrow(2, 3, 9).unwrap(), false),
            (
                randn(&[1, 13, 56]).narrow(2, 8, 40).unwrap().narrow(1, 2, 9).unwrap(),
                true,
            ),
            (randn(&[40, 26]).t().unwrap(), false),
            (randn(&[1, 40]).broadcast_as((7, 40)).unwrap(), false),
            (randn(&[3, 5, 40]).narrow(1, 1, 3).unwrap(), false),
        ];
        for (x, spaced) in cases {
            assert_eq!(
                row_stride(&x).is_some(),
                spaced,
                "{:?} {:?}",
                x.dims(),
                x.layout().stride()
            );
            let got = p.forward(&x, None).unwrap().unwrap();
            let want = p.forward(&x.contiguous().unwrap(), None).unwrap().unwrap();
            assert_eq!(got.dims(), want.dims());
            assert_eq!(bits(&got), bits(&want));
        }
    }

    /// The packed convolution (1×1 and 3×3, odd sizes, batch > 1, every extra) against Candle's
    /// convolution and ops in f64, and against Candle in f32.
    #[test]
    fn packed_conv_matches_the_candle_ops() {
        if Isa::with_tiles().is_none() {
            return;
        }
        for (b, c, h, w, out, k) in [
            (2, 5, 7, 9, 3, 3),
            (1, 64, 16, 16, 40, 3),
            (2, 48, 16, 18, 40, 3),
            (1, 64, 48, 47, 72, 3),
            (3, 40, 5, 33, 17, 1),
            (1, 3, 1, 1, 2, 3),
        ] {
            let wt = randn(&[out, c, k, k]);
            let bias = randn(&[out]);
            let x = randn(&[b, c, h, w]);
            let add = randn(&[b, out]);
            let res = randn(&[b, out, h, w]);
            let p = PackedConv::new(&wt).unwrap().unwrap();
            assert_eq!(rel_err(&p.weight().unwrap(), &wt), 0.0);
            let extras = ConvExtras {
                channel_add: Some(&add),
                residual: Some(&res),
                div: Some(1.5),
            };
            let reference = |dt: DType| {
                let f = |t: &Tensor| t.to_dtype(dt).unwrap();
                let cfg = candle_nn::Conv2dConfig {
                    padding: k / 2,
                    ..Default::default()
                };
                let conv = candle_nn::Conv2d::new(f(&wt), Some(f(&bias)), cfg);
                let y = candle_nn::Module::forward(&conv, &f(&x)).unwrap();
                let y = y
                    .broadcast_add(&f(&add).unsqueeze(2).unwrap().unsqueeze(3).unwrap())
                    .unwrap();
                ((f(&res) + y).unwrap() / 1.5).unwrap()
            };
            let (want, candle) = (reference(DType::F64), reference(DType::F32));
            let theirs = rel_err(&candle, &want);
            // Auto (direct or Winograd by size), then each forced.
            for path in [LayerPath::Auto, LayerPath::Direct, LayerPath::Winograd] {
                let got = p.forward_on(path, &x, Some(&bias), extras).unwrap().unwrap();
                let ours = rel_err(&got, &want);
                if std::env::var_os("SHOW_CONV_ERR").is_some() {
                    eprintln!("{:?} {path:?}: {ours:.3e} vs Candle {theirs:.3e}", (b, c, h, w, out, k));
                }
                assert!(
                    ours < 1e-4 && ours <= 2.0 * theirs.max(1e-6),
                    "{:?} {path:?}: {ours} vs Candle {theirs}",
                    (b, c, h, w, out, k)
                );
            }
            // Without extras, and the switch back to Candle's ops.
            let plain = p.forward(&x, None, ConvExtras::default()).unwrap().unwrap();
            assert_eq!(plain.dims(), [b, out, h, w]);
        }
    }
    /// A weight loaded in f16 or bf16 is held in it (half the bytes) and gives the same bits as
    /// the f32 packing of its values, on every path (the widening is exact); its weight comes
    /// back in the dtype it was loaded in.
    #[test]
    fn half_weights_are_held_in_half_and_give_the_f32_bits() {
        if Isa::with_tiles().is_none() {
            return;
        }
        for dt in [DType::BF16, DType::F16] {
            let half = |t: Tensor| t.to_dtype(dt).unwrap();
            let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            // Linear, plain and gated, over several reduction blocks and partial panels.
            let w = half(randn(&[90, 1100]));
            let bias = half(randn(&[90]));
            let x = randn(&[2, 13, 1100]);
            for gated in [false, true] {
                let (p, p32) = if gated {
                    (PackedLinear::new_gated(&w), PackedLinear::new_gated(&wide(&w)))
                } else {
                    (PackedLinear::new(&w), PackedLinear::new(&wide(&w)))
                };
                let (p, p32) = (p.unwrap().unwrap(), p32.unwrap().unwrap());
                assert!(p.packed.data.is_empty(), "held in {dt:?}, not f32");
                assert_eq!(p.packed.held(), held(dt).unwrap());
                let got = p.forward(&x, Some(&bias)).unwrap().unwrap();
                let want = p32.forward(&x, Some(&wide(&bias))).unwrap().unwrap();
                assert_eq!(bits(&got), bits(&want), "{dt:?} gated {gated}");
                let back = p.weight().unwrap();
                assert_eq!(back.dtype(), dt);
                assert_eq!(bits(&wide(&back)), bits(&wide(&w)));
            }
            // Convolutions, direct and Winograd.
            let wt = half(randn(&[40, 48, 3, 3]));
            let x = randn(&[2, 48, 16, 18]);
            let (p, p32) = (
                PackedConv::new(&wt).unwrap().unwrap(),
                PackedConv::new(&wide(&wt)).unwrap().unwrap(),
            );
            assert!(p.packed.data.is_empty(), "held in {dt:?}, not f32");
            for path in [LayerPath::Direct, LayerPath::Winograd] {
                let got = p.forward_on(path, &x, None, ConvExtras::default()).unwrap().unwrap();
                let want = p32.forward_on(path, &x, None, ConvExtras::default()).unwrap().unwrap();
                assert_eq!(bits(&got), bits(&want), "{dt:?} {path:?}");
            }
            assert_eq!(p.weight().unwrap().dtype(), dt);
        }
    }

    /// bf16 inputs with bf16 weights (on the AMX tiles where the CPU has them, else widened for
    /// the f32 tiles) against f64 sums of the same values: linear layers plain and paired, 1×1
    /// and 3×3 convolutions, widths that are not whole tiles and several reduction blocks. The
    /// bound is f32 accumulation's: `1e-6` of the sum of the products' magnitudes.
    #[test]
    fn bf16_products_match_f64_sums() {
        if Isa::with_tiles().is_none() {
            return;
        }
        let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
        let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let check = |got: &Tensor, exact: &Tensor, magnitude: &Tensor, what: &str| {
            assert_eq!(got.dtype(), DType::F32, "{what}");
            let (g, e, m) = (f64_of(got), exact, magnitude);
            let err = (g - e).unwrap().abs().unwrap();
            let excess = (err - (m * 1e-6).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap();
            assert!(
                excess.to_scalar::<f64>().unwrap() <= 1e-9,
                "{what}: beyond the f32 bound"
            );
        };
        for (tokens, inp, out) in [(77usize, 768usize, 320usize), (45, 100, 70), (300, 1280, 96)] {
            let (x, w, b) = (bf(randn(&[tokens, inp])), bf(randn(&[out, inp])), bf(randn(&[out])));
            let exact = f64_of(&x)
                .matmul(&f64_of(&w).t().unwrap())
                .unwrap()
                .broadcast_add(&f64_of(&b))
                .unwrap();
            let magnitude = f64_of(&x)
                .abs()
                .unwrap()
                .matmul(&f64_of(&w).abs().unwrap().t().unwrap())
                .unwrap();
            for gated in [false, true] {
                let p = if gated {
                    PackedLinear::new_gated(&w)
                } else {
                    PackedLinear::new(&w)
                };
                let got = p.unwrap().unwrap().forward(&x, Some(&b)).unwrap().unwrap();
                check(
                    &got,
                    &exact,
                    &magnitude,
                    &format!("linear {tokens}x{inp}x{out} gated {gated}"),
                );
            }
        }
        for (c_in, c_out, k, hw) in [(64usize, 96usize, 3usize, 9usize), (40, 36, 3, 7), (320, 64, 1, 12)] {
            let (x, w) = (bf(randn(&[2, c_in, hw, hw])), bf(randn(&[c_out, c_in, k, k])));
            let pad = k / 2;
            let exact = f64_of(&x).conv2d(&f64_of(&w), pad, 1, 1, 1).unwrap();
            let magnitude = f64_of(&x)
                .abs()
                .unwrap()
                .conv2d(&f64_of(&w).abs().unwrap(), pad, 1, 1, 1)
                .unwrap();
            let p = PackedConv::new(&w).unwrap().unwrap();
            let got = p.forward(&x, None, ConvExtras::default()).unwrap().unwrap();
            check(
                &got,
                &exact,
                &magnitude,
                &format!("conv {c_in}->{c_out} k{k} {hw}x{hw}"),
            );
        }
    }
}

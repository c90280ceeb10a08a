//! Which implementation of the attention core runs: [`SdpaPath`], chosen per call by
//! [`sdpa`](super::sdpa) and [`eager_attention`](super::eager_attention).
//!
//! The choice is, in order: the programmatic override ([`set_sdpa_path`]), else the environment
//! variable `UNET_ATTENTION_SDPA` (`auto`, `reference`, `chunked`, `flash` or `fused`; read once, on the
//! first call), else [`SdpaPath::Auto`].

use candle_core::{DType, Device, Result, Tensor, D};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// An implementation of the attention core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SdpaPath {
    /// The fastest path that applies: CUDA FlashAttention-2 (feature `flash-attn`, f16/bf16, no
    /// mask, head dim a multiple of 8 up to 512), Metal's `candle_nn::ops::sdpa` (no mask, head
    /// dims it has kernels for), the tiled CPU kernel (f32/f16/bf16 on the CPU), otherwise
    /// [`SdpaPath::Chunked`].
    Auto,
    /// The plain tensor-op implementation (the full score matrix in memory), for parity
    /// debugging: what every other path is tested against.
    Reference,
    /// Query blocks run through the reference ops one after the other, so the scores of one
    /// block at a time are in memory: the same arithmetic as the reference row by row, on every
    /// device and dtype.
    Chunked,
    /// The tiled online-softmax CPU kernel where it applies (CPU, f32/f16/bf16), else
    /// [`SdpaPath::Chunked`] (never the fused GPU kernels).
    Flash,
    /// This crate's fused CUDA kernel (module `cuda`, feature `cuda`, f16/bf16/f32, head dims up
    /// to 512, any additive mask) where it applies, else what [`SdpaPath::Auto`] picks. Opt-in:
    /// `Auto` takes the kernel only once `cuda::AUTO_PICKS_FUSED` is flipped.
    Fused,
}

impl SdpaPath {
    /// The name `UNET_ATTENTION_SDPA` takes.
    pub fn name(self) -> &'static str {
        match self {
            SdpaPath::Auto => "auto",
            SdpaPath::Reference => "reference",
            SdpaPath::Chunked => "chunked",
            SdpaPath::Flash => "flash",
            SdpaPath::Fused => "fused",
        }
    }

    const ALL: [SdpaPath; 5] = [
        SdpaPath::Auto,
        SdpaPath::Reference,
        SdpaPath::Chunked,
        SdpaPath::Flash,
        SdpaPath::Fused,
    ];

    fn code(self) -> u8 {
        match self {
            SdpaPath::Auto => 1,
            SdpaPath::Reference => 2,
            SdpaPath::Chunked => 3,
            SdpaPath::Flash => 4,
            SdpaPath::Fused => 5,
        }
    }
}

impl std::str::FromStr for SdpaPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        SdpaPath::ALL
            .into_iter()
            .find(|p| p.name() == t)
            .ok_or_else(|| format!("UNET_ATTENTION_SDPA={s:?}: expected one of auto, reference, chunked, flash, fused"))
    }
}

impl std::fmt::Display for SdpaPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 0: no override.
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Force a path for every later call in this process (`None`: back to the environment variable
/// or [`SdpaPath::Auto`]).
pub fn set_sdpa_path(path: Option<SdpaPath>) {
    OVERRIDE.store(path.map_or(0, SdpaPath::code), Ordering::Relaxed);
}

/// The path calls take now. An unparsable `UNET_ATTENTION_SDPA` (or `UNET_ATTENTION_ISA`, the
/// cap on the vector instructions the CPU kernels use, or `UNET_ATTENTION_CACHE`, the cache sizes
/// they block for) is an error (on every call), never silently ignored.
pub fn sdpa_path() -> Result<SdpaPath> {
    crate::cpu::isa::setting().map_err(candle_core::Error::msg)?;
    crate::cpu::caches::setting().map_err(candle_core::Error::msg)?;
    let code = OVERRIDE.load(Ordering::Relaxed);
    if let Some(p) = SdpaPath::ALL.into_iter().find(|p| p.code() == code) {
        return Ok(p);
    }
    static ENV: OnceLock<std::result::Result<SdpaPath, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let choices = SdpaPath::ALL.map(|p| (p.name(), p));
        crate::cpu::setting::choice("UNET_ATTENTION_SDPA", &choices)
    })
    .clone()
    .map_err(candle_core::Error::msg)
}

/// Score elements one chunk of [`SdpaPath::Chunked`] may hold: 64 MiB in f32 on the CPU, 128 MiB
/// on a GPU (where each op of a chunk is a kernel launch, so fewer, larger chunks run faster).
fn chunk_scores(device: &Device) -> usize {
    if device.is_cpu() {
        1 << 24
    } else {
        1 << 25
    }
}

/// Query rows per chunk for `(batch·heads, lk)` scores on `device`: as many as fit
/// [`chunk_scores`].
pub(crate) fn chunk_rows(device: &Device, batch_heads: usize, lk: usize) -> usize {
    (chunk_scores(device) / (batch_heads * lk).max(1)).max(1)
}

/// Run `f` on query blocks (dim -2 of `q`, and of `mask` where it is not broadcast) and
/// concatenate the results along dim -2. Each row's arithmetic is independent of the others', so
/// this equals `f` on the whole.
pub(crate) fn chunked(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    f: impl Fn(&Tensor, Option<&Tensor>) -> Result<Tensor>,
) -> Result<Tensor> {
    let rank = q.rank();
    let lq = q.dim(D::Minus2)?;
    let lk = k.dim(D::Minus2)?;
    let batch_heads: usize = q.dims()[..rank - 2].iter().product();
    let rows = chunk_rows(q.device(), batch_heads, lk);
    if rows >= lq {
        return f(q, mask);
    }
    let mut outs = vec![];
    for start in (0..lq).step_by(rows) {
        let len = rows.min(lq - start);
        let qc = q.narrow(rank - 2, start, len)?;
        let mc = match mask {
            // Query dim of the mask: -2, unless the mask is broadcast along it (size 1, or the
            // mask has fewer than two dims).
            Some(m) if m.rank() >= 2 && m.dim(D::Minus2)? == lq => Some(m.narrow(m.rank() - 2, start, len)?),
            other => other.cloned(),
        };
        outs.push(f(&qc, mc.as_ref())?);
    }
    Tensor::cat(&outs, rank - 2)
}

/// CUDA FlashAttention-2 (`candle-flash-attn`), where it takes the inputs: f16/bf16 q, k, v of
/// rank 4 on a CUDA device, no mask, equal head dims, a multiple of 8 up to 512. `None` if not.
#[cfg(feature = "flash-attn")]
pub(crate) fn cuda_flash(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Option<Tensor>> {
    let dtype = q.dtype();
    let d = q.dim(D::Minus1)?;
    let ok = q.device().is_cuda()
        && mask.is_none()
        && matches!(dtype, DType::F16 | DType::BF16)
        && k.dtype() == dtype
        && v.dtype() == dtype
        && q.rank() == 4
        && k.rank() == 4
        && v.rank() == 4
        && k.dim(D::Minus1)? == d
        && v.dim(D::Minus1)? == d
        && d % 8 == 0
        && d <= 512;
    if !ok {
        return Ok(None);
    }
    // candle-flash-attn takes (batch, tokens, heads, head_dim).
    let t = |x: &Tensor| x.transpose(1, 2)?.contiguous();
    let out = candle_flash_attn::flash_attn(&t(q)?, &t(k)?, &t(v)?, scale as f32, false)?;
    Ok(Some(out.transpose(1, 2)?.contiguous()?))
}

/// Metal's fused `candle_nn::ops::sdpa`, where it takes the inputs: f32/f16/bf16 rank-4 q, k, v
/// on a Metal device, no mask, equal head dims among 32, 64, 72, 80, 96, 128, 256 (and 512 in
/// half precision), more than one query or no more queries than keys. `None` if not. The
/// function exists on every build (it errors off Metal), so this type-checks everywhere.
pub(crate) fn metal_sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Option<Tensor>> {
    if !matches!(q.device(), Device::Metal(_)) || mask.is_some() || q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Ok(None);
    }
    let dtype = q.dtype();
    let d = q.dim(D::Minus1)?;
    let (lq, lk) = (q.dim(2)?, k.dim(2)?);
    let ok = matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && k.dtype() == dtype
        && v.dtype() == dtype
        && k.dim(D::Minus1)? == d
        && v.dim(D::Minus1)? == d
        && q.dim(1)? == k.dim(1)?
        && matches!(d, 32 | 64 | 72 | 80 | 96 | 128 | 256 | 512)
        && !(d == 512 && dtype == DType::F32)
        && lk > 0
        && lq > 0
        && (lq > 1 || lq <= lk);
    if !ok {
        return Ok(None);
    }
    let out = candle_nn::ops::sdpa(
        &q.contiguous()?,
        &k.contiguous()?,
        &v.contiguous()?,
        None,
        false,
        scale as f32,
        1.0,
    )?;
    Ok(Some(out))
}

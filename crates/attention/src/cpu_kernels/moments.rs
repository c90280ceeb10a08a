//! The mean and biased variance of a row as PyTorch 2.x's CPU kernels compute them, step for
//! step, so that a norm built on them rounds where PyTorch's rounds:
//!
//! * [`rowwise`]: ATen's `RowwiseMoments` (`aten/src/ATen/native/cpu/moments_utils.h`), the
//!   moments of `nn.GroupNorm` on a contiguous input and of `nn.LayerNorm`: Welford's update on
//!   [`LANES`] lanes over chunks of 16 vectors, the chunks merged pairwise (a cascade), then a
//!   scalar Welford over the tail and the lanes merged in order.
//! * [`columnwise`]: `GroupNormKernelImplChannelsLastInternal`'s sums of `x` and `x²` of one
//!   (batch, group) of a **channels_last** input (`group_norm_kernel.cpp`), from which PyTorch
//!   takes `var = E[x²] − mean²` in f32.
//!
//! The vector width is that of PyTorch's x86-64 wheel on its AVX2 kernels (`Vectorized<float>`:
//! 8 lanes; the kernel set `torch.backends.cpu.get_cpu_capability()` reports as `AVX2`, as on
//! the machines the bundles were exported on). `FUSED` says whether PyTorch's kernel has fused
//! multiply-adds (any CPU with FMA; its `fmadd` and the compiler's contractions, located by
//! comparing with PyTorch 2.15's outputs bit for bit: see each step); without, each product and
//! sum rounds on its own, as PyTorch's `DEFAULT` kernels compute. Half-precision rows (f16/bf16
//! upcast exactly to f32, PyTorch's `opmath`; `input` says which) take PyTorch's 16-element
//! half vectors, each split into two f32 vectors.

use candle_core::DType;

/// Lanes of PyTorch's `Vectorized<float>` on its AVX2 kernels.
pub(crate) const LANES: usize = 8;
/// `kChunkSize`: vectors per Welford chunk.
const CHUNK: usize = 16;
/// The cascade's deepest level: rows up to `2³² · 16 · 16` elements.
const MAX_DEPTH: usize = 33;

type Lanes = [f32; LANES];

/// `a · b + c`: one rounding when `FUSED`, two otherwise.
#[inline(always)]
pub(crate) fn fma<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Count, mean and sum of squared deviations, per lane (`m0`, `m1`, `m2` in ATen).
#[derive(Debug, Clone, Copy)]
struct Moments {
    m0: usize,
    m1: Lanes,
    m2: Lanes,
}

const ZERO: Moments = Moments {
    m0: 0,
    m1: [0.0; LANES],
    m2: [0.0; LANES],
};

/// `AddMomentsVec`: merge `add` into `acc`. `c = m0_add / n` and `delta = m1_add − m1` round
/// in f32, `m1 += c·delta` (the product rounded: it is used twice),
/// `m2 = fmadd(delta·m0, c·delta, m2 + m2_add)`.
#[inline(always)]
fn add_vec<const FUSED: bool>(add: &Moments, acc: &mut Moments) {
    let n = acc.m0 + add.m0;
    let c = if n == 0 { 0.0 } else { add.m0 as f32 / n as f32 };
    let m0 = acc.m0 as f32;
    for l in 0..LANES {
        let delta = add.m1[l] - acc.m1[l];
        let m2 = acc.m2[l] + add.m2[l];
        let c_delta = c * delta;
        acc.m1[l] += c_delta;
        acc.m2[l] = fma::<FUSED>(delta * m0, c_delta, m2);
    }
    acc.m0 = n;
}

/// `UpdateMomentsVec`: Welford over `count` vectors of `xs` (each [`LANES`] wide, `stride`
/// apart), `m1 = fmadd(1/(j+1), delta, m1)` and `m2 = fmadd(delta, x − m1, m2)`.
#[inline(always)]
fn update<const FUSED: bool>(xs: &[f32], stride: usize, count: usize) -> Moments {
    let mut v = Moments { m0: count, ..ZERO };
    for j in 0..count {
        let x = &xs[j * stride..][..LANES];
        let c = 1.0 / (j + 1) as f32;
        for ((&x, m1), m2) in x.iter().zip(&mut v.m1).zip(&mut v.m2) {
            let delta = x - *m1;
            *m1 = fma::<FUSED>(c, delta, *m1);
            *m2 = fma::<FUSED>(delta, x - *m1, *m2);
        }
    }
    v
}

/// `utils::CeilLog2`: 1 up to 2, then `⌈log2 m⌉`.
fn ceil_log2(m: usize) -> usize {
    if m <= 2 {
        1
    } else {
        (usize::BITS - (m - 1).leading_zeros()) as usize
    }
}

/// `RowwiseMoments(xs, len)` (`ddof = 0`): `(mean, biased variance)` of `xs`, every step as
/// PyTorch's kernel rounds it. `input`: the row's dtype in PyTorch (f16/bf16: 16 values a
/// vector, its two f32 halves merged one after the other). Bit for bit PyTorch 2.15's mean and
/// variance on its AVX2 kernels (`tests/attention/norm_kernels.rs`).
#[inline(always)]
pub(crate) fn rowwise<const FUSED: bool>(xs: &[f32], input: DType) -> (f32, f32) {
    let half = matches!(input, DType::F16 | DType::BF16);
    let width = if half { 2 * LANES } else { LANES };
    let n = xs.len() / width;
    let m = n.div_ceil(CHUNK);
    let depth = ceil_log2(m);
    assert!(depth <= MAX_DEPTH, "a row of {} elements", xs.len());
    let mut stack = [ZERO; MAX_DEPTH];
    for i in 0..m {
        let count = CHUNK.min(n - i * CHUNK);
        let chunk = &xs[i * CHUNK * width..];
        add_vec::<FUSED>(&update::<FUSED>(chunk, width, count), &mut stack[0]);
        if half {
            add_vec::<FUSED>(&update::<FUSED>(&chunk[LANES..], width, count), &mut stack[0]);
        }
        let mut mask = i + 1;
        let mut j = 1;
        while j < depth && mask & 1 == 0 {
            let lower = stack[j - 1];
            add_vec::<FUSED>(&lower, &mut stack[j]);
            stack[j - 1] = ZERO;
            mask >>= 1;
            j += 1;
        }
    }
    for i in 1..depth {
        let level = stack[i];
        add_vec::<FUSED>(&level, &mut stack[0]);
    }
    // The scalar Welford of the tail (`m1 += delta / m0`, `m2 += delta·(x − m1)`: fused in the
    // f16 kernel only, not in the f32 and bf16 ones), then `AddMoments` of each lane in order:
    // `m1 += c·delta` and `m2 += m2_add + delta²·c·m0`, each fused.
    let (mut m0, mut m1, mut m2) = (0usize, 0f32, 0f32);
    for &x in &xs[n * width..] {
        let delta = x - m1;
        m0 += 1;
        m1 += delta / m0 as f32;
        m2 = if input == DType::F16 {
            fma::<FUSED>(delta, x - m1, m2)
        } else {
            m2 + delta * (x - m1)
        };
    }
    let per_lane = n * width / LANES;
    for l in 0..LANES {
        let total = m0 + per_lane;
        let c = if total == 0 {
            0.0
        } else {
            per_lane as f32 / total as f32
        };
        let delta = stack[0].m1[l] - m1;
        m1 = fma::<FUSED>(c, delta, m1);
        m2 += fma::<FUSED>(delta * delta * c, m0 as f32, stack[0].m2[l]);
        m0 = total;
    }
    (m1, m2 / xs.len() as f32)
}

/// `vec_reduce_all(+)` of one AVX2 vector: lanes `i` and `i + 4` added, then `i` and `i + 2`,
/// then the two left.
fn reduce_lanes(v: &Lanes) -> f32 {
    let a: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

/// The (Σx, Σx²) of one (batch, group) of a channels_last input: `planes` holds the group's
/// `D` channels one after another (`hw` values each, as our contiguous tensor stores them),
/// summed in the order PyTorch's channels_last kernel walks its `(H·W, C)` memory.
///
/// * `hw < 1024` (`ColumnwiseMoments`, its parallel loop over (batch, group)): at each
///   position the group's channels in vectors of [`LANES`] (the last zero-padded), added to two
///   accumulators (`x` and `x·x`, the product rounded), then each reduced across lanes;
///   in half precision a vector is 16 channels, its two f32 halves added (and their squares,
///   each rounded, added) before the accumulator.
/// * `hw ≥ 1024` (`CalcMeanVar`, its parallel loop over batch and positions): each channel
///   summed over the positions on its own (`x + s`, `fmadd(x, x, q)`) in the position ranges
///   PyTorch's `threads` threads take (`at::parallel_for` over `batch · hw` positions, even
///   chunks), then per group channel by channel, thread by thread.
///
/// `first` is this batch's first position among the `batch · hw` (for the thread ranges).
pub(crate) fn columnwise<const FUSED: bool>(
    planes: &[f32],
    hw: usize,
    half: bool,
    (first, total, threads): (usize, usize, usize),
) -> (f32, f32) {
    let d = planes.len() / hw.max(1);
    if hw < 1024 {
        let width = if half { 2 * LANES } else { LANES };
        let vectors = d.div_ceil(width);
        let (mut s, mut q) = ([0f32; LANES], [0f32; LANES]);
        let mut v = vec![0f32; vectors * width];
        for m in 0..hw {
            for (c, x) in v.iter_mut().enumerate().take(d) {
                *x = planes[c * hw + m];
            }
            for x in v.chunks_exact(width) {
                if half {
                    let (lo, hi) = x.split_at(LANES);
                    for l in 0..LANES {
                        s[l] += lo[l] + hi[l];
                        q[l] += lo[l] * lo[l] + hi[l] * hi[l];
                    }
                } else {
                    for l in 0..LANES {
                        s[l] += x[l];
                        q[l] += x[l] * x[l];
                    }
                }
            }
        }
        return (reduce_lanes(&s), reduce_lanes(&q));
    }
    let threads = threads.clamp(1, total.max(1));
    let chunk = total.div_ceil(threads);
    let (mut sum, mut sq) = (0f32, 0f32);
    for plane in planes.chunks_exact(hw) {
        for t in 0..threads {
            let (lo, hi) = ((t * chunk).max(first), ((t + 1) * chunk).min(first + hw));
            let (mut s, mut q) = (0f32, 0f32);
            for &x in plane
                .get(lo.saturating_sub(first)..hi.saturating_sub(first))
                .unwrap_or(&[])
            {
                s += x;
                q = fma::<FUSED>(x, x, q);
            }
            sum += s;
            sq += q;
        }
    }
    (sum, sq)
}

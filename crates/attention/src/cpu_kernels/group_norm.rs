//! `nn.GroupNorm` on the CPU as PyTorch 2.x computes it (`aten/src/ATen/native/cpu/
//! group_norm_kernel.cpp`, PyTorch 2.15 measured), in one pass with the swish that follows.
//!
//! PyTorch has two CPU kernels and picks one by the input's memory format
//! (`X.suggest_memory_format()`), and the two round differently:
//!
//! * **contiguous** (`GroupNormKernelImplInternal`): the moments of each (batch, group) by
//!   `RowwiseMoments`, a cascaded Welford ([`super::moments::rowwise`]);
//! * **channels_last** (`GroupNormKernelImplChannelsLastInternal`): `Σx` and `Σx²` in f32
//!   ([`super::moments::columnwise`]), `mean = Σx·s` and `var = max(Σx²·s − mean², 0)` with
//!   `s = 1/(D·H·W)` (the product and the difference in one `fma` where the CPU has it). Where
//!   `|mean| ≫ std` this loses the variance to cancellation: PyTorch's output is then far less
//!   accurate than a two-pass variance, and a port that matches it must lose the same bits. A
//!   diffusers VAE-style `Attention` on a 4-D input returns a channels_last tensor
//!   (`transpose(-1, -2).reshape(b, c, h, w)`), and the convolutions, adds, interpolations and
//!   resnets after it keep that layout; the blocks pass [`MemoryFormat::ChannelsLast`] to the
//!   norms that see it.
//!
//! Both then take `rstd = 1/sqrt(var + eps)` in f64 (`eps` is a double), rounded to f32,
//! `scale = rstd·γ`, `shift = −scale·mean + β` and `y = x·scale + shift`, fused where PyTorch's
//! compiled loops fuse them (the contiguous kernel's shift always; the channels_last kernel's on
//! the channels its scale/shift loop runs vectorised, see [`vector_prefix`]).
//!
//! Bit identity with PyTorch 2.15 (x86-64 wheel, AVX2 kernels, `torch.set_num_threads(1)` as
//! the exporters run), measured on random f32 inputs with offset and outlier channels by
//! `group_norm_matches_pytorch` and `scripts/export_group_norm.py`: every mean, every rstd and
//! every output element of both kernels.

use super::moments::{columnwise, fma, rowwise};
use super::{scale_shift, swish_in_place, Swish};
use crate::cpu::isa::fma_reported;
use crate::cpu::{contiguous, cpu_slice};
use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

/// The memory format PyTorch's `suggest_memory_format` gives the input of a norm
/// (`torch.contiguous_format`, or `torch.channels_last` / `channels_last_3d`), which picks its
/// CPU GroupNorm kernel. Our tensors are always contiguous; the blocks say which layout
/// PyTorch's tensor has at that point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MemoryFormat {
    /// `torch.contiguous_format` (and any layout PyTorch copies to it: 3-D, 5-D permuted).
    #[default]
    Contiguous,
    /// `torch.channels_last` (NHWC strides of a 4-D tensor) or `channels_last_3d` (NDHWC).
    ChannelsLast,
}

impl MemoryFormat {
    /// The layout of what a diffusers `Attention` returns for a 4-D input `dims`
    /// `(B, C, H, W)`: `hidden_states.transpose(-1, -2).reshape(b, c, h, w) + residual`
    /// (`AttnProcessor2_0`, `AttnAddedKVProcessor`), and so of the convolutions, adds,
    /// interpolations and resnets after it. channels_last where PyTorch 2.15 suggests it: a
    /// batch of 2 or more and 2 or more positions (with one image the add's output gets a batch
    /// stride of `C`, which `suggest_memory_format` does not take for channels_last; with one
    /// position the two layouts are the same strides, and contiguous wins). Measured with hooks
    /// on every GroupNorm of the diffusers blocks at batch 1–4 and maps 1×1 to 8×8.
    pub fn of_attention_output(dims: &[usize]) -> Self {
        match dims {
            [b, _, h, w] if *b >= 2 && h * w >= 2 => MemoryFormat::ChannelsLast,
            _ => MemoryFormat::Contiguous,
        }
    }
}

/// The threads PyTorch's channels_last kernel splits a large feature map among (it adds their
/// partial sums in turn, so the count changes the rounding): 1, as every exporter runs
/// (`torch.set_num_threads(1)`, `--threads 1`, for byte-reproducible bundles).
const TORCH_THREADS: usize = 1;

/// How PyTorch computes one GroupNorm: its input's memory format and dtype (f16/bf16: PyTorch
/// reads 16 values a vector, the statistics stay f32; our input is then that upcast to f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormForm {
    pub format: MemoryFormat,
    pub input: DType,
}

impl Default for NormForm {
    /// A contiguous f32 input.
    fn default() -> Self {
        Self {
            format: MemoryFormat::Contiguous,
            input: DType::F32,
        }
    }
}

/// `nn.GroupNorm(groups, C, eps)` of an f32 CPU tensor `(B, C, ...)` with f32 `weight` and
/// `bias` `(C,)`, as PyTorch's contiguous CPU kernel computes it (see the module docs). `None`
/// where it does not apply (not CPU, not f32).
pub fn group_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, groups: usize, eps: f64) -> Result<Option<Tensor>> {
    group_norm_act(x, weight, bias, groups, eps, None)
}

/// [`group_norm`], then `act` of each rounded output in the same pass, where a separate
/// activation would be one more pass over the tensor and one more allocation.
pub fn group_norm_act(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f64,
    act: Option<Swish>,
) -> Result<Option<Tensor>> {
    group_norm_as(x, (weight, bias), (groups, eps), NormForm::default(), act)
}

/// [`group_norm_act`] computed as PyTorch's kernel for `form` computes it.
pub fn group_norm_as(
    x: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
    (groups, eps): (usize, f64),
    form: NormForm,
    act: Option<Swish>,
) -> Result<Option<Tensor>> {
    let all_cpu = x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu();
    let all_f32 = [x, weight, bias].iter().all(|t| t.dtype() == DType::F32);
    if !all_cpu || !all_f32 || x.rank() < 2 || groups == 0 {
        return Ok(None);
    }
    let (b, c) = (x.dim(0)?, x.dim(1)?);
    if !c.is_multiple_of(groups) || weight.elem_count() != c || bias.elem_count() != c {
        return Ok(None);
    }
    let x = contiguous(x)?;
    let w = weight.flatten_all()?.to_vec1::<f32>()?;
    let bi = bias.flatten_all()?.to_vec1::<f32>()?;
    let hw = x.elem_count() / (b * c).max(1);
    let per_group = c / groups * hw;
    let (storage, layout) = x.storage_and_layout();
    let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..x.elem_count()];
    let mut out = vec![0f32; src.len()];
    let fused = fma_reported();
    if per_group > 0 {
        out.par_chunks_mut(per_group)
            .zip(src.par_chunks(per_group))
            .enumerate()
            .for_each(|(bg, (dst, xs))| {
                let c0 = (bg % groups) * (c / groups);
                let group = Group {
                    hw,
                    channels: c,
                    first: bg / groups * hw,
                    total: b * hw,
                    weight: &w[c0..c0 + c / groups],
                    bias: &bi[c0..c0 + c / groups],
                    eps,
                    form,
                };
                if fused {
                    group.run_fused(xs, dst)
                } else {
                    group.run::<false>(xs, dst)
                }
                if let Some(act) = act {
                    swish_in_place(fused, act, dst);
                }
            });
    }
    drop(storage);
    Ok(Some(Tensor::from_vec(out, x.dims(), &Device::Cpu)?))
}

/// One (batch, group): its `D` channel planes of `hw` values.
struct Group<'a> {
    hw: usize,
    /// All the channels (`C`; the group has `weight.len()`).
    channels: usize,
    /// This batch's first position among the `total = B·hw` (PyTorch's thread ranges).
    first: usize,
    total: usize,
    weight: &'a [f32],
    bias: &'a [f32],
    eps: f64,
    form: NormForm,
}

impl Group<'_> {
    /// The kernel PyTorch runs: one channel is both layouts at once, and PyTorch's
    /// `suggest_memory_format` then says contiguous.
    fn format(&self) -> MemoryFormat {
        match self.channels {
            1 => MemoryFormat::Contiguous,
            _ => self.form.format,
        }
    }

    /// [`Self::run`] with fused multiply-adds, compiled for them.
    fn run_fused(&self, xs: &[f32], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            fn go(g: &Group, xs: &[f32], dst: &mut [f32]) {
                g.run::<true>(xs, dst)
            }
            // SAFETY: only called where `fma_reported` found AVX2 and FMA.
            unsafe { go(self, xs, dst) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.run::<true>(xs, dst)
    }

    /// Statistics, then `scale·x + shift` per channel into `dst`.
    #[inline(always)]
    fn run<const FUSED: bool>(&self, xs: &[f32], dst: &mut [f32]) {
        let d = self.weight.len();
        let half = matches!(self.form.input, DType::F16 | DType::BF16);
        let (mean, var, vectorised) = match self.format() {
            MemoryFormat::Contiguous => {
                let (mean, var) = rowwise::<FUSED>(xs, self.form.input);
                (mean, var, d)
            }
            MemoryFormat::ChannelsLast => {
                let place = (self.first, self.total, TORCH_THREADS);
                let (sum, sq) = columnwise::<FUSED>(xs, self.hw, half, place);
                let s = 1.0 / (d * self.hw) as f32;
                let mean = sum * s;
                let var = fma::<FUSED>(sq, s, -(mean * mean));
                // Half precision: the loop converting γ and β from half is not vectorised.
                (
                    mean,
                    var,
                    if half {
                        0
                    } else {
                        vector_prefix(d, self.channels, self.hw)
                    },
                )
            }
        };
        let rstd = (1.0 / (var.max(0.0) as f64 + self.eps).sqrt()) as f32;
        let planes = dst.chunks_mut(self.hw).zip(xs.chunks(self.hw));
        for (ci, (dst, xs)) in planes.enumerate() {
            let scale = rstd * self.weight[ci];
            let shift = if ci < vectorised {
                fma::<FUSED>(-scale, mean, self.bias[ci])
            } else {
                -scale * mean + self.bias[ci]
            };
            scale_shift(FUSED, xs, scale, shift, dst);
        }
    }
}

/// The channels of a group whose `shift` PyTorch 2.15's channels_last kernel computes fused:
/// its scale/shift loop over the group's `d` channels is compiled as 8-wide vectors, then one
/// 4-wide vector where 4 or more remain, then scalars (not fused); the vector loops only run
/// where the scale and shift buffers lie 8 or more values apart (`d` apart under 1024
/// positions, `C` from 1024 up). Measured: every shift bit for bit for `d` = 1–40, 64 and 72,
/// 1–3 groups, on both sides of 1024 positions.
fn vector_prefix(d: usize, c: usize, hw: usize) -> usize {
    let apart = if hw < 1024 { d } else { c };
    let v8 = d / 8 * 8;
    match (apart >= 8, d - v8 >= 4) {
        (false, _) => 0,
        (true, true) => v8 + 4,
        (true, false) => v8,
    }
}

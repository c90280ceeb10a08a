//! lucidrains' RMSNorm over the channels, `F.normalize(x, dim=1) * g * sqrt(C)`, with what his
//! ResNet `Block` does next (the FiLM `x * (scale + 1) + shift`, then SiLU) in the same pass:
//! the tensor-op chain is six full passes over the activations (divide, `· g`, `· sqrt(C)`, `·`,
//! `+`, SiLU), each a fresh allocation through Candle's broadcasting ops and its own thread pool.
//!
//! Each element takes the chain's own f32 steps in its order (`x / n`, `· g`, `· s + 0`, `· (a + 1)`,
//! `+ b`), so the normalised values are the chain's bits; the SiLU is the kernels' vectorised one
//! ([`super::Swish`], the attention kernel's `exp`, within 1 ulp), as after a GroupNorm.

use super::{swish_in_place, Swish};
use crate::cpu::isa::fma_reported;
use crate::cpu::{contiguous, cpu_slice};
use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

/// Positions per task of the sum-of-squares pass (each task walks every channel of its run).
const RUN: usize = 1024;

/// `F.normalize(x, dim=1) · g · scale`, then `· (film.0 + 1) + film.1` (each `(B, C)`) and `act`
/// where given, for an f32 CPU tensor `x` `(B, C, ...)` and `g` of `C` values; the norm is
/// `max(‖x‖₂, 1e-12)` over the channels at each position, its squares summed channel by channel
/// in f32 (as [`super::channel_sum_squares`]). `None` where it does not apply (not CPU, not f32,
/// rank below 2, shapes that do not fit).
pub fn rms_norm_act(
    x: &Tensor,
    g: &Tensor,
    scale: f64,
    film: Option<(&Tensor, &Tensor)>,
    act: Option<Swish>,
) -> Result<Option<Tensor>> {
    let mut tensors = vec![x, g];
    tensors.extend(film.iter().flat_map(|(a, b)| [*a, *b]));
    let applies = tensors.iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32);
    if !applies || x.rank() < 2 || x.elem_count() == 0 {
        return Ok(None);
    }
    let (b, c) = (x.dim(0)?, x.dim(1)?);
    let film_fits = film.is_none_or(|(a, s)| a.dims() == [b, c] && s.dims() == [b, c]);
    if g.elem_count() != c || !film_fits {
        return Ok(None);
    }
    let values = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
    let g = values(g)?;
    let film = match film {
        // `scale + 1` as Candle's affine computes it (`a · 1 + 1`), once per (item, channel).
        Some((a, s)) => Some((
            values(a)?.iter().map(|&a| a * 1.0 + 1.0).collect::<Vec<_>>(),
            values(s)?,
        )),
        None => None,
    };
    let x = contiguous(x)?;
    let spatial = x.elem_count() / (b * c);
    let (storage, layout) = x.storage_and_layout();
    let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..x.elem_count()];
    let norms = norms(src, c, spatial);
    let (fused, scale) = (fma_reported(), scale as f32);
    let mut out = vec![0f32; src.len()];
    out.par_chunks_mut(spatial)
        .zip(src.par_chunks(spatial))
        .enumerate()
        .for_each(|(row, (dst, xs))| {
            let (item, ch) = (row / c, row % c);
            let n = &norms[item * spatial..][..spatial];
            let gc = g[ch];
            for ((d, &v), &n) in dst.iter_mut().zip(xs).zip(n) {
                *d = v / n * gc;
            }
            // `ops::mul`: Candle's affine `y · s + 0`, left out for a scale of 1.
            if scale != 1.0 {
                dst.iter_mut().for_each(|d| *d = *d * scale + 0.0);
            }
            if let Some((plus_one, shift)) = &film {
                let (a, s) = (plus_one[row], shift[row]);
                dst.iter_mut().for_each(|d| *d = *d * a + s);
            }
            if let Some(act) = act {
                swish_in_place(fused, act, dst);
            }
        });
    drop(storage);
    Ok(Some(Tensor::from_vec(out, x.dims(), &Device::Cpu)?))
}

/// `max(sqrt(Σ_c x²), 1e-12)` per (item, position), `(B, spatial)` of `(B, c, spatial)`: runs
/// of positions in parallel, each summing its channels in order.
fn norms(src: &[f32], c: usize, spatial: usize) -> Vec<f32> {
    let mut out = vec![0f32; src.len() / c];
    out.par_chunks_mut(spatial).enumerate().for_each(|(item, per_item)| {
        let image = &src[item * c * spatial..][..c * spatial];
        per_item.par_chunks_mut(RUN).enumerate().for_each(|(r, acc)| {
            for row in image.chunks_exact(spatial) {
                for (a, &v) in acc.iter_mut().zip(&row[r * RUN..]) {
                    *a += v * v;
                }
            }
            for a in acc.iter_mut() {
                // `clamp_min(1e-12)`, keeping a NaN as PyTorch's does.
                let s = a.sqrt();
                *a = if s < 1e-12 { 1e-12 } else { s };
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(dims: &[usize], seed: u64) -> Tensor {
        crate::test_support::seeded_randn(dims, seed)
    }

    /// The pass against the tensor-op chain it replaces: the normalised and FiLM-ed values bit
    /// for bit, the SiLU within a few ulp; position runs longer than one task, one channel
    /// (scale 1), a batch, zero columns (the norm's floor).
    #[test]
    fn rms_norm_act_matches_the_chain() {
        for (dims, with_film) in [
            (vec![2usize, 5, 3, 7], true),
            (vec![1, 8, 33, 40], true),
            (vec![3, 1, 4, 4], false),
            (vec![2, 6, 1030], false),
        ] {
            let (b, c) = (dims[0], dims[1]);
            let mut x = randn(&dims, 1);
            if dims.len() == 4 {
                // A zero column: every channel of position 0.
                let keep = Tensor::ones(&dims[..], DType::F32, &Device::Cpu).unwrap();
                let mask = keep.narrow(3, 0, 1).unwrap().zeros_like().unwrap();
                let mask = Tensor::cat(&[&mask, &keep.narrow(3, 1, dims[3] - 1).unwrap()], 3).unwrap();
                x = (x * mask).unwrap();
            }
            let mut g_dims = vec![1; dims.len()];
            g_dims[1] = c;
            let g = randn(&g_dims, 2);
            let scale = (c as f64).sqrt();
            let film = (randn(&[b, c], 3), randn(&[b, c], 4));
            let film = with_film.then_some((&film.0, &film.1));
            // The chain: F.normalize by Candle's ops, `· g`, `· scale`, FiLM, SiLU.
            let norm = x.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
            let norm = norm.clamp(1e-12, f64::INFINITY).unwrap();
            // `ops::mul` (an affine) and `layers::scale_shift`, written out in Candle's ops.
            let mut want = x.broadcast_div(&norm).unwrap().broadcast_mul(&g).unwrap();
            if scale != 1.0 {
                want = want.affine(scale, 0.0).unwrap();
            }
            if let Some((a, s)) = film {
                let map = |t: &Tensor| {
                    let mut d = t.dims().to_vec();
                    d.extend(vec![1; dims.len() - 2]);
                    t.reshape(d).unwrap()
                };
                want = want.broadcast_mul(&(map(a) + 1.0).unwrap()).unwrap();
                want = want.broadcast_add(&map(s)).unwrap();
            }
            let got = rms_norm_act(&x, &g, scale, film, None).unwrap().unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(got.dims(), &dims[..]);
            assert_eq!(bits(&got), bits(&want), "{dims:?}");
            let silu = rms_norm_act(&x, &g, scale, film, Some(Swish::Silu)).unwrap().unwrap();
            let want = candle_nn::ops::silu(&want).unwrap();
            let diff = (silu - &want)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mag = want.abs().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (d, m) in diff.iter().zip(&mag) {
                assert!(
                    *d <= 4.0 * f32::EPSILON * m.max(f32::MIN_POSITIVE),
                    "{dims:?}: {d} at {m}"
                );
            }
        }
    }

    /// Other dtypes, devices' tensors and misfitting shapes are left to the tensor ops.
    #[test]
    fn rms_norm_act_declines_what_it_does_not_fit() {
        let x = randn(&[1, 4, 3, 3], 5);
        let g = randn(&[1, 4, 1, 1], 6);
        assert!(rms_norm_act(&x.to_dtype(DType::F16).unwrap(), &g, 2.0, None, None)
            .unwrap()
            .is_none());
        assert!(rms_norm_act(&x, &randn(&[1, 3, 1, 1], 7), 2.0, None, None)
            .unwrap()
            .is_none());
        let bad = randn(&[1, 3], 8);
        assert!(rms_norm_act(&x, &g, 2.0, Some((&bad, &bad)), None).unwrap().is_none());
        assert!(rms_norm_act(&randn(&[4], 9), &g, 2.0, None, None).unwrap().is_none());
    }
}

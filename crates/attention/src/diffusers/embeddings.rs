//! diffusers' `SinusoidalPositionalEmbedding` (`models/embeddings.py`, 0.42.1), the
//! `positional_embeddings="sinusoidal"` option of `BasicTransformerBlock`: AnimateDiff's motion
//! modules add it to the normed tokens (the frames of a pixel) before `attn1` and `attn2`.
//!
//! ```text
//! __init__(embed_dim, max_seq_length=32):
//!   pe = zeros(1, max_seq_length, embed_dim); pe[0, :, 0::2] = sin(pos * div); pe[0, :, 1::2] = cos(pos * div)
//!   register_buffer("pe", pe)                        # persistent: the table is in the state dict
//! forward(x):                                        # x (B, seq_length, embed_dim)
//!   return x + pe[:, :seq_length]
//! ```
//!
//! The buffer is persistent, so `save_pretrained` writes it (`<block>.pos_embed.pe`) and
//! `from_pretrained` loads it over the computed table: the table is read from the checkpoint
//! (its shape checked: one of another length is an error, as diffusers' size-mismatch error).
//! A checkpoint without it (the original AnimateDiff files' `pos_encoder.pe` are dropped by
//! diffusers' converter) gets the constructor's table, computed here as PyTorch computes it
//! ([`SinusoidalPositionalEmbedding::table`]), as `from_pretrained` keeps it then (it warns that
//! the key was "newly initialized"). diffusers' constructor fails for an odd `embed_dim` (the cosine half is one column
//! short), and `forward` on more tokens than `max_seq_length` fails to broadcast: both are
//! errors here too.

use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

/// `diffusers.models.embeddings.SinusoidalPositionalEmbedding`: the `pe` table `(1,
/// max_seq_length, embed_dim)` from the checkpoint.
#[derive(Debug, Clone)]
pub struct SinusoidalPositionalEmbedding {
    pe: Tensor,
    max_seq_length: usize,
    /// The block named in errors.
    block: &'static str,
}

impl SinusoidalPositionalEmbedding {
    pub const BLOCK: &'static str = "diffusers.SinusoidalPositionalEmbedding";

    /// `SinusoidalPositionalEmbedding(embed_dim, max_seq_length)` with its `pe` buffer loaded
    /// from `vb` (`<prefix>.pe`); `block` names the block in errors.
    pub fn load(vb: VarBuilder, block: &'static str, embed_dim: usize, max_seq_length: usize) -> Result<Self> {
        if !embed_dim.is_multiple_of(2) {
            return Err(Error::config(
                block,
                format!(
                    "positional_embeddings \"sinusoidal\" on an odd width {embed_dim}: diffusers' \
                     SinusoidalPositionalEmbedding fails to build (its cosine columns are one short)"
                ),
            ));
        }
        let name = format!("{}.pe", vb.prefix());
        if !vb.contains_tensor("pe") {
            // diffusers' from_pretrained keeps the constructor's table then ("newly initialized").
            let pe = Self::table(embed_dim, max_seq_length, vb.device())?.to_dtype(vb.dtype())?;
            return Ok(Self {
                pe,
                max_seq_length,
                block,
            });
        }
        let shape = vec![1, max_seq_length, embed_dim];
        // Asked for by its shape: a backend that knows it before reading refuses a wrong one unread.
        let pe = match vb.get_with_hints_dtype(shape, "pe", candle_nn::Init::Const(0.), vb.dtype()) {
            Ok(pe) => pe,
            Err(e) => match crate::layers::unexpected_shape(&e) {
                Some(got) => {
                    return Err(Error::WeightShape {
                        block,
                        name,
                        expected: format!("(1, {max_seq_length}, {embed_dim}) (1, max_seq_length, embed_dim)"),
                        found: got.dims().to_vec(),
                    })
                }
                None => return Err(e.into()),
            },
        };
        Ok(Self {
            pe,
            max_seq_length,
            block,
        })
    }

    /// The constructor's table `(1, max_seq_length, embed_dim)` in float32, computed as PyTorch
    /// does: `div = exp(arange(0, D, 2) * (-ln 10000 / D))` (the product in float64, rounded to
    /// float32, as PyTorch multiplies an int64 tensor by a Python float), `pos * div` in float32,
    /// `sin` in the even columns, `cos` in the odd ones. The exp (here in float64), sin and cos
    /// (Rust's float32 ones) round differently from PyTorch's vectorized ones at times, by one unit
    /// in the last place, so the tables differ by that: against diffusers 0.42.1 on torch 2.15, at
    /// most 1.9e-6 on a 1280 × 32 table (a `div` one unit off, times position 31), 6e-8 on 8 × 6.
    pub fn table(embed_dim: usize, max_seq_length: usize, device: &candle_core::Device) -> Result<Tensor> {
        // `arange(0, D, 2)` (int64) times the Python float: computed in float64, rounded to float32.
        let scale = -(10000f64.ln()) / embed_dim as f64;
        let exp = |i: usize| (((i as f64 * scale) as f32) as f64).exp() as f32;
        let div: Vec<f32> = (0..embed_dim).step_by(2).map(exp).collect();
        let mut pe = vec![0f32; max_seq_length * embed_dim];
        for (pos, row) in pe.chunks_mut(embed_dim).enumerate() {
            for (j, d) in div.iter().enumerate() {
                let angle = pos as f32 * d;
                row[2 * j] = angle.sin();
                if 2 * j + 1 < embed_dim {
                    row[2 * j + 1] = angle.cos();
                }
            }
        }
        Ok(Tensor::from_vec(pe, (1, max_seq_length, embed_dim), device)?)
    }

    /// [`Self::load`] where `max_seq_length` is given (a transformer block's optional `pos_embed`).
    pub fn load_for(
        vb: VarBuilder,
        block: &'static str,
        embed_dim: usize,
        max_seq_length: Option<usize>,
    ) -> Result<Option<Self>> {
        max_seq_length.map(|n| Self::load(vb, block, embed_dim, n)).transpose()
    }

    /// `x` with `pe` added where there is one (a transformer block's optional `pos_embed`).
    pub fn add(pe: Option<&Self>, x: Tensor) -> Result<Tensor> {
        match pe {
            Some(pe) => pe.forward(&x),
            None => Ok(x),
        }
    }

    /// `x + pe[:, :seq_length]` on `x` `(B, seq_length, embed_dim)`, in `x`'s dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let n = x.dim(1)?;
        if n > self.max_seq_length {
            return Err(Error::input(
                self.block,
                "hidden_states",
                format!(
                    "{n} positions (the frames, for a motion module) but the sinusoidal table has max_seq_length {} \
                     (temporal_max_seq_length / motion_max_seq_length); PyTorch fails to broadcast",
                    self.max_seq_length
                ),
            ));
        }
        let pe = self.pe.narrow(1, 0, n)?.to_dtype(x.dtype())?;
        Ok(x.broadcast_add(&pe)?)
    }
}

/// `BasicTransformerBlock`'s `positional_embeddings` as its constructor reads it: the sinusoidal
/// table's length, or `None`. Any value needs `num_positional_embeddings` (a `ValueError`
/// otherwise); `"sinusoidal"` adds a [`SinusoidalPositionalEmbedding`], and any other string is
/// ignored, as diffusers ignores it.
pub fn sinusoidal_length(block: &'static str, kind: &Option<String>, length: Option<usize>) -> Result<Option<usize>> {
    match (kind.as_deref(), length) {
        (None | Some(""), _) => Ok(None),
        (Some(_), None) => Err(Error::config(
            block,
            "positional_embeddings is set without num_positional_embeddings (diffusers raises ValueError)",
        )),
        (Some("sinusoidal"), Some(n)) => Ok(Some(n)),
        (Some(_), Some(_)) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use std::collections::HashMap;

    /// The computed table is the sinusoid (checked in f64), and a checkpoint without `pe` gets it.
    #[test]
    fn missing_pe_gets_the_constructors_table() {
        let dev = Device::Cpu;
        let (d, n) = (8, 6);
        let vb = VarBuilder::from_tensors(HashMap::new(), DType::F32, &dev);
        let emb = SinusoidalPositionalEmbedding::load(vb.pp("pos_embed"), "test", d, n).unwrap();
        let got = emb.pe.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for pos in 0..n {
            for i in 0..d {
                let div = ((i - i % 2) as f64 * -(10000f64.ln()) / d as f64).exp();
                let want = if i % 2 == 0 {
                    (pos as f64 * div).sin()
                } else {
                    (pos as f64 * div).cos()
                };
                assert!((got[pos * d + i] as f64 - want).abs() < 1e-6, "{pos} {i}");
            }
        }
        // More positions than the table: an error naming the length.
        let x = Tensor::zeros((2, n + 1, d), DType::F32, &dev).unwrap();
        let e = emb.forward(&x).unwrap_err().to_string();
        assert!(e.contains("max_seq_length 6"), "{e}");
        let x = Tensor::zeros((2, 3, d), DType::F32, &dev).unwrap();
        let y = emb.forward(&x).unwrap();
        assert_eq!(y.dims(), &[2, 3, d]);
    }

    #[test]
    fn positional_embeddings_are_read_as_diffusers_reads_them() {
        assert_eq!(sinusoidal_length("t", &None, None).unwrap(), None);
        assert_eq!(
            sinusoidal_length("t", &Some("sinusoidal".into()), Some(32)).unwrap(),
            Some(32)
        );
        assert_eq!(sinusoidal_length("t", &Some("learned".into()), Some(32)).unwrap(), None);
        let e = sinusoidal_length("t", &Some("sinusoidal".into()), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_positional_embeddings"), "{e}");
    }

    /// A table of another length or width is a shape error naming the key; an odd width cannot
    /// be built.
    #[test]
    fn pe_shape_is_checked() {
        let dev = Device::Cpu;
        let mut t = HashMap::new();
        t.insert("m.pe".to_string(), Tensor::zeros((1, 4, 8), DType::F32, &dev).unwrap());
        let vb = VarBuilder::from_tensors(t, DType::F32, &dev);
        let e = SinusoidalPositionalEmbedding::load(vb.pp("m"), "test", 8, 6)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.pe") && e.contains("[1, 4, 8]") && e.contains("(1, 6, 8)"),
            "{e}"
        );
        let e = SinusoidalPositionalEmbedding::load(vb.pp("m"), "test", 7, 6)
            .unwrap_err()
            .to_string();
        assert!(e.contains("odd width 7"), "{e}");
    }
}

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
//! (its shape checked), never recomputed here, and a checkpoint without it is an error naming
//! the key. diffusers' constructor fails for an odd `embed_dim` (the cosine half is one column
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
            return Err(Error::config(
                block,
                format!(
                    "weight `{name}` is missing: SinusoidalPositionalEmbedding's `pe` is a persistent buffer, which \
                     diffusers writes to every checkpoint it saves and loads from it; expected (1, {max_seq_length}, \
                     {embed_dim})"
                ),
            ));
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
        Ok(Self { pe, max_seq_length })
    }

    /// `x + pe[:, :seq_length]` on `x` `(B, seq_length, embed_dim)`, in `x`'s dtype.
    pub fn forward(&self, block: &'static str, x: &Tensor) -> Result<Tensor> {
        let n = x.dim(1)?;
        if n > self.max_seq_length {
            return Err(Error::input(
                block,
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

use super::{entry, run_module, BlockInfo, ConfigRead, Inputs, Registered};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde_json::Value;
use unet_attention::textbook::{MultiHeadAttention, SelfAttention};
use unet_attention::Result;

pub(super) fn entries() -> Vec<BlockInfo> {
    vec![entry::<SelfAttention>(), entry::<MultiHeadAttention>()]
}

impl Registered for SelfAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "Self_Attention(Dx, D, Dv) (sword4869 attention notes §2.1, the textbook \"Attention Is All You Need\" self-attention)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[2, 3])
    }
}

impl Registered for MultiHeadAttention {
    const ID: &'static str = Self::BLOCK;
    const PYTORCH: &'static str = "MultiHead_Attention(input_dim, nh, dh) / MultiHead_Attention(input_dim, d_all, nh) (sword4869 attention notes §3.1 = datnnt1997/multi-head_self-attention)";
    const INPUTS: &'static [&'static str] = &["x"];

    fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
        Self::new(vb, &read.config(Self::ID, config)?)
    }

    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        run_module(self, inputs, &[3])
    }
}

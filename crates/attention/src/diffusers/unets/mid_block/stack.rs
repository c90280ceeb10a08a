//! [`MidStack`]: the layer loop every diffusers U-Net mid block shares, with its trace scopes.
//!
//! ```text
//! h = resnets[0](h, temb)
//! for attn, resnet in zip(attentions, resnets[1:]): h = attn(h, ...); h = resnet(h, temb)
//! ```
//!
//! `UNetMidBlock2D`, `UNetMidBlock2DCrossAttn`, `UNetMidBlock2DSimpleCrossAttn`,
//! `UNetMidBlock3DCrossAttn`, `UNetMidBlockCrossAttnMotion` and `UNetMidBlockSpatioTemporal`
//! (diffusers 0.42.1) run this loop; each calls its own layers (their forwards take different
//! arguments) through the closures of [`MidStack::forward`], and the stack runs them inside the
//! scopes named like the PyTorch submodules: `resnets.0`, then `attentions.i` and
//! `resnets.(i+1)`. Blocks with a layer after the attention or the resnet (the 3D block's
//! `temp_attentions.i` / `temp_convs.i`, the motion block's `motion_modules.i`) run it in
//! [`MidStack::forward_then`]'s `then`, outside those scopes, in a scope of its own.

use crate::trace;
use crate::Result;
use candle_core::Tensor;

/// The layer the loop has just run, given to [`MidStack::forward_then`]'s `then`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `resnets.i` ran.
    Resnet(usize),
    /// `attentions.i` ran.
    Attention(usize),
}

/// `resnets` (one more than `attentions`) and `attentions`, run as the module docs show.
#[derive(Debug, Clone)]
pub(crate) struct MidStack<R, A> {
    resnets: Vec<R>,
    attentions: Vec<A>,
}

impl<R, A> MidStack<R, A> {
    /// The stack of `resnets[0]` and the `(attentions[i], resnets[i + 1])` pairs; the blocks
    /// build their layers in diffusers' order and hand them over.
    pub(crate) fn new(resnets: Vec<R>, attentions: Vec<A>) -> Self {
        assert_eq!(
            resnets.len(),
            attentions.len() + 1,
            "a mid block has one resnet more than attentions"
        );
        Self { resnets, attentions }
    }

    pub(crate) fn attentions(&self) -> &[A] {
        &self.attentions
    }

    pub(crate) fn attentions_mut(&mut self) -> &mut [A] {
        &mut self.attentions
    }

    /// The parts, to rebuild the stack with other attentions.
    pub(crate) fn into_parts(self) -> (Vec<R>, Vec<A>) {
        (self.resnets, self.attentions)
    }

    /// Run the loop: `resnet(layer, h)` in the `resnets.i` scopes, `attention(layer, h)` in the
    /// `attentions.i` scopes. Records nothing itself (the block records its `output`).
    pub(crate) fn forward(
        &self,
        hidden_states: &Tensor,
        resnet: impl FnMut(&R, &Tensor) -> Result<Tensor>,
        attention: impl FnMut(&A, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        self.forward_then(hidden_states, resnet, attention, |_, h| Ok(h))
    }

    /// [`Self::forward`] with `then(step, h)` run after each resnet and attention, outside
    /// their scopes: the layers a block runs after them (in scopes of their own).
    pub(crate) fn forward_then(
        &self,
        hidden_states: &Tensor,
        mut resnet: impl FnMut(&R, &Tensor) -> Result<Tensor>,
        mut attention: impl FnMut(&A, &Tensor) -> Result<Tensor>,
        mut then: impl FnMut(Step, Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let h = trace::scope("resnets.0", || resnet(&self.resnets[0], hidden_states))?;
        let mut h = then(Step::Resnet(0), h)?;
        for (i, (attn, res)) in self.attentions.iter().zip(&self.resnets[1..]).enumerate() {
            let a = trace::scope_at("attentions", i, || attention(attn, &h))?;
            h = then(Step::Attention(i), a)?;
            let r = trace::scope_at("resnets", i + 1, || resnet(res, &h))?;
            h = then(Step::Resnet(i + 1), r)?;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The stages are named as the blocks named them before the stack: `resnets.0`,
    /// `attentions.i`, then what `then` records, then `resnets.(i+1)`.
    #[test]
    fn scopes_and_order() {
        let x = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap();
        let stack = MidStack::new(vec![1.0, 2.0, 3.0], vec![10.0, 20.0]);
        let ((), stages) = trace::with_trace(|| {
            let out = stack
                .forward_then(
                    &x,
                    |r, h| {
                        let y = (h + *r)?;
                        trace::record("output", &y);
                        Ok(y)
                    },
                    |a, h| {
                        let y = (h * *a)?;
                        trace::record("output", &y);
                        Ok(y)
                    },
                    |step, h| {
                        if let Step::Attention(i) = step {
                            trace::scope_at("extra", i, || trace::record("output", &h));
                        }
                        Ok(h)
                    },
                )
                .unwrap();
            // ((0 + 1) * 10 + 2) * 20 + 3
            assert_eq!(out.to_vec1::<f32>().unwrap(), vec![243.0, 243.0]);
        });
        let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "resnets.0/output",
                "attentions.0/output",
                "extra.0/output",
                "resnets.1/output",
                "attentions.1/output",
                "extra.1/output",
                "resnets.2/output"
            ]
        );
    }
}

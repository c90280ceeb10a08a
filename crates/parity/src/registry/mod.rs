//! The registry: every block id the parity tool knows, how to build it from a bundle's config
//! and weights, and how to feed it the bundle's inputs. The rest of the crate knows blocks only
//! through [`all`] and [`find`].

/// The [`BuildFn`] of a block whose constructor is `new(vb, &config)` with the config read from
/// `parity.config` by [`unet_attention::config::from_json`] (unknown keys refused).
macro_rules! from_config {
    ($block:ident) => {
        |vb, cfg| {
            let cfg = unet_attention::config::from_json($block::BLOCK, cfg)?;
            Ok(Box::new($block::new(vb, &cfg)?))
        }
    };
}

mod annotated_diffusion;
mod ddpm;
mod diffusers;
mod diffusers_mid;
mod diffusers_transformer;
mod fastai;
mod ldm;
mod ldm_vae;
mod openai;
mod textbook;
mod torch;

use candle_core::Tensor;
use candle_nn::VarBuilder;
use std::collections::BTreeMap;
use unet_attention::{Error, Result};

/// A built block, ready to run on a bundle's inputs.
pub trait Runnable {
    /// Run the forward; outputs in the order the PyTorch forward returns them.
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>>;
}

/// Builds a block from its weights and the JSON object of constructor kwargs.
pub type BuildFn = fn(VarBuilder, &serde_json::Value) -> Result<Box<dyn Runnable>>;

/// One registry entry.
pub struct BlockInfo {
    /// The block id written in bundles (`parity.block`).
    pub id: &'static str,
    /// The PyTorch class and version the block matches.
    pub pytorch: &'static str,
    /// The forward's tensor inputs, by their PyTorch names, in forward order.
    pub inputs: &'static [&'static str],
    /// The forward's non-tensor arguments the block honours (`parity.kwargs`).
    pub kwargs: &'static [&'static str],
    pub build: BuildFn,
}

impl BlockInfo {
    /// Whether `name` is one of the forward's inputs. An entry `name.*` stands for a Python
    /// list input stored element by element as `name.0`, `name.1`, ...
    pub fn accepts_input(&self, name: &str) -> bool {
        self.inputs.iter().any(|i| match i.strip_suffix(".*") {
            Some(list) => name
                .strip_prefix(list)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())),
            None => *i == name,
        })
    }
}

/// Every registered block.
pub fn all() -> Vec<BlockInfo> {
    [
        ddpm::entries(),
        annotated_diffusion::entries(),
        ldm::entries(),
        ldm_vae::entries(),
        openai::entries(),
        diffusers::entries(),
        diffusers_transformer::entries(),
        diffusers_mid::entries(),
        fastai::entries(),
        torch::entries(),
        textbook::entries(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The entry for `id`, if any.
pub fn find(id: &str) -> Option<BlockInfo> {
    all().into_iter().find(|b| b.id == id)
}

/// A bundle's forward inputs and non-tensor arguments, as a block sees them.
pub struct Inputs {
    pub block: &'static str,
    pub tensors: BTreeMap<String, Tensor>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Inputs {
    /// An optional tensor input.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// A required tensor input.
    pub fn required(&self, name: &str) -> Result<&Tensor> {
        self.get(name)
            .ok_or_else(|| Error::input(self.block, name, "required input is missing from the bundle"))
    }

    /// The first of `names` present (for blocks whose PyTorch classes name the input differently).
    pub fn one_of(&self, names: &[&str]) -> Result<&Tensor> {
        names.iter().find_map(|n| self.get(n)).ok_or_else(|| {
            Error::input(
                self.block,
                &names.join("` or `"),
                "required input is missing from the bundle",
            )
        })
    }

    /// A list input stored as `name.0`, `name.1`, ... (empty when absent).
    pub fn list(&self, name: &str) -> Vec<&Tensor> {
        (0..).map_while(|i| self.get(&format!("{name}.{i}"))).collect()
    }

    /// A boolean forward argument, `default` when absent.
    pub fn flag(&self, name: &str, default: bool) -> Result<bool> {
        match self.kwargs.get(name) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(other) => Err(Error::input(
                self.block,
                name,
                format!("expected a boolean, found {other}"),
            )),
        }
    }

    /// A numeric forward argument (`conditioning_scale`), `default` when absent.
    pub fn number(&self, name: &str, default: f64) -> Result<f64> {
        match self.kwargs.get(name) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(serde_json::Value::Number(n)) => n
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| Error::input(self.block, name, format!("expected a finite number, found {n}"))),
            Some(other) => Err(Error::input(
                self.block,
                name,
                format!("expected a number, found {other}"),
            )),
        }
    }

    /// A count forward argument (`num_frames`): a whole number ≥ 1, `default` when absent.
    pub fn count(&self, name: &str, default: usize) -> Result<usize> {
        match self.kwargs.get(name) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .filter(|&k| k >= 1)
                .and_then(|k| usize::try_from(k).ok())
                .ok_or_else(|| Error::input(self.block, name, format!("expected a whole number ≥ 1, found {n}"))),
            Some(other) => Err(Error::input(
                self.block,
                name,
                format!("expected a whole number, found {other}"),
            )),
        }
    }

    /// Check that an input has the rank the block expects.
    pub fn rank(&self, name: &str, t: &Tensor, ranks: &[usize]) -> Result<()> {
        if ranks.contains(&t.rank()) {
            Ok(())
        } else {
            Err(Error::input(
                self.block,
                name,
                format!("expected rank {ranks:?}, found shape {:?}", t.dims()),
            ))
        }
    }
}

/// Adapter for blocks that are a `Module` on one input tensor.
pub(crate) struct Single<M> {
    pub module: M,
    /// Accepted names of the single input (the PyTorch forward's parameter name).
    pub names: &'static [&'static str],
    pub ranks: &'static [usize],
}

impl<M: candle_core::Module> Runnable for Single<M> {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        let x = inputs.one_of(self.names)?;
        inputs.rank(self.names[0], x, self.ranks)?;
        Ok(vec![self.module.forward(x)?])
    }
}

/// Build a `Single` adapter from a config type and a constructor.
pub(crate) fn single<C, M>(
    block: &'static str,
    vb: VarBuilder,
    config: &serde_json::Value,
    names: &'static [&'static str],
    ranks: &'static [usize],
    new: fn(VarBuilder, &C) -> Result<M>,
) -> Result<Box<dyn Runnable>>
where
    C: serde::de::DeserializeOwned,
    M: candle_core::Module + 'static,
{
    let cfg: C = unet_attention::config::from_json(block, config)?;
    Ok(Box::new(Single {
        module: new(vb, &cfg)?,
        names,
        ranks,
    }))
}

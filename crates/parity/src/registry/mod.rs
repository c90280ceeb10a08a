//! The registry: every block id the parity tool knows, how to build it from a bundle's config
//! and weights, and how to feed it the bundle's inputs. The rest of the crate knows blocks only
//! through [`all`] and [`find`].
//!
//! Each block is declared once, by one `impl` [`Registered`] in its family's file (`ddpm.rs`,
//! `diffusers_mid.rs`, ...): its id, the PyTorch class it matches, the forward's inputs and
//! non-tensor arguments, how it is built and how it runs sit together in that impl. The family's
//! `entries()` lists its blocks, one [`entry`] line each, in the order `unet-parity blocks`
//! prints them. Adding a block to the registry is that impl and that line (a new family: its
//! file here, its `mod` line and its `entries()` in [`all`]).
//!
//! The rest of the crate holds a built block as a `Box<dyn Runnable>` and reads an entry as a
//! [`BlockInfo`]; every `Registered` block is [`Runnable`], and [`entry`] makes its `BlockInfo`.
//! A block that is a `Module` on one tensor runs with `run_module` (its `INPUTS` name the
//! tensor: first the PyTorch forward's name, then any other class's name for it).
//!
//! ```text
//! impl Registered for UNetMidBlock2D {
//!     const ID: &'static str = Self::BLOCK;
//!     const PYTORCH: &'static str = "diffusers...UNetMidBlock2D (diffusers 0.22 – 0.42.1)";
//!     const INPUTS: &'static [&'static str] = &["hidden_states", "temb"];
//!
//!     fn build(vb: VarBuilder, config: &Value, read: ConfigRead) -> Result<Self> {
//!         Self::new(vb, &read.config(Self::ID, config)?)
//!     }
//!
//!     fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
//!         Ok(vec![self.forward(inputs.required("hidden_states")?, inputs.get("temb"))?])
//!     }
//! }
//! ```

mod annotated_diffusion;
mod ddpm;
mod diffusers;
mod diffusers_mid;
mod diffusers_transformer;
mod fastai;
mod ldm;
mod ldm_vae;
mod models;
mod openai;
mod textbook;
mod torch;

use candle_core::Tensor;
use candle_nn::VarBuilder;
use std::collections::BTreeMap;
use unet_attention::{Error, Result};

/// One block the parity tool can check, declared once: what a bundle of it holds, how to build
/// it and how to run it.
pub trait Registered: Sized + 'static {
    /// The block id written in bundles (`parity.block`): the block's own `BLOCK`.
    const ID: &'static str;
    /// The PyTorch class and version the block matches.
    const PYTORCH: &'static str;
    /// The forward's tensor inputs, by their PyTorch names, in forward order; `name.*` stands for
    /// a Python list input stored element by element (see [`BlockInfo::accepts_input`]).
    const INPUTS: &'static [&'static str];
    /// The forward's non-tensor arguments the block honours (`parity.kwargs`); none by default.
    const KWARGS: &'static [&'static str] = &[];

    /// Build the block from its weights and the JSON object of constructor kwargs
    /// (`parity.config`), read into the block's config type by `read` (always
    /// `Self::new(vb, &read.config(Self::ID, config)?)` unless the block needs more).
    fn build(vb: VarBuilder, config: &serde_json::Value, read: ConfigRead) -> Result<Self>;

    /// Run the forward; outputs in the order the PyTorch forward returns them.
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>>;
}

/// A built block, ready to run on a bundle's inputs.
pub trait Runnable {
    /// Run the forward; outputs in the order the PyTorch forward returns them.
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>>;
}

impl<T: Registered> Runnable for T {
    fn run(&self, inputs: &Inputs) -> Result<Vec<Tensor>> {
        Registered::run(self, inputs)
    }
}

/// How [`Registered::build`] reads the JSON kwargs into the block's own config type (the type
/// is the one its constructor takes, so `read.config(..)` needs no annotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigRead {
    /// [`unet_attention::config::from_json`]: a JSON object, unknown keys refused, every integer
    /// within the JSON bound. What bundles and model configs get ([`BlockInfo::build`]).
    Bounded,
    /// serde alone, as a config built in Rust reaches the constructor: only the constructor's own
    /// checks stand between a huge integer and an allocation ([`BlockInfo::build_unbounded`];
    /// the library-errors test builds every registered block this way with one integer at 2^33).
    Unbounded,
}

impl ConfigRead {
    /// The kwargs as the config type `C`; errors name the block.
    pub fn config<C: serde::de::DeserializeOwned>(self, block: &'static str, kwargs: &serde_json::Value) -> Result<C> {
        match self {
            ConfigRead::Bounded => unet_attention::config::from_json(block, kwargs),
            ConfigRead::Unbounded => {
                serde_json::from_value(kwargs.clone()).map_err(|e| Error::config(block, e.to_string()))
            }
        }
    }
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
    /// Builds the block: its [`Registered::build`] with [`ConfigRead::Bounded`], boxed.
    pub build: BuildFn,
    /// The same with [`ConfigRead::Unbounded`]: the kwargs reach the constructor as a config
    /// built in Rust would.
    pub build_unbounded: BuildFn,
}

/// The registry entry of the block `T`.
pub fn entry<T: Registered>() -> BlockInfo {
    BlockInfo {
        id: T::ID,
        pytorch: T::PYTORCH,
        inputs: T::INPUTS,
        kwargs: T::KWARGS,
        build: |vb, config| Ok(Box::new(T::build(vb, config, ConfigRead::Bounded)?)),
        build_unbounded: |vb, config| Ok(Box::new(T::build(vb, config, ConfigRead::Unbounded)?)),
    }
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
        models::entries(),
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

/// The `run` of a block that is a `Module` on one input tensor: the first of its [`Registered::INPUTS`]
/// present (the PyTorch forward's parameter name, or another class's name for it), of one of
/// `ranks`.
pub(crate) fn run_module<M>(block: &M, inputs: &Inputs, ranks: &[usize]) -> Result<Vec<Tensor>>
where
    M: Registered + candle_core::Module,
{
    let x = inputs.one_of(M::INPUTS)?;
    inputs.rank(M::INPUTS[0], x, ranks)?;
    Ok(vec![block.forward(x)?])
}

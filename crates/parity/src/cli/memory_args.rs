//! `--max-memory`: the memory one bundle may take, checked before it is read ([`crate::memory`]).

use crate::bundle::Load;
use crate::error::ParityError;
use crate::memory::Limit;
use clap::Args;

/// The memory a bundle may take ([`crate::memory`]).
#[derive(Args, Debug, Clone)]
pub(super) struct MemoryArgs {
    /// Refuse a bundle whose estimated peak memory is above this (`8G`, `512M`, bytes; default:
    /// the memory available, and the address space left under `ulimit -v`).
    #[arg(long, value_name = "SIZE", value_parser = crate::memory::parse_size)]
    max_memory: Option<u64>,
}

impl MemoryArgs {
    /// The limit now: `--max-memory`, else the machine's (none where the machine tells none).
    pub(super) fn limit(&self) -> Option<Limit> {
        match self.max_memory {
            Some(bytes) => Some(Limit::given(bytes)),
            None => Limit::from_machine(),
        }
    }

    /// Refuse the bundle at `path` when it would not fit (see [`crate::memory`]).
    pub(super) fn check_fits(
        &self,
        path: &std::path::Path,
        load: Load,
        dtype: Option<&str>,
        weights: Option<&crate::check::WeightsFrom>,
    ) -> Result<(), ParityError> {
        let weights = weights.map(|w| (w.file.as_path(), w.prefix.as_str()));
        match self.limit() {
            Some(limit) => crate::memory::check_bundle_fits(path, load, dtype, weights, &limit),
            None => Ok(()),
        }
    }
}

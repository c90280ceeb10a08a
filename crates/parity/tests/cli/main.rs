//! The `unet-parity` tool: its commands run in-process through `cli::run` (what the binary calls)
//! on the committed bundles and model checkpoints in `weights/`, and its library API, one module
//! per area. One test binary: the tests run as threads of one process, so none of them may change
//! process-wide state (environment variables, `set_layer_path`, ...). Those that must are in a
//! binary of their own: `tests/accuracy.rs` at the root (the layer path), `../hostile` (wall-time
//! bounds).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod bare_state_dict;
mod bundles;
mod checkpoints;
mod closed_stdout;
mod devices;
mod first_hour;
mod forged_pass;
mod own_checkpoint;
mod pass_rule;
mod port;
mod robustness;
mod trace;
mod verdict;

//! Both crates as a library user has them, without the CLI: the half-precision bundles run the
//! way PyTorch held their tensors, every block returns errors instead of panicking, and random
//! configs and shapes never panic. One module per area; the tests that run the `unet-parity`
//! tool are in `crates/parity/tests` (docs/layout.md has the rule).

#[path = "../../crates/parity/tests/common/mod.rs"]
mod common;

// The sampling examples' schedulers (examples/denoise, examples/digits).
#[path = "../../examples/common/schedule.rs"]
mod schedule;

mod annotated_unet;
mod controlnet;
mod denoise;
mod digits;
mod half_openai;
mod helpers;
mod library_errors;
mod lucidrains;
mod model_folders;
mod properties;
mod single_file;
mod unet2d;

//! Hostile input (issue 20): files and folders that loop or block, a Hub endpoint that stalls or
//! lies, files too big for the address space, pickles built to exhaust the reader. Each must end
//! within a bound of wall time, most in a child process under `ulimit -v` (this binary again, as
//! the CLI: [`cli_child`]).
//!
//! A binary of its own, not a module of `../cli`: its time bounds hold for a process that does not
//! share the CPU with `cli`'s numeric checks (every committed bundle, every model), which run in
//! parallel threads of that process; and the children it starts are this smaller binary.
#![cfg(unix)]

#[path = "../common/mod.rs"]
mod common;

mod files;
mod fuzz_smoke;
#[cfg(feature = "hub")]
mod hub;
mod limits;
mod pickles;
mod settings;
mod whole;

/// Not a test of its own: the CLI when [`common::run_limited`] runs this binary.
#[test]
fn cli_child() {
    common::cli_child()
}

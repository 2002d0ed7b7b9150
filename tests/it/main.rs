//! pycage's ordinary end-to-end tests, as one test binary: one link of wasmtime and the
//! guest instead of one per file, and one pool of test threads for all of them. Each module
//! is one area (`cargo test --test it sessions::` runs one).
//!
//! The tests that need a process of their own stay apart: `adversarial` (it plants canaries
//! in its own environment), `soak` and `swap_isolation` (they measure or page out the whole
//! process), `containment` (hostile resource use, one backend at a time) and `backend_faults`
//! (it stops the Docker daemon).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../os_support/mod.rs"]
#[macro_use]
mod os_support;

mod acceptance;
mod backends;
mod bad_input;
mod bwrap_sessions;
mod cli;
mod custom_guest;
mod deploy;
mod deterministic;
mod faults;
mod files;
mod guest_contract;
mod journal;
mod mcp_cli;
mod net;
mod out_of_memory;
mod prebuilt_guest;
mod prepare_cli;
mod runner_api;
mod serve_cli;
mod sessions;
mod socket_protocol;
mod stdlib;
mod values;
mod warm_pool;

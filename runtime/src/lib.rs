#![doc = include_str!("../README.md")]
//!
//! # Where to start
//!
//! [`Runner`] runs code: build one with [`Runner::builder`], giving it tools
//! ([`pycage_tools::ToolRegistry`]), a [`ToolPolicy`], [`Limits`] and a [`Backend`] (the
//! [`WasmBackend`] by default). A [`RunResult`] says what came back; a [`Session`] keeps a
//! guest's state between runs; [`Runner::description`] makes the `run_python` tool a model
//! is given.

#![deny(missing_docs)]

pub mod backend;
pub mod broker;
pub mod capture;
pub mod describe;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod journal;
mod limits;
pub mod os;
pub mod policy;
mod render;
mod result;
mod runner;
mod session;
pub mod wasm;

pub use backend::{
    Availability, Backend, BackendError, BackendKind, BackendOptions, BackendSession, Job,
    Unavailable, UnavailableKind, backend_by_name,
};
pub use broker::{Broker, CallError, Observers, ToolCallEvent, ToolCallObserver, ToolGate};
pub use capture::OutputMeter;
pub use describe::{DescribeError, Description, DescriptionBuilder, Persistence};
pub use files::{InputFile, OutputFile};
pub use journal::{Decision, Journal, JournalError, JournalKey, OnDivergence, Suspended};
pub use limits::{Limits, LimitsBuilder, LimitsError, MAX_MEMORY_BYTES, MIN_MEMORY_BYTES};
pub use os::{
    BubblewrapBackend, DockerBackend, LayeredBackend, LocalBackend, SeatbeltBackend, WindowsBackend,
};
pub use policy::{ExposedTools, PolicyError, ToolPolicy};
pub use pycage_tools;
pub use render::MODEL_TEXT_BYTES;
pub use result::{ErrorKind, RunError, RunResult, RunResultBuilder};
pub use runner::{BuildError, RunRequest, Runner, RunnerBuilder};
pub use session::{Session, SessionConfig, SessionId, SessionManager};
pub use wasm::{ArtifactSource, Guest, GuestError, WasmBackend, WasmBackendBuilder, WasmError};

/// The README's Rust code blocks, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

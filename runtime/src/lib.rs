//! pycage runs untrusted Python behind a real isolation boundary.
//!
//! The default boundary is WebAssembly: CPython compiled to WASI, packaged as a component and
//! run by wasmtime in this process with fuel, memory and wall-clock limits. The guest reaches
//! the host only through one import, `call-tool`, which passes the run's [`Broker`]:
//! allowlist, namespace pinning, call ceiling, byte caps, per-call timeouts and an audit event
//! per call.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use pycage::{Runner, ToolPolicy};
//! use pycage_tools::ToolRegistry;
//!
//! let runner = Runner::builder()
//!     .tools(ToolRegistry::with_builtins())
//!     .policy(ToolPolicy::new().namespace("math"))
//!     .build()?;
//! let result = runner
//!     .run("total = 0\nfor i in range(1, 6):\n    r = await add(a=str(total), b=str(i))\n    total = r['sum']\nreturn total")
//!     .await;
//! assert!(result.ok);
//! assert_eq!(result.value, 15);
//! assert_eq!(result.tool_calls, 5);
//! # Ok(()) }
//! ```

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
    Availability, Backend, BackendError, BackendOptions, BackendSession, Job, Unavailable,
    UnavailableKind, backend_by_name,
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

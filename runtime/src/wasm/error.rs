//! [`WasmError`]: why the wasm backend could not be created or its guest prepared.

use std::fmt;

/// Why the wasm backend could not be created or its guest prepared. Each kind carries a
/// message for the operator (it may name host paths: log it, do not show it to a guest).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WasmError {
    /// The engine could not be created: for example, the pooling allocator could not reserve
    /// its address space, or a thread could not start.
    Engine(String),
    /// The guest could not be compiled, or loaded from the artifact cache.
    Compile(String),
    /// The compiled guest does not link against the host: its imports or exports do not fit
    /// the contract this host implements.
    Link(String),
    /// Preparing the guest did not finish: the task doing it panicked or was cancelled.
    Interrupted(String),
}

impl fmt::Display for WasmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WasmError::Engine(m) => write!(f, "creating the wasm engine: {m}"),
            WasmError::Compile(m) => write!(f, "compiling the guest: {m}"),
            WasmError::Link(m) => write!(f, "linking the guest: {m}"),
            WasmError::Interrupted(m) => write!(f, "preparing the guest was interrupted: {m}"),
        }
    }
}

impl std::error::Error for WasmError {}

//! Builds pycage's Python guest: CPython for WASI, made into a component by componentize-py,
//! then worked on so that a fresh sandbox is cheap.
//!
//! componentize-py (installed by [`Toolchain::ensure`] into a private virtualenv, by version
//! and hash) imports the guest's Python at build time and snapshots the interpreter's heap.
//! [`finish`] then takes three steps on its output, each checking that the output is what it
//! expects and failing the build otherwise:
//!
//! 1. The WASI parser's nesting limit is raised to the native one (`raise_parser_depth`).
//! 2. The snapshot's objects are made immortal, so a run never writes their reference counts
//!    (`immortalize_snapshot`; the guest lists them in a table at build time).
//! 3. The guest's libraries are linked into one core module, so instantiation builds a
//!    handful of function references instead of thousands (`link`).
//!
//! pycage's own build script builds the default guest with this crate; the same steps serve
//! any other guest.

mod custom;
mod link;
mod snapshot;
mod toolchain;

use std::fmt;

pub use custom::{CustomGuest, build_custom};

pub use toolchain::{COMPONENTIZE_PY, LOCK, Toolchain};

/// The WIT world the guest implements (`wit/pycage.wit`).
pub const WORLD: &str = "sandbox";

/// The guest's componentize-py entry module.
pub const APP: &str = "pycage_wasm";

/// The guest's Python files (in `guest-python/`), which the entry module imports.
pub const GUEST_FILES: &[&str] = &["pycage_runner.py", "pycage_stdlib.py", "pycage_wasm.py"];

/// The guest's Python files as this crate was built with them, for guests built at run
/// time: [`GUEST_FILES`], and `pycage_packages.py`, which keeps a custom guest's packages.
pub const SOURCES: &[(&str, &str)] = &[
    (
        "pycage_runner.py",
        include_str!("../../guest-python/pycage_runner.py"),
    ),
    (
        "pycage_stdlib.py",
        include_str!("../../guest-python/pycage_stdlib.py"),
    ),
    (
        "pycage_wasm.py",
        include_str!("../../guest-python/pycage_wasm.py"),
    ),
    (
        "pycage_packages.py",
        include_str!("../../guest-python/pycage_packages.py"),
    ),
];

/// The WIT contract the guest implements (`wit/pycage.wit`).
pub const WIT: &str = include_str!("../../wit/pycage.wit");

/// Why a guest could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    message: String,
    preload: bool,
}

impl BuildError {
    pub(crate) fn new(message: impl Into<String>) -> BuildError {
        BuildError {
            message: message.into(),
            preload: false,
        }
    }

    /// A module a custom guest was asked to preload does not import in the guest; the
    /// message names it and says why.
    pub(crate) fn preload(message: impl Into<String>) -> BuildError {
        BuildError {
            message: message.into(),
            preload: true,
        }
    }

    /// True when the build failed because a module to preload does not import in the guest
    /// (bad input, not a broken toolchain).
    pub fn is_preload_failure(&self) -> bool {
        self.preload
    }

    /// What went wrong, as a sentence.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BuildError {}

/// This crate's results.
pub type Result<T> = std::result::Result<T, BuildError>;

/// Takes pycage's steps on componentize-py's output (see the crate's docs) and returns the
/// finished component, validated.
///
/// # Errors
///
/// [`BuildError`] when the component is not what the steps expect of componentize-py 0.25.1
/// with pycage's guest: a step that would have to guess fails instead.
pub fn finish(component: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = component.to_vec();
    snapshot::raise_parser_depth(&mut bytes).map_err(BuildError::new)?;
    snapshot::immortalize_snapshot(&mut bytes).map_err(BuildError::new)?;
    link::link_libraries(&bytes)
        .map_err(|e| BuildError::new(format!("linking the guest's libraries: {e}")))
}

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
//!    handful of function references instead of thousands (`link`); for the default guest,
//!    binaryen's `wasm-opt` then optimizes that module as a whole ([`Optimizer`]).
//!
//! [`build_default`] builds pycage's default guest (what `pycage-guest-default` ships
//! prebuilt, and what `pycage`'s `guest-from-source` feature embeds); [`build_custom`] builds a
//! guest with packages baked in, with the same steps. [`inputs_digest`] and
//! [`compare_outside_snapshot`] tie a prebuilt component to its sources, since
//! componentize-py's output is not reproducible byte for byte.

mod custom;
mod link;
mod optimize;
mod snapshot;
mod toolchain;

use std::fmt;
use std::path::Path;

pub use custom::{CustomGuest, build_custom, build_default};

pub use optimize::{ENV_WASM_OPT, Optimizer, WASM_OPT_VERSION};
pub use toolchain::{COMPONENTIZE_PY, LOCK, Toolchain};

pub use pycage_guest_default::{APP, GUEST_FILES, SOURCES, WIT, WORLD};

/// The files of this crate whose contents decide the component it builds from given sources:
/// the steps [`finish`] takes, and the componentize-py it runs.
const BUILDER_FILES: &[(&str, &str)] = &[
    ("componentize-py.lock", LOCK),
    ("src/lib.rs", include_str!("lib.rs")),
    ("src/custom.rs", include_str!("custom.rs")),
    ("src/toolchain.rs", include_str!("toolchain.rs")),
    ("src/snapshot.rs", include_str!("snapshot.rs")),
    ("src/link/mod.rs", include_str!("link/mod.rs")),
    ("src/link/component.rs", include_str!("link/component.rs")),
    ("src/link/emit.rs", include_str!("link/emit.rs")),
    ("src/link/merge.rs", include_str!("link/merge.rs")),
    ("src/link/module.rs", include_str!("link/module.rs")),
    ("src/optimize.rs", include_str!("optimize.rs")),
];

/// BLAKE3 of everything the default guest is built from: its Python files ([`GUEST_FILES`]),
/// the WIT contract, the componentize-py lock and this crate's build steps.
///
/// componentize-py's output is not reproducible (its build-time run reads the host's clock,
/// file times and entropy), so a prebuilt component cannot be checked by building it again
/// and comparing bytes. `pycage-guest-default` records this digest beside its component
/// instead (`INPUTS_DIGEST`), and a test compares: a change to any input without a rebuilt
/// component fails it. Line endings are normalised, so a checkout with CRLF gives the same
/// digest.
pub fn inputs_digest() -> String {
    let python = SOURCES
        .iter()
        .filter(|(name, _)| GUEST_FILES.contains(name))
        .map(|&(name, text)| (name, text));
    let mut hasher = blake3::Hasher::new();
    for (name, text) in python
        .chain([("pycage.wit", WIT)])
        .chain(BUILDER_FILES.iter().copied())
    {
        let text = text.replace("\r\n", "\n");
        for part in [name.as_bytes(), text.as_bytes()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    hasher.finalize().to_hex().to_string()
}

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
    finish_with(component, None)
}

/// [`finish`], with the linked module optimized by `optimizer` (in the directory `work`) when
/// one is given.
fn finish_with(component: &[u8], optimizer: Option<(&Optimizer, &Path)>) -> Result<Vec<u8>> {
    let mut bytes = component.to_vec();
    snapshot::raise_parser_depth(&mut bytes).map_err(BuildError::new)?;
    snapshot::immortalize_snapshot(&mut bytes).map_err(BuildError::new)?;
    link::link_libraries(&bytes, |module| match optimizer {
        Some((optimizer, work)) => optimizer
            .optimize(&module, work)
            .map_err(|e| e.message().to_owned()),
        None => Ok(module),
    })
    .map_err(|e| BuildError::new(format!("linking the guest's libraries: {e}")))
}

/// Compares two finished components everywhere outside their heap snapshots: every section
/// of every module and component, byte for byte, except a core module's memory, globals and
/// data (the snapshot itself: the memory's size, the pointers into it, its contents).
///
/// componentize-py's output is not reproducible: its build-time run reads the host's clock,
/// file times and entropy, which change the heap it snapshots (and with it the size of the
/// data). The rest is reproducible: the interpreter's code, the linked module's code, types,
/// imports, exports and the component's wiring. Two builds of the same sources agree there.
///
/// # Errors
///
/// A sentence naming the first section that differs, or why a component did not parse.
pub fn compare_outside_snapshot(a: &[u8], b: &[u8]) -> std::result::Result<(), String> {
    let (a, b) = (sections_outside_snapshot(a)?, sections_outside_snapshot(b)?);
    if a.len() != b.len() {
        return Err(format!("{} sections against {}", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x != y {
            return Err(format!(
                "the {i}th section differs: {} ({} bytes) against {} ({} bytes)",
                x.0,
                x.1.len(),
                y.0,
                y.1.len()
            ));
        }
    }
    Ok(())
}

/// Each section's kind and bytes, in order, nested modules and components included; the
/// snapshot's sections and the containers' headers (whose sizes follow the snapshot's) by
/// kind only.
fn sections_outside_snapshot(
    component: &[u8],
) -> std::result::Result<Vec<(String, &[u8])>, String> {
    use wasmparser::{Parser, Payload};
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| format!("parsing the component: {e}"))?;
        let kind = match &payload {
            Payload::MemorySection(_) => Some("memory"),
            Payload::GlobalSection(_) => Some("global"),
            Payload::DataSection(_) => Some("data"),
            Payload::DataCountSection { .. } => Some("data count"),
            Payload::ModuleSection { .. } => Some("module"),
            Payload::ComponentSection { .. } => Some("component"),
            Payload::CodeSectionEntry(_) => continue,
            _ => None,
        };
        match (kind, payload.as_section()) {
            (Some(kind), _) => out.push((kind.to_owned(), &[][..])),
            (None, Some((id, range))) => out.push((format!("section {id}"), &component[range])),
            (None, None) => {}
        }
    }
    Ok(out)
}

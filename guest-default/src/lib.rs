//! pycage's default Python guest, prebuilt: building a host that embeds pycage needs no
//! Python, no componentize-py and no network beyond crates.
//!
//! [`COMPONENT`] is CPython 3.14 for WASI with pycage's guest code, made a component by
//! componentize-py and finished by `pycage-guest` (its heap snapshot made immortal, its
//! libraries linked into one core module). It ships compressed with xz; this crate's build
//! script decompresses it and checks it against the committed [`COMPONENT_DIGEST`], and
//! fails the build, naming the file, when they differ.
//!
//! The crate also carries what the component was built from: the guest's Python ([`SOURCES`],
//! which pycage's OS backends run directly) and the WIT contract ([`WIT`]). `pycage`'s
//! `guest-from-source` feature builds the component from them instead (pycage's own
//! developers; it needs Python 3 and the package index), and `scripts/guest-prebuilt`
//! refreshes the prebuilt one. [`INPUTS_DIGEST`] records the inputs it was built from, so a
//! test can tell when the prebuilt component no longer matches them.

include!(concat!(env!("OUT_DIR"), "/digests.rs"));

/// The finished guest component, decompressed and checked at build time.
///
/// A `static`, not a `const`: a const's 28 MB would be copied into each crate that names it
/// and into their metadata (measured: each build of this crate took 220 MB of `target/`
/// with a const, 84 MB with a static).
pub static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pycage-guest.wasm"));

/// The WIT world the guest implements (in [`WIT`]).
pub const WORLD: &str = "sandbox";

/// The guest's componentize-py entry module.
pub const APP: &str = "pycage_wasm";

/// The WIT contract the guest implements (`wit/pycage.wit`).
pub const WIT: &str = include_str!("../wit/pycage.wit");

/// The Python files the component is built from (in `python/`); the entry module [`APP`]
/// imports the others.
pub const GUEST_FILES: &[&str] = &["pycage_runner.py", "pycage_stdlib.py", "pycage_wasm.py"];

/// The transport-agnostic guest logic, shared by the component and the OS backends.
pub const RUNNER: (&str, &str) = (
    "pycage_runner.py",
    include_str!("../python/pycage_runner.py"),
);

/// The OS backends' entry point: the socket transport.
pub const SOCKET_MAIN: (&str, &str) = (
    "pycage_socket.py",
    include_str!("../python/pycage_socket.py"),
);

/// The guest's Python files, for guests built at run time: [`GUEST_FILES`], and
/// `pycage_packages.py`, which keeps a custom guest's packages.
pub const SOURCES: &[(&str, &str)] = &[
    RUNNER,
    (
        "pycage_stdlib.py",
        include_str!("../python/pycage_stdlib.py"),
    ),
    ("pycage_wasm.py", include_str!("../python/pycage_wasm.py")),
    (
        "pycage_packages.py",
        include_str!("../python/pycage_packages.py"),
    ),
];

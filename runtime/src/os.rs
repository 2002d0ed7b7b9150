//! Operating-system backends: native CPython (or the wasm engine itself) inside an OS
//! sandbox, as fallback implementations of the same [`Backend`](crate::Backend) trait, with
//! the same [`Broker`](crate::Broker), limits and [`RunResult`](crate::RunResult).
//!
//! | backend | platform | isolation |
//! |---|---|---|
//! | [`BubblewrapBackend`] | Linux | user/mount/pid/net/ipc/uts namespaces |
//! | [`DockerBackend`] | any Docker host | a throwaway container |
//! | [`SeatbeltBackend`] | macOS | a `sandbox-exec` profile |
//! | [`WindowsBackend`] | Windows | AppContainer + Job Object (never run in CI) |
//! | [`LocalBackend`] | Linux | none: needs `allow_no_isolation` |
//! | [`LayeredBackend`] | Linux | the wasm engine inside bubblewrap |
//!
//! Every backend type exists on every OS, so a host's code compiles everywhere; one that does
//! not belong on this OS says so in `availability()` ("wrong OS: ...") and fails its runs as
//! `backend_error`. The socket transport and the process spawning below it are Unix-only;
//! the Windows backend has its own launcher and a named pipe (see [`windows`]).
//!
//! Each follows *probe, render, run*: `availability()` probes the host and says why not;
//! a pure `render` function turns the policy and limits into a command line (or a profile, or
//! job settings), unit-tested on every platform; `run` spawns it.
//!
//! # Transport
//!
//! The guest reaches the broker over a private Unix socket (see [`server`] and
//! [`protocol`]): a directory of mode 0700 per run, a socket of mode 0600, length-prefixed
//! JSON frames capped before they are read, and a per-run random token checked before
//! anything else. On Windows the same frames and token travel over a named pipe whose DACL
//! grants only the owner and the run's AppContainer. The guest's Python side is `guest-default/python/pycage_socket.py`, which runs the
//! same `pycage_runner` as the wasm guest; only the transport differs.
//!
//! # Limits
//!
//! The wall clock, output caps, call ceiling and byte caps work as for the wasm backend
//! (the wall clock counts from the sandbox's start). Memory and processes are rlimits per
//! process and, where the host's cgroup file system is writable, a cgroup for the whole tree
//! (see [`cgroup`]). Fuel is a wasm-only limit: native backends report `fuel_consumed: None`
//! and refuse a fuel budget as `invalid_input`.

pub mod bubblewrap;
pub mod cgroup;
mod classify;
mod container;
pub mod docker;
mod frame_io;
mod guest_files;
pub mod host_layout;
pub mod layered;
pub mod local;
mod native;
mod native_session;
pub mod protocol;
pub mod rlimits;
#[cfg(unix)]
pub mod run_dir;
#[cfg(unix)]
mod run_stream;
pub mod seatbelt;
mod serve;
#[cfg(unix)]
pub mod server;
#[cfg(unix)]
mod spawn;
mod sys;
mod token;
pub mod windows;
#[cfg(unix)]
mod workdir;
#[cfg(unix)]
pub mod worker;

pub use self::bubblewrap::BubblewrapBackend;
pub use self::classify::{Evidence, Exit, Reporter, classify};
pub use self::docker::DockerBackend;
pub use self::layered::LayeredBackend;
pub use self::local::LocalBackend;
pub use self::native::{DEFAULT_INTERPRETER, GUEST_MOUNT, SOCKET_NAME};
#[cfg(unix)]
pub use self::run_dir::RunDir;
pub use self::seatbelt::SeatbeltBackend;
#[cfg(unix)]
pub use self::server::SocketServer;
pub use self::token::Token;
pub use self::windows::WindowsBackend;

//! The guest's Python files, embedded so library users need no checkout of this repository:
//! each run writes them into its private directory, which the sandbox binds read-only.

pub use pycage_guest_default::{RUNNER, SOCKET_MAIN};

/// Every file a native guest needs.
pub const ALL: [(&str, &str); 2] = [RUNNER, SOCKET_MAIN];

//! The guest's Python files, embedded so library users need no checkout of this repository:
//! each run writes them into its private directory, which the sandbox binds read-only.

/// The transport-agnostic guest logic (shared with the wasm guest).
pub const RUNNER: (&str, &str) = (
    "pycage_runner.py",
    include_str!("../../../guest-python/pycage_runner.py"),
);

/// The OS backends' entry point: the socket transport.
pub const SOCKET_MAIN: (&str, &str) = (
    "pycage_socket.py",
    include_str!("../../../guest-python/pycage_socket.py"),
);

/// Every file a native guest needs.
pub const ALL: [(&str, &str); 2] = [RUNNER, SOCKET_MAIN];

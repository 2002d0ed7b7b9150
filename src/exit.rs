//! Exit codes.

use std::process::ExitCode;

/// How the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The run succeeded.
    Ok = 0,
    /// The guest failed or hit a limit.
    GuestFailed = 1,
    /// The command line, a config file or the request was unusable.
    Usage = 2,
    /// The sandbox itself failed.
    Internal = 3,
    /// The run stopped at a tool call that waits for approval (`pycage resume` goes on).
    Suspended = 4,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

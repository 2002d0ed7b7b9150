//! The few host facts the native backends read outside their Unix-only transport, each with
//! the answer it gives where the host has no such thing. Off Unix these backends are never
//! available (their `availability` says why), so those answers are never acted on: they
//! only let the backends' pure parts (renderers, settings) compile and be tested everywhere.
#![cfg_attr(not(unix), allow(dead_code))]

use std::path::Path;
use std::process::ExitStatus;

/// The real user id of this process (`0` off Unix).
pub(crate) fn uid() -> u32 {
    #[cfg(unix)]
    return rustix::process::getuid().as_raw();
    #[cfg(not(unix))]
    return 0;
}

/// The real group id of this process (`0` off Unix).
pub(crate) fn gid() -> u32 {
    #[cfg(unix)]
    return rustix::process::getgid().as_raw();
    #[cfg(not(unix))]
    return 0;
}

/// The owner of a file (`None` off Unix).
pub(crate) fn owner(metadata: &std::fs::Metadata) -> Option<u32> {
    #[cfg(unix)]
    return Some(std::os::unix::fs::MetadataExt::uid(metadata));
    #[cfg(not(unix))]
    return {
        let _ = metadata;
        None
    };
}

/// The signal that ended a process, if one did (never off Unix).
pub(crate) fn exit_signal(status: ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    return std::os::unix::process::ExitStatusExt::signal(&status);
    #[cfg(not(unix))]
    return {
        let _ = status;
        None
    };
}

/// Creates the directory `path` readable and writable by its owner only (mode 0700 on Unix;
/// elsewhere the parent's access rules apply).
pub(crate) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(path);
    #[cfg(not(unix))]
    return std::fs::create_dir(path);
}

/// Sends `SIGINT` to the process `pid`, as Ctrl-C would; false if it could not be sent
/// (gone, or off Unix).
pub(crate) fn interrupt_process(pid: i32) -> bool {
    #[cfg(unix)]
    return rustix::process::Pid::from_raw(pid).is_some_and(|pid| {
        rustix::process::kill_process(pid, rustix::process::Signal::INT).is_ok()
    });
    #[cfg(not(unix))]
    return {
        let _ = pid;
        false
    };
}

/// Sends `SIGKILL` to the process `pid`; a process already gone is no error (no-op off
/// Unix).
pub(crate) fn kill_process(pid: i32) {
    #[cfg(unix)]
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    #[cfg(not(unix))]
    let _ = pid;
}

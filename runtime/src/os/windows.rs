//! The Windows backend: AppContainer + Job Object settings. **The launcher is not
//! implemented**: this module renders what a launcher would apply, as plain data with unit
//! tests ([`render_settings`], and the command line, environment block, security
//! descriptors and job limits in [`command_line`], [`acl`] and [`job`]), and the backend
//! reports itself unavailable everywhere.
//!
//! # Security (as designed)
//!
//! The guest would run in an AppContainer with no capabilities (no network, no user files
//! beyond what is granted to its package SID), inside a Job Object with a memory cap per
//! process and per job, an active-process limit, a CPU-time limit, and kill-on-job-close (the
//! whole tree dies with the host's handle). The broker transport would be a named pipe whose
//! DACL grants only the AppContainer's SID, with the same frames and token as the Unix socket.
//!
//! Why no launcher: creating an AppContainer process needs Win32 calls (`CreateAppContainerProfile`,
//! `STARTUPINFOEX` with `SECURITY_CAPABILITIES`, `AssignProcessToJobObject`) that this
//! repository cannot build or test (its CI is Linux), and an untested sandbox is worse than an
//! honest "unavailable".

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::local::WORK_DIR;
use super::native::INTERPRETER_FLAGS;
use super::rlimits::MAX_PROCESSES;
use crate::backend::{Availability, Backend, Job, RunFuture};
use crate::broker::Broker;
use crate::{ErrorKind, Limits, RunError, RunResult};

pub mod acl;
pub mod command_line;
pub mod job;

pub use self::job::JobLimits;

/// The environment variable naming Windows' own directory: the only one of the host's that
/// the guest's environment keeps (parts of the C runtime and of Winsock look for it).
pub const ENV_SYSTEM_ROOT: &str = "SystemRoot";

/// Windows' directory when [`ENV_SYSTEM_ROOT`] is not set.
pub const DEFAULT_SYSTEM_ROOT: &str = r"C:\Windows";

/// The interpreter's flags after [`INTERPRETER_FLAGS`]: UTF-8 mode, so that the guest's
/// stdout and stderr are UTF-8 whatever the console code page (`PYTHONUTF8` would do the
/// same, but isolated mode ignores `PYTHON*` variables).
pub const UTF8_MODE: [&str; 2] = ["-X", "utf8"];

/// The longest AppContainer profile name Windows accepts.
pub const MAX_APP_CONTAINER_NAME: usize = 64;

/// What a Windows launcher would apply to one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowsSandboxSettings {
    /// The AppContainer profile name (created per run, deleted afterwards).
    pub app_container_name: String,
    /// The AppContainer's capability SIDs: none.
    pub capabilities: Vec<String>,
    /// The Job Object's limits.
    pub job: JobLimits,
    /// The broker's named pipe (`\\.\pipe\...`), its DACL granting only the owner and the
    /// AppContainer.
    pub pipe_name: String,
    /// The command line, as separate arguments (the interpreter first).
    pub command_line: Vec<String>,
    /// The whole environment.
    pub environment: Vec<(String, String)>,
    /// The guest's working directory: its current directory, `TEMP` and `TMP`.
    pub work_dir: String,
}

/// The settings of one run tagged `tag` (random per run), its run directory `run_dir` and
/// Windows' directory `system_root`. Pure.
pub fn render_settings(
    limits: &Limits,
    tag: &str,
    interpreter: &str,
    run_dir: &str,
    system_root: &str,
) -> WindowsSandboxSettings {
    let cpu = limits.wall_timeout() + Duration::from_secs(1);
    let work_dir = format!(r"{run_dir}\{WORK_DIR}");
    let mut command_line = vec![interpreter.to_owned()];
    command_line.extend(INTERPRETER_FLAGS.iter().map(|f| (*f).to_owned()));
    command_line.extend(UTF8_MODE.iter().map(|f| (*f).to_owned()));
    command_line.push(format!(r"{run_dir}\pycage_socket.py"));
    WindowsSandboxSettings {
        app_container_name: format!("pycage.run.{tag}"),
        capabilities: Vec::new(),
        job: JobLimits {
            process_memory_bytes: limits.memory_bytes(),
            job_memory_bytes: limits.memory_bytes(),
            active_processes: MAX_PROCESSES as u32,
            job_user_time_100ns: u64::try_from(cpu.as_nanos() / 100).unwrap_or(u64::MAX),
            kill_on_job_close: true,
            die_on_unhandled_exception: true,
            ui_restrictions_all: true,
        },
        pipe_name: format!(r"\\.\pipe\pycage-{tag}"),
        command_line,
        environment: vec![
            (ENV_SYSTEM_ROOT.into(), system_root.into()),
            ("TEMP".into(), work_dir.clone()),
            ("TMP".into(), work_dir.clone()),
        ],
        work_dir,
    }
}

/// True when `name` can name an AppContainer profile: 1 to [`MAX_APP_CONTAINER_NAME`]
/// characters out of `[-_. A-Za-z0-9]`.
pub fn is_valid_app_container_name(name: &str) -> bool {
    (1..=MAX_APP_CONTAINER_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b' '))
}

/// The Windows backend: settings only; unavailable everywhere (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct WindowsBackend;

impl WindowsBackend {
    /// The backend.
    pub fn new() -> Self {
        WindowsBackend
    }

    /// Why it cannot run here.
    pub fn unavailable_reason() -> &'static str {
        if cfg!(windows) {
            "the AppContainer launcher is not implemented yet"
        } else {
            "wrong OS: AppContainer needs Windows (and its launcher is not implemented yet)"
        }
    }
}

impl Backend for WindowsBackend {
    fn name(&self) -> &'static str {
        "windows"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        Availability::Unavailable(Self::unavailable_reason().into())
    }

    fn run(&self, _job: Job, _broker: Arc<Broker>) -> RunFuture<'_> {
        Box::pin(async {
            RunResult::failed(
                "windows",
                RunError::new(
                    ErrorKind::BackendError,
                    format!(
                        "the windows backend is unavailable: {}",
                        Self::unavailable_reason()
                    ),
                ),
                Duration::ZERO,
            )
        })
    }
}

/// A Windows path for `run_dir` in documentation and tests.
pub fn example_run_dir() -> &'static Path {
    Path::new(r"C:\Users\ada\AppData\Local\Temp\pycage-abc")
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;

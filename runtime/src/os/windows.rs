//! The Windows backend: native CPython in an AppContainer with no capabilities, inside a Job
//! Object, reaching the broker over a named pipe.
//!
//! **This launcher has never run in CI, nor anywhere else we know of.** This repository is
//! built and tested on Linux: the launcher is compiled for `x86_64-pc-windows-gnu` with
//! clippy's `-D warnings` (`scripts/cross-check`), and every decision it makes is a pure
//! function unit-tested on Linux: the settings ([`render_settings`]), the command line and
//! environment block ([`command_line`]), the security descriptors ([`acl`]), the Job
//! Object's limits and how its end is classified ([`job`]). The Win32 calls themselves
//! (`launcher`, `process`, `job_object`, `pipe` and `win32`, compiled on Windows only) are
//! compile-checked, never run. [`availability`](Backend::availability) probes what it can on Windows (the
//! interpreter, creating an AppContainer profile); a first run on Windows is the launcher's
//! first test.
//!
//! # Security
//!
//! For each run the launcher
//!
//! * creates an AppContainer profile `pycage.run.<tag>` and starts the guest in it with no
//!   capability SIDs: no network (no `internetClient`), none of the user's libraries, its
//!   own low-integrity token; the profile is deleted after the run;
//! * makes a run directory under `%TEMP%` with a protected DACL granting the owner full
//!   access and the container read access only ([`acl::run_dir_sddl`]), holding the guest's
//!   two Python files and its working directory `work`, which the container may modify, at
//!   low integrity ([`acl::work_dir_sddl`]); `work` is the guest's current directory,
//!   `TEMP` and `TMP`;
//! * serves the broker on a named pipe `\\.\pipe\pycage-<tag>`, created as the first
//!   instance (a pipe someone made first under that name fails the run), rejecting remote
//!   clients, with a DACL granting only the owner and the container ([`acl::pipe_sddl`]);
//!   each connection is handled as on every transport (frame caps, the per-run token, a byte
//!   budget, at most 64 connections at once);
//! * creates a Job Object ([`job::JobPlan`]) with the memory limit per process and for the
//!   whole job, at most 64 active processes, a CPU-time limit of the wall clock plus a
//!   second, kill on job close, die on unhandled exception (no error dialog keeps a process
//!   alive) and every UI restriction; breaking away is never allowed; a completion port
//!   hears its memory-limit messages;
//! * creates the interpreter suspended (`STARTUPINFOEXW` with
//!   `PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES`, and a handle list holding only its three
//!   pipes: nothing else of the host is inherited), assigns it to the job and only then
//!   resumes it, so nothing of the guest runs outside the job; the interpreter is an
//!   absolute path (never looked up on `PATH`) run as `-I -B -X utf8` with an environment of
//!   `SystemRoot`, `TEMP` and `TMP` only;
//! * terminates the whole job at the wall-clock deadline, terminates whatever the first
//!   process left when it exits, and closes the job at the end.
//!
//! A run ends through the classifier of every OS backend; the job's limits count only on
//! the host's own evidence, never on an exit code the guest could choose ([`job::exit_of`]).
//!
//! Not protected: an AppContainer may still read what Windows grants to `ALL APPLICATION
//! PACKAGES` (most of `C:\Windows` and `C:\Program Files`, some registry keys); the kernel
//! and win32k are shared; other processes of the host's user can open the broker's pipe as
//! the owner (they still need the run's token), as other processes of a Unix user can open
//! the socket. The interpreter must be readable by AppContainers: one under
//! `C:\Program Files` is, one in the user's profile is not (its runs fail as
//! `backend_error`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::local::WORK_DIR;
use super::native::INTERPRETER_FLAGS;
use super::rlimits::MAX_PROCESSES;
use crate::backend::{Availability, Backend, Job, RunFuture, Unavailable};
use crate::broker::ToolGate;
use crate::{ErrorKind, Limits, RunError, RunResult};

pub mod acl;
pub mod command_line;
pub mod job;
#[cfg(windows)]
mod job_object;
#[cfg(windows)]
mod launcher;
#[cfg(windows)]
mod pipe;
#[cfg(windows)]
mod process;
#[cfg(windows)]
mod win32;

pub use self::job::JobLimits;

/// The backend's name.
const NAME: &str = "windows";

/// Why the backend cannot run off Windows.
const WRONG_OS: &str = "wrong OS: AppContainer needs Windows";

/// The environment variable naming Windows' own directory: the only one of the host's that
/// the guest's environment keeps (parts of the C runtime and of Winsock look for it).
pub const ENV_SYSTEM_ROOT: &str = "SystemRoot";

/// Windows' directory when [`ENV_SYSTEM_ROOT`] is not set.
pub const DEFAULT_SYSTEM_ROOT: &str = r"C:\Windows";

/// The default interpreter: python.org's CPython 3.13 installed for all users, under
/// `C:\Program Files`, which AppContainers may read.
pub const DEFAULT_WINDOWS_INTERPRETER: &str = r"C:\Program Files\Python313\python.exe";

/// The interpreter's flags after isolated mode (`-I -B`): UTF-8 mode, so that the guest's
/// stdout and stderr are UTF-8 whatever the console code page (`PYTHONUTF8` would do the
/// same, but isolated mode ignores `PYTHON*` variables).
pub const UTF8_MODE: [&str; 2] = ["-X", "utf8"];

/// What a reason given on Windows adds: the launcher's part in any failure is untested.
pub const UNTESTED_NOTE: &str =
    "the Windows launcher is compiled and unit-tested on Linux only and has never run in CI";

/// The longest AppContainer profile name Windows accepts.
pub const MAX_APP_CONTAINER_NAME: usize = 64;

/// What the launcher applies to one run.
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

/// The Windows backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WindowsBackend {
    interpreter: PathBuf,
}

impl Default for WindowsBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl WindowsBackend {
    /// The backend with [`DEFAULT_WINDOWS_INTERPRETER`].
    pub fn new() -> Self {
        Self::with_interpreter(DEFAULT_WINDOWS_INTERPRETER)
    }

    /// The backend with another interpreter: an absolute path, readable by AppContainers.
    pub fn with_interpreter(interpreter: impl Into<PathBuf>) -> Self {
        WindowsBackend {
            interpreter: interpreter.into(),
        }
    }

    /// The interpreter the guest runs in.
    pub fn interpreter(&self) -> &Path {
        &self.interpreter
    }

    /// The checks made before every run: the right OS and the interpreter present.
    fn preflight(&self) -> Result<(), Unavailable> {
        if !cfg!(windows) {
            return Err(Unavailable::wrong_os(WRONG_OS));
        }
        if !self.interpreter.is_absolute() || !self.interpreter.is_file() {
            return Err(Unavailable::missing(format!(
                "interpreter missing: {}",
                self.interpreter.display()
            )));
        }
        Ok(())
    }
}

impl Backend for WindowsBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        if let Err(why) = self.preflight() {
            return Availability::Unavailable(why);
        }
        #[cfg(windows)]
        if let Err(e) = launcher::probe() {
            return Availability::Unavailable(Unavailable::refused(format!(
                "an AppContainer profile cannot be created here: {e} ({UNTESTED_NOTE})"
            )));
        }
        Availability::Available
    }

    #[cfg(windows)]
    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async move {
            if let Err(why) = self.preflight() {
                return unavailable(why.to_string());
            }
            launcher::run(job, gate, &self.interpreter).await
        })
    }

    #[cfg(not(windows))]
    fn run(&self, _job: Job, _gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async { unavailable(WRONG_OS.into()) })
    }
}

/// The failure of a run the backend cannot start here.
fn unavailable(why: String) -> RunResult {
    RunResult::failed(
        NAME,
        RunError::new(
            ErrorKind::BackendError,
            format!("the windows backend is unavailable: {why}"),
        ),
        Duration::ZERO,
    )
}

/// A Windows path for `run_dir` in documentation and tests.
pub fn example_run_dir() -> &'static Path {
    Path::new(r"C:\Users\ada\AppData\Local\Temp\pycage-abc")
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;

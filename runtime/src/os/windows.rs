//! The Windows backend: AppContainer + Job Object settings. **The launcher is not
//! implemented**: this module renders what a launcher would apply, as plain data with unit
//! tests, and the backend reports itself unavailable everywhere.
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

use super::rlimits::MAX_PROCESSES;
use crate::backend::{Availability, Backend, Job, RunFuture};
use crate::broker::ToolGate;
use crate::{ErrorKind, Limits, RunError, RunResult};

/// The Job Object limits of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobLimits {
    /// `JOB_OBJECT_LIMIT_PROCESS_MEMORY`: committed bytes per process.
    pub process_memory_bytes: u64,
    /// `JOB_OBJECT_LIMIT_JOB_MEMORY`: committed bytes of the whole job.
    pub job_memory_bytes: u64,
    /// `JOB_OBJECT_LIMIT_ACTIVE_PROCESS`: processes alive at once.
    pub active_processes: u32,
    /// `JOB_OBJECT_LIMIT_JOB_TIME`: user-mode CPU time of the job, in 100 ns units.
    pub job_user_time_100ns: u64,
    /// `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`.
    pub kill_on_job_close: bool,
    /// `JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION` (no error dialogs that keep a process
    /// alive).
    pub die_on_unhandled_exception: bool,
    /// `JOB_OBJECT_UILIMIT_ALL`: no desktop, clipboard or global atoms.
    pub ui_restrictions_all: bool,
}

/// What a Windows launcher would apply to one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowsSandboxSettings {
    /// The AppContainer profile name (created per run, deleted afterwards).
    pub app_container_name: String,
    /// The AppContainer's capability SIDs: none.
    pub capabilities: Vec<String>,
    /// The Job Object's limits.
    pub job: JobLimits,
    /// The broker's named pipe (`\\.\pipe\...`), its DACL granting only the AppContainer.
    pub pipe_name: String,
    /// The command line, as separate arguments.
    pub command_line: Vec<String>,
    /// The whole environment.
    pub environment: Vec<(String, String)>,
}

/// The settings of one run tagged `tag` (random per run). Pure.
pub fn render_settings(
    limits: &Limits,
    tag: &str,
    interpreter: &str,
    run_dir: &str,
) -> WindowsSandboxSettings {
    let cpu = limits.wall_timeout() + Duration::from_secs(1);
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
        command_line: vec![
            interpreter.to_owned(),
            "-I".into(),
            "-B".into(),
            format!(r"{run_dir}\pycage_socket.py"),
        ],
        environment: vec![
            ("PYTHONUTF8".into(), "1".into()),
            ("TEMP".into(), format!(r"{run_dir}\work")),
            ("TMP".into(), format!(r"{run_dir}\work")),
        ],
    }
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

    fn run(&self, _job: Job, _gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
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
mod tests {
    use super::*;

    fn settings() -> WindowsSandboxSettings {
        let limits = Limits::builder()
            .wall_timeout(Duration::from_secs(5))
            .memory_bytes(128 << 20)
            .build()
            .unwrap();
        render_settings(
            &limits,
            "0123abcd",
            r"C:\Python313\python.exe",
            &example_run_dir().to_string_lossy(),
        )
    }

    #[test]
    fn no_capabilities_and_a_job_that_dies_with_the_host() {
        let s = settings();
        assert!(s.capabilities.is_empty(), "no capability SIDs");
        assert!(s.job.kill_on_job_close);
        assert!(s.job.die_on_unhandled_exception);
        assert!(s.job.ui_restrictions_all);
        assert_eq!(s.job.process_memory_bytes, 128 << 20);
        assert_eq!(s.job.job_memory_bytes, 128 << 20);
        assert_eq!(s.job.active_processes, 64);
        assert_eq!(s.job.job_user_time_100ns, 60_000_000);
    }

    #[test]
    fn names_are_per_run() {
        let s = settings();
        assert_eq!(s.app_container_name, "pycage.run.0123abcd");
        assert_eq!(s.pipe_name, r"\\.\pipe\pycage-0123abcd");
        assert_eq!(
            s.command_line.last().unwrap(),
            r"C:\Users\ada\AppData\Local\Temp\pycage-abc\pycage_socket.py"
        );
        let names: Vec<_> = s.environment.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PYTHONUTF8", "TEMP", "TMP"]);
    }

    #[test]
    fn it_is_never_available_and_says_why() {
        let a = WindowsBackend::new().availability();
        let Availability::Unavailable(why) = a else {
            panic!("the launcher is not implemented")
        };
        assert!(why.contains("not implemented"), "{why}");
    }
}

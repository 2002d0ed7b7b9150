//! A run's Job Object as plain data: the limits it is given ([`JobPlan`], from
//! [`JobLimits`]) and how what it saw becomes the classifier's [`Exit`] and [`Evidence`]
//! ([`exit_of`]). Pure, and unit-tested on every OS; the Win32 values are `winnt.h`'s, and
//! the Windows build checks them against `windows-sys` at compile time.

use serde::Serialize;

use super::super::classify::{Evidence, Exit};

/// `JOB_OBJECT_LIMIT_JOB_TIME`.
pub const LIMIT_JOB_TIME: u32 = 0x0000_0004;
/// `JOB_OBJECT_LIMIT_ACTIVE_PROCESS`.
pub const LIMIT_ACTIVE_PROCESS: u32 = 0x0000_0008;
/// `JOB_OBJECT_LIMIT_PROCESS_MEMORY`.
pub const LIMIT_PROCESS_MEMORY: u32 = 0x0000_0100;
/// `JOB_OBJECT_LIMIT_JOB_MEMORY`.
pub const LIMIT_JOB_MEMORY: u32 = 0x0000_0200;
/// `JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION`.
pub const LIMIT_DIE_ON_UNHANDLED_EXCEPTION: u32 = 0x0000_0400;
/// `JOB_OBJECT_LIMIT_BREAKAWAY_OK`: never set (a process could leave the job).
pub const LIMIT_BREAKAWAY_OK: u32 = 0x0000_0800;
/// `JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK`: never set.
pub const LIMIT_SILENT_BREAKAWAY_OK: u32 = 0x0000_1000;
/// `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`.
pub const LIMIT_KILL_ON_JOB_CLOSE: u32 = 0x0000_2000;
/// `JOB_OBJECT_UILIMIT_ALL`: no desktops, display settings, exiting Windows, global atoms,
/// other processes' user handles, clipboard, system parameters or IME.
pub const UILIMIT_ALL: u32 = 0x0000_01FF;

/// `JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO`: the job's last process has exited.
pub const MSG_ACTIVE_PROCESS_ZERO: u32 = 4;
/// `JOB_OBJECT_MSG_PROCESS_MEMORY_LIMIT`: a process asked for more than its memory limit.
pub const MSG_PROCESS_MEMORY_LIMIT: u32 = 9;
/// `JOB_OBJECT_MSG_JOB_MEMORY_LIMIT`: a process took the job over its memory limit.
pub const MSG_JOB_MEMORY_LIMIT: u32 = 10;

/// `ERROR_NOT_ENOUGH_QUOTA`: the exit code of the processes the job's CPU-time limit ends.
pub const ERROR_NOT_ENOUGH_QUOTA: u32 = 1816;

/// The loader's failures: the interpreter did not start (in an AppContainer, most often
/// because its files are not readable by the container).
const LOADER_FAILURES: [u32; 5] = [
    0xC000_0022, // STATUS_ACCESS_DENIED
    0xC000_007B, // STATUS_INVALID_IMAGE_FORMAT
    0xC000_0135, // STATUS_DLL_NOT_FOUND
    0xC000_0139, // STATUS_ENTRYPOINT_NOT_FOUND
    0xC000_0142, // STATUS_DLL_INIT_FAILED
];

/// `STATUS_BREAKPOINT`: an exception of warning severity that still ends a process.
const STATUS_BREAKPOINT: u32 = 0x8000_0003;

/// The Job Object limits of one run, as policy.
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

/// What the launcher sets on the Job Object: the fields of
/// `JOBOBJECT_EXTENDED_LIMIT_INFORMATION` and `JOBOBJECT_BASIC_UI_RESTRICTIONS` it fills
/// (everything else is zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JobPlan {
    /// `BasicLimitInformation.LimitFlags`.
    pub limit_flags: u32,
    /// `BasicLimitInformation.PerJobUserTimeLimit`, in 100 ns units.
    pub per_job_user_time_limit: i64,
    /// `BasicLimitInformation.ActiveProcessLimit`.
    pub active_process_limit: u32,
    /// `ProcessMemoryLimit`, in bytes (a `SIZE_T`: saturated on a 32-bit host).
    pub process_memory_limit: u64,
    /// `JobMemoryLimit`, in bytes.
    pub job_memory_limit: u64,
    /// `UIRestrictionsClass`.
    pub ui_restrictions: u32,
}

impl JobPlan {
    /// The plan of `limits`. Every limit is set; breaking away from the job never is.
    pub fn new(limits: &JobLimits) -> JobPlan {
        let mut flags =
            LIMIT_PROCESS_MEMORY | LIMIT_JOB_MEMORY | LIMIT_ACTIVE_PROCESS | LIMIT_JOB_TIME;
        if limits.kill_on_job_close {
            flags |= LIMIT_KILL_ON_JOB_CLOSE;
        }
        if limits.die_on_unhandled_exception {
            flags |= LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
        }
        JobPlan {
            limit_flags: flags,
            per_job_user_time_limit: i64::try_from(limits.job_user_time_100ns).unwrap_or(i64::MAX),
            active_process_limit: limits.active_processes,
            process_memory_limit: limits.process_memory_bytes,
            job_memory_limit: limits.job_memory_bytes,
            ui_restrictions: if limits.ui_restrictions_all {
                UILIMIT_ALL
            } else {
                0
            },
        }
    }
}

/// What the job's completion port said while the run lasted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobEvents {
    /// A process asked for memory over its limit, or took the job over its own.
    pub memory_limit_reached: bool,
    /// The job's last process has exited: no message comes after this one.
    pub all_exited: bool,
}

impl JobEvents {
    /// Notes one message (`JOB_OBJECT_MSG_*`); others are ignored.
    pub fn note(&mut self, message: u32) {
        match message {
            MSG_PROCESS_MEMORY_LIMIT | MSG_JOB_MEMORY_LIMIT => self.memory_limit_reached = true,
            MSG_ACTIVE_PROCESS_ZERO => self.all_exited = true,
            _ => {}
        }
    }
}

/// How the guest's first process ended, as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// It exited with this code (`GetExitCodeProcess`).
    Exited(u32),
    /// The wall-clock deadline passed and the host terminated the job.
    TimedOut,
}

/// Everything the host knows about a finished run's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobReport {
    /// How the guest's process ended.
    pub end: JobEnd,
    /// What the completion port said.
    pub events: JobEvents,
    /// `TotalTerminatedProcesses` of the job's accounting: processes the kernel terminated
    /// for a limit (here only the CPU-time limit terminates).
    pub terminated_by_limit: u32,
    /// `TotalUserTime` of the job's accounting, in 100 ns units.
    pub user_time_100ns: u64,
    /// The job's CPU-time limit, in 100 ns units.
    pub user_time_limit_100ns: u64,
}

/// The [`Exit`] of a Windows exit code: the loader's failures are the sandbox's
/// ([`Exit::SandboxFailed`]), an exception's status (`0xC…`, and `STATUS_BREAKPOINT`) is an
/// [`Exit::Exception`], anything else the process's own [`Exit::Code`].
pub fn exit_of_code(code: u32) -> Exit {
    match code {
        c if LOADER_FAILURES.contains(&c) => Exit::SandboxFailed,
        STATUS_BREAKPOINT => Exit::Exception(code),
        c if c & 0xF000_0000 == 0xC000_0000 => Exit::Exception(code),
        c => Exit::Code(i32::from_ne_bytes(c.to_ne_bytes())),
    }
}

/// The classifier's view of a finished job.
///
/// The limits count only on the host's own evidence, never on an exit code alone (a guest
/// chooses its exit code): the memory limit when the completion port reported it, the CPU
/// limit when the job's accounting shows processes terminated for a limit or the user time
/// at the limit. The wall clock is the host's own deadline.
pub fn exit_of(report: &JobReport) -> (Exit, Evidence) {
    let evidence = Evidence {
        oom_killed: report.events.memory_limit_reached,
        cpu_time_exceeded: report.terminated_by_limit > 0
            || report.user_time_100ns >= report.user_time_limit_100ns,
    };
    let exit = match report.end {
        JobEnd::TimedOut => Exit::TimedOut,
        JobEnd::Exited(code) => exit_of_code(code),
    };
    (exit, evidence)
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;

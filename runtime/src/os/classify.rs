//! The one classifier of the OS backends: how a sandboxed run ended (its result frame, its
//! exit, what the cgroup saw) becomes a value or a [`RunError`].

use serde_json::Value;

use super::protocol::Outcome;
use crate::result::{
    MAX_EXCEPTION_CHARS, MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, cap_chars, decode_value,
};
use crate::{ErrorKind, RunError};

/// `SIGKILL`, `SIGXCPU` and the signals of a crash.
const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;
const SIGXFSZ: i32 = 25;

/// The exit status the guest bootstrap and the cgroup wrapper use for "could not start".
pub(crate) const BOOTSTRAP_FAILED: i32 = 121;

/// How the sandboxed process ended, as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
    /// The wall-clock deadline passed and the host killed it.
    TimedOut,
    /// The sandbox itself could not start it (for example `docker run` failed).
    SandboxFailed,
    /// An unhandled exception ended it: on Windows its exit code is the exception's
    /// `NTSTATUS` (such as `0xC0000005`, an access violation). Like a signal on Unix, the
    /// code is the process's own exit status, so a guest can claim one.
    Exception(u32),
}

/// Who produced the result frame, which decides what it may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    /// The Python guest: it can only report how the code ended (syntax error, exception,
    /// invalid input, value too large).
    Guest,
    /// A layered worker running the wasm engine: it reports the engine's classification.
    Worker,
}

/// What the host saw besides the exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The run's memory cap stopped it: the memory cgroup killed a process of the run, or
    /// (Windows) the Job Object reported a process or the job over its memory limit.
    pub oom_killed: bool,
    /// The run's CPU-time cap ended it, as the host's accounting shows (Windows: the Job
    /// Object terminated processes for its CPU-time limit). On Unix the kernel's `SIGXCPU`
    /// says so instead, as the [`Exit`].
    pub cpu_time_exceeded: bool,
}

/// `STATUS_STACK_OVERFLOW`: the thread's stack ran out (deeper than the interpreter's
/// recursion limit could catch).
pub(crate) const STATUS_STACK_OVERFLOW: u32 = 0xC000_00FD;

/// What the common crash statuses are called, for the message.
fn exception_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0x8000_0003 => "a breakpoint",
        0xC000_0005 => "an access violation",
        0xC000_0017 | 0xC000_012D => "out of memory",
        0xC000_001D => "an illegal instruction",
        0xC000_0094 => "an integer division by zero",
        0xC000_0374 => "heap corruption",
        0xC000_0409 => "a fail-fast exit",
        _ => return None,
    })
}

/// The run's value, or why there is none.
///
/// The order of precedence: the host's own deadline; then the guest's result frame (checked:
/// the value's size and validity, and the failure kinds the reporter may claim); then, with
/// no result, the exit.
pub fn classify(
    outcome: Option<Outcome>,
    exit: Exit,
    evidence: Evidence,
    reporter: Reporter,
    max_value_bytes: u64,
) -> Result<Value, RunError> {
    if exit == Exit::TimedOut {
        return Err(RunError::new(
            ErrorKind::Timeout,
            "the wall-clock limit was reached",
        ));
    }
    if let Some(outcome) = outcome {
        return match outcome.value {
            Ok(json) => decode_value(&json, max_value_bytes),
            Err(failure) => Err(failure_error(failure, reporter)),
        };
    }
    match exit {
        Exit::TimedOut => Err(RunError::new(
            ErrorKind::Timeout,
            "the wall-clock limit was reached",
        )),
        _ if evidence.oom_killed => Err(RunError::new(
            ErrorKind::MemoryLimit,
            "the guest ran out of memory under the memory limit",
        )),
        _ if evidence.cpu_time_exceeded => Err(RunError::new(
            ErrorKind::Timeout,
            "the CPU-time limit was reached",
        )),
        Exit::Code(0) => Ok(Value::Null),
        Exit::Code(BOOTSTRAP_FAILED) | Exit::SandboxFailed => Err(RunError::new(
            ErrorKind::BackendError,
            "the sandbox could not start the guest",
        )),
        Exit::Code(_) => Err(RunError::new(
            ErrorKind::GuestException,
            "the guest exited with a failure status",
        )),
        Exit::Signal(SIGXCPU) => Err(RunError::new(
            ErrorKind::Timeout,
            "the CPU-time limit was reached",
        )),
        Exit::Signal(SIGXFSZ) => Err(RunError::new(
            ErrorKind::GuestException,
            "the guest wrote a file larger than the limit",
        )),
        Exit::Signal(SIGKILL) => Err(RunError::new(
            ErrorKind::BackendError,
            "the guest interpreter was killed",
        )),
        Exit::Signal(n) => Err(RunError::new(
            ErrorKind::BackendError,
            format!("the guest interpreter crashed (signal {n})"),
        )),
        Exit::Exception(STATUS_STACK_OVERFLOW) => Err(RunError::new(
            ErrorKind::StackOverflow,
            "the guest interpreter overflowed its stack (exception 0xC00000FD)",
        )),
        Exit::Exception(code) => Err(RunError::new(
            ErrorKind::BackendError,
            match exception_name(code) {
                Some(name) => {
                    format!("the guest interpreter crashed ({name}, exception 0x{code:08X})")
                }
                None => format!("the guest interpreter crashed (exception 0x{code:08X})"),
            },
        )),
    }
}

/// Maps a reported failure, keeping only what the reporter may claim.
fn failure_error(failure: RunError, reporter: Reporter) -> RunError {
    let exception = failure
        .exception
        .map(|e| cap_chars(&e, MAX_EXCEPTION_CHARS));
    let claimed = failure.kind;
    let kind = match reporter {
        Reporter::Worker => claimed,
        Reporter::Guest => match claimed {
            // A native interpreter's MemoryError comes from the address-space limit.
            ErrorKind::GuestException if exception.as_deref() == Some("MemoryError") => {
                ErrorKind::MemoryLimit
            }
            ErrorKind::GuestException
            | ErrorKind::SyntaxError
            | ErrorKind::InvalidInput
            | ErrorKind::ValueTooLarge => claimed,
            ErrorKind::Timeout
            | ErrorKind::FuelExhausted
            | ErrorKind::MemoryLimit
            | ErrorKind::StackOverflow
            | ErrorKind::ToolCallLimit
            | ErrorKind::CapabilityDenied
            | ErrorKind::BackendError
            | ErrorKind::Unsupported
            | ErrorKind::SessionEnded
            | ErrorKind::SessionBusy
            | ErrorKind::SessionNotFound
            | ErrorKind::TooManySessions
            | ErrorKind::Busy
            | ErrorKind::Suspended
            | ErrorKind::ReplayDiverged => {
                return RunError::new(
                    ErrorKind::GuestException,
                    "the guest reported a failure it cannot know about",
                );
            }
        },
    };
    RunError {
        kind,
        message: cap_chars(&failure.message, MAX_MESSAGE_CHARS),
        traceback: failure
            .traceback
            .map(|t| cap_chars(&t, MAX_TRACEBACK_CHARS)),
        exception,
    }
}

/// The [`Exit`] of a process status. A status of 128 + n from `docker run` is the container's
/// process ended by signal n; 125–127 are Docker's own failures.
#[cfg(unix)]
pub(crate) fn exit_of(status: std::process::ExitStatus, docker: bool) -> Exit {
    if let Some(signal) = super::sys::exit_signal(status) {
        return Exit::Signal(signal);
    }
    match status.code() {
        Some(125..=127) if docker => Exit::SandboxFailed,
        Some(code @ 129..=192) if docker => Exit::Signal(code - 128),
        Some(code) => Exit::Code(code),
        None => Exit::SandboxFailed,
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;

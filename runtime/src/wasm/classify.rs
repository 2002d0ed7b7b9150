//! The wasm family's one classifier: how a wasm run that produced no value ended, from engine
//! errors and traps (by downcasting), the guest's own failure report (checked against the
//! store's evidence), and the run's deadline. The OS backends have theirs in `os::classify`.

use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

use super::bindings::exports::pycage::sandbox::guest::{Failure, FailureKind};
use super::linker::CapabilityDenied;
use crate::capture::Captured;
use crate::result::{MAX_EXCEPTION_CHARS, MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, cap_chars};
use crate::{ErrorKind, RunError};

/// What the store recorded during the run, which decides between look-alike failures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evidence<'a> {
    /// The memory limiter refused a growth.
    pub memory_denied: bool,
    /// The fuel budget, when one was set.
    pub fuel_budget: Option<u64>,
    /// The WASI import the guest called that the sandbox does not grant, if any.
    pub denied_capability: Option<&'a str>,
}

/// The run's wall-clock deadline passed while the guest was blocked (a host call, a sleep).
pub(crate) fn deadline_passed() -> RunError {
    RunError::new(ErrorKind::Timeout, "the wall-clock limit was reached")
}

/// The end of a session run that was interrupted at its deadline (`super::interrupt`), with
/// the failure the guest reported, if any. `trapped`: the code did not stop within the grace
/// period, and the instance (so the session) is gone.
pub(crate) fn interrupted(
    failure: Option<Failure>,
    evidence: &Evidence<'_>,
    trapped: bool,
) -> RunError {
    if trapped {
        return crate::backend::interrupt_ignored();
    }
    crate::backend::interrupted(failure.map(|f| guest_failure(f, evidence)))
}

/// The end of a guest that did not return normally.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The guest exited through `wasi:cli/exit` with status 0: a normal end without a value.
    CleanExit,
    /// The run failed.
    Failed(RunError),
}

/// Classifies an error returned by instantiating or calling the guest.
///
/// Traps are recognised by downcasting, never by their text; the text of an unrecognised
/// error is logged for the operator and never shown to the guest's caller.
pub(crate) fn classify(error: &wasmtime::Error, evidence: &Evidence<'_>) -> Ending {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        // WASI 0.2's `exit` carries success or failure, not the status number.
        return match exit.0 {
            0 => Ending::CleanExit,
            _ => Ending::Failed(RunError::new(
                ErrorKind::GuestException,
                "the guest exited with a failure status",
            )),
        };
    }
    if let Some(denied) = error.downcast_ref::<CapabilityDenied>() {
        return Ending::Failed(RunError::new(
            ErrorKind::CapabilityDenied,
            denied.to_string(),
        ));
    }
    if let Some(trap) = error.downcast_ref::<Trap>() {
        return Ending::Failed(classify_trap(*trap, evidence));
    }
    if evidence.memory_denied {
        // The guest's own code failed after the limiter refused it memory: an interpreter out
        // of memory can break its glue's invariants (the canonical ABI's handle table sees a
        // resource handle dropped twice: "unknown handle index"), which the engine reports as
        // an error, not a trap. The memory limit ended the run; pycage did not fail.
        tracing::debug!(error = ?error, "pycage: the guest failed after running out of memory");
        return Ending::Failed(out_of_memory());
    }
    tracing::error!(error = ?error, "pycage: unclassified guest error");
    Ending::Failed(RunError::new(
        ErrorKind::BackendError,
        "the sandbox failed internally",
    ))
}

fn classify_trap(trap: Trap, evidence: &Evidence<'_>) -> RunError {
    match trap {
        Trap::OutOfFuel => RunError::new(
            ErrorKind::FuelExhausted,
            match evidence.fuel_budget {
                Some(budget) => format!("the fuel budget of {budget} ran out"),
                None => "the fuel ran out".to_owned(),
            },
        ),
        Trap::Interrupt => deadline_passed(),
        Trap::StackOverflow => RunError::new(
            ErrorKind::StackOverflow,
            "the guest's stack overflowed (recursion too deep for the interpreter to catch)",
        ),
        _ if evidence.memory_denied => out_of_memory(),
        other => RunError::new(
            ErrorKind::BackendError,
            format!("the guest interpreter crashed ({})", trap_name(other)),
        ),
    }
}

/// A run the memory limit ended without the guest reporting it: the interpreter trapped or
/// its glue failed once the limiter had refused it memory. The exception is the one CPython
/// raises for it, so a caller sees the same `MemoryError` whichever way the guest went down.
fn out_of_memory() -> RunError {
    RunError {
        exception: Some("MemoryError".to_owned()),
        ..RunError::new(
            ErrorKind::MemoryLimit,
            "the guest ran out of memory under the memory limit",
        )
    }
}

/// Classifies the guest's own report of a failed run, checked against what the host saw: the
/// guest is not trusted to say that the memory limit or a denied capability ended it.
pub(crate) fn guest_failure(failure: Failure, evidence: &Evidence<'_>) -> RunError {
    let mut exception = failure
        .exception
        .map(|e| cap_chars(&e, MAX_EXCEPTION_CHARS));
    // A `MemoryError` while the guest compiled the code is reported as a syntax error ("the
    // code is nested too deeply", which is what it means with memory to spare); when the
    // limiter had refused memory, the memory limit ended the run.
    let compile_out_of_memory = evidence.memory_denied
        && matches!(failure.kind, FailureKind::SyntaxError)
        && failure.message.starts_with("MemoryError");
    if compile_out_of_memory {
        exception = Some("MemoryError".to_owned());
    }
    let kind = match failure.kind {
        _ if compile_out_of_memory => ErrorKind::MemoryLimit,
        FailureKind::SyntaxError => ErrorKind::SyntaxError,
        FailureKind::InvalidInput => ErrorKind::InvalidInput,
        FailureKind::ValueTooLarge => ErrorKind::ValueTooLarge,
        FailureKind::GuestException => match exception.as_deref() {
            // `SystemError`: the interpreter failed inside (a builtin "returned NULL without
            // setting an exception"), which CPython does when an allocation fails where it did
            // not expect one; with memory refused, that is the memory limit too.
            Some("MemoryError" | "SystemError") if evidence.memory_denied => ErrorKind::MemoryLimit,
            Some("PermissionError") if evidence.denied_capability.is_some() => {
                ErrorKind::CapabilityDenied
            }
            _ => ErrorKind::GuestException,
        },
    };
    let mut message = cap_chars(&failure.message, MAX_MESSAGE_CHARS);
    if kind == ErrorKind::CapabilityDenied
        && let Some(import) = evidence.denied_capability
    {
        message = format!("{message} (the sandbox does not grant `{import}`)");
    }
    RunError {
        kind,
        message,
        traceback: failure
            .traceback
            .map(|t| cap_chars(&t, MAX_TRACEBACK_CHARS)),
        exception,
    }
}

/// The guest's stderr of a run whose instance trapped, without the banner the guest's runtime
/// wrote before it aborted: componentize-py's runtime is Rust inside the guest, and a panic
/// there (a Python object it could not allocate once memory ran out: "PyObject pointer is
/// null") prints `thread '<unnamed>' (1) panicked at <a path of the machine that built it>`.
/// That is the runtime's diagnostic, not the code's output, and results carry no panic text;
/// it goes to the log instead.
pub(crate) fn without_runtime_panic(mut stderr: Captured) -> Captured {
    const THREAD: &str = "thread '<unnamed>'";
    let Some(at) = stderr.text.rfind(THREAD) else {
        return stderr;
    };
    if !stderr.text[at..].contains(" panicked at ") {
        return stderr;
    }
    tracing::debug!(banner = %&stderr.text[at..], "pycage: the guest's runtime panicked");
    // The banner starts on a line of its own, after a blank one.
    let kept = stderr.text[..at].trim_end_matches('\n').len();
    stderr.text.truncate(kept);
    if !stderr.text.is_empty() {
        stderr.text.push('\n');
    }
    stderr
}

/// A short, host-independent name for a trap.
fn trap_name(trap: Trap) -> String {
    // `Trap`'s Display is a fixed text per variant (no paths, no addresses).
    trap.to_string()
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;

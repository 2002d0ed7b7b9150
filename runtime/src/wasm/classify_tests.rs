use super::*;

fn evidence(memory_denied: bool) -> Evidence<'static> {
    Evidence {
        memory_denied,
        fuel_budget: None,
        denied_capability: None,
    }
}

fn failed(ending: Ending) -> RunError {
    match ending {
        Ending::Failed(e) => e,
        Ending::CleanExit => panic!("a failure was classified as a clean exit"),
    }
}

/// The engine's words when the guest's glue drops a resource handle it no longer holds.
fn handle_error() -> wasmtime::Error {
    wasmtime::Error::msg("unknown handle index 1")
}

#[test]
fn a_guest_error_after_the_limiter_refused_memory_is_the_memory_limit() {
    let e = failed(classify(&handle_error(), &evidence(true)));
    assert_eq!(e.kind, ErrorKind::MemoryLimit);
    assert_eq!(e.exception.as_deref(), Some("MemoryError"));
    assert!(!e.message.contains("handle"), "{e:?}");
}

#[test]
fn the_same_error_with_memory_to_spare_is_pycages_fault_and_its_text_stays_in_the_log() {
    let e = failed(classify(&handle_error(), &evidence(false)));
    assert_eq!(e.kind, ErrorKind::BackendError);
    assert!(!e.message.contains("handle"), "{e:?}");
}

#[test]
fn a_trap_after_the_limiter_refused_memory_names_the_exception_too() {
    let trap = wasmtime::Error::from(Trap::UnreachableCodeReached);
    let e = failed(classify(&trap, &evidence(true)));
    assert_eq!(e.kind, ErrorKind::MemoryLimit);
    assert_eq!(e.exception.as_deref(), Some("MemoryError"));
    // Fuel and the wall clock are the run's own ends, whatever the memory did before.
    let fuel = wasmtime::Error::from(Trap::OutOfFuel);
    assert_eq!(
        failed(classify(&fuel, &evidence(true))).kind,
        ErrorKind::FuelExhausted
    );
}

fn syntax_failure(message: &str) -> Failure {
    Failure {
        kind: FailureKind::SyntaxError,
        message: message.to_owned(),
        exception: None,
        traceback: None,
    }
}

#[test]
fn a_compile_out_of_memory_is_the_memory_limit_only_when_the_limiter_refused_memory() {
    let message = "MemoryError: the code is nested too deeply";
    let e = guest_failure(syntax_failure(message), &evidence(true));
    assert_eq!(e.kind, ErrorKind::MemoryLimit);
    assert_eq!(e.exception.as_deref(), Some("MemoryError"));
    // The guest's word alone proves nothing: with memory to spare it is a syntax error.
    let e = guest_failure(syntax_failure(message), &evidence(false));
    assert_eq!(e.kind, ErrorKind::SyntaxError);
    let e = guest_failure(
        syntax_failure("SyntaxError: invalid syntax"),
        &evidence(true),
    );
    assert_eq!(e.kind, ErrorKind::SyntaxError);
}

fn captured(text: &str) -> Captured {
    Captured {
        text: text.to_owned(),
        truncated: false,
    }
}

#[test]
fn the_guest_runtimes_panic_banner_is_cut_from_a_trapped_runs_stderr() {
    let banner = "\nthread '<unnamed>' (1) panicked at /root/.cargo/registry/src/x/pyo3-0.28.3/src/instance.rs:349:60:\nPyObject pointer is null\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
    assert_eq!(
        without_runtime_panic(captured(&format!("the code's line\n{banner}"))).text,
        "the code's line\n"
    );
    assert_eq!(without_runtime_panic(captured(banner)).text, "");
    // The code's own words stay, even when they look alike.
    let own = "thread '<unnamed>' is a name I like\n";
    assert_eq!(without_runtime_panic(captured(own)).text, own);
}

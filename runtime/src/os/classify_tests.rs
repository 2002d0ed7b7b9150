use serde_json::json;

use super::*;

fn value(json: &str) -> Option<Outcome> {
    Some(Outcome {
        value: Ok(json.into()),
        report: None,
    })
}

fn failure(kind: ErrorKind, exception: Option<&str>) -> Option<Outcome> {
    Some(Outcome {
        value: Err(RunError {
            kind,
            message: "m".into(),
            traceback: Some("tb".into()),
            exception: exception.map(Into::into),
        }),
        report: None,
    })
}

fn kind(r: Result<Value, RunError>) -> ErrorKind {
    r.expect_err("a failure").kind
}

const MAX: u64 = 1 << 20;

#[test]
fn a_reported_value_is_checked_on_the_host() {
    let ok = classify(
        value("[1, 2]"),
        Exit::Code(0),
        Evidence::default(),
        Reporter::Guest,
        MAX,
    );
    assert_eq!(ok.unwrap(), json!([1, 2]));
    let big = classify(
        value("\"xxxxxxxx\""),
        Exit::Code(0),
        Evidence::default(),
        Reporter::Guest,
        4,
    );
    assert_eq!(kind(big), ErrorKind::ValueTooLarge);
    let bad = classify(
        value("{nope"),
        Exit::Code(0),
        Evidence::default(),
        Reporter::Guest,
        MAX,
    );
    assert_eq!(kind(bad), ErrorKind::GuestException);
}

#[test]
fn the_hosts_deadline_wins_over_anything_reported() {
    let r = classify(
        value("1"),
        Exit::TimedOut,
        Evidence::default(),
        Reporter::Guest,
        MAX,
    );
    assert_eq!(kind(r), ErrorKind::Timeout);
}

#[test]
fn a_guest_cannot_claim_host_side_failures() {
    for claimed in [
        ErrorKind::Timeout,
        ErrorKind::FuelExhausted,
        ErrorKind::ToolCallLimit,
        ErrorKind::BackendError,
        ErrorKind::CapabilityDenied,
        ErrorKind::MemoryLimit,
    ] {
        let r = classify(
            failure(claimed, None),
            Exit::Code(0),
            Evidence::default(),
            Reporter::Guest,
            MAX,
        );
        assert_eq!(kind(r), ErrorKind::GuestException, "{claimed}");
    }
    for own in [
        ErrorKind::SyntaxError,
        ErrorKind::GuestException,
        ErrorKind::InvalidInput,
        ErrorKind::ValueTooLarge,
    ] {
        let r = classify(
            failure(own, None),
            Exit::Code(0),
            Evidence::default(),
            Reporter::Guest,
            MAX,
        );
        let e = r.unwrap_err();
        assert_eq!(e.kind, own);
        assert_eq!(e.traceback.as_deref(), Some("tb"));
    }
    // The layered worker's engine classifies for itself.
    let r = classify(
        failure(ErrorKind::FuelExhausted, None),
        Exit::Code(0),
        Evidence::default(),
        Reporter::Worker,
        MAX,
    );
    assert_eq!(kind(r), ErrorKind::FuelExhausted);
}

#[test]
fn memory_errors_of_a_native_guest_are_the_memory_limit() {
    let r = classify(
        failure(ErrorKind::GuestException, Some("MemoryError")),
        Exit::Code(0),
        Evidence::default(),
        Reporter::Guest,
        MAX,
    );
    assert_eq!(kind(r), ErrorKind::MemoryLimit);
}

#[test]
fn without_a_result_the_exit_decides() {
    let none = Evidence::default();
    let oom = Evidence {
        oom_killed: true,
        ..Evidence::default()
    };
    let c = |exit, ev| classify(None, exit, ev, Reporter::Guest, MAX);
    assert_eq!(c(Exit::Code(0), none).unwrap(), Value::Null);
    assert_eq!(kind(c(Exit::Code(3), none)), ErrorKind::GuestException);
    assert_eq!(
        kind(c(Exit::Code(BOOTSTRAP_FAILED), none)),
        ErrorKind::BackendError
    );
    assert_eq!(kind(c(Exit::SandboxFailed, none)), ErrorKind::BackendError);
    assert_eq!(kind(c(Exit::Signal(9), oom)), ErrorKind::MemoryLimit);
    assert_eq!(kind(c(Exit::Code(1), oom)), ErrorKind::MemoryLimit);
    assert_eq!(kind(c(Exit::Signal(9), none)), ErrorKind::BackendError);
    assert_eq!(kind(c(Exit::Signal(24), none)), ErrorKind::Timeout);
    assert_eq!(kind(c(Exit::Signal(11), none)), ErrorKind::BackendError);
    assert_eq!(kind(c(Exit::TimedOut, oom)), ErrorKind::Timeout);
}

#[test]
fn reported_texts_are_capped() {
    let long = Some(Outcome {
        value: Err(RunError {
            kind: ErrorKind::GuestException,
            message: "m".repeat(10_000),
            traceback: Some("t".repeat(100_000)),
            exception: Some("E".repeat(1000)),
        }),
        report: None,
    });
    let e = classify(
        long,
        Exit::Code(0),
        Evidence::default(),
        Reporter::Guest,
        MAX,
    )
    .unwrap_err();
    assert!(e.message.chars().count() <= 2001);
    assert!(e.traceback.unwrap().chars().count() <= 16_001);
    assert!(e.exception.unwrap().chars().count() <= 201);
}

#[cfg(unix)]
#[test]
fn docker_statuses_map_to_signals_and_sandbox_failures() {
    use std::os::unix::process::ExitStatusExt;
    let code = |c: i32| std::process::ExitStatus::from_raw(c << 8);
    assert_eq!(exit_of(code(137), true), Exit::Signal(9));
    assert_eq!(exit_of(code(125), true), Exit::SandboxFailed);
    assert_eq!(exit_of(code(137), false), Exit::Code(137));
    assert_eq!(exit_of(code(0), true), Exit::Code(0));
    assert_eq!(
        exit_of(std::process::ExitStatus::from_raw(9), false),
        Exit::Signal(9)
    );
}

#[test]
fn the_hosts_cpu_accounting_is_the_cpu_limit() {
    let cpu = Evidence {
        cpu_time_exceeded: true,
        ..Evidence::default()
    };
    let c = |exit, ev| classify(None, exit, ev, Reporter::Guest, MAX);
    let e = c(Exit::Code(1816), cpu).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(e.message, "the CPU-time limit was reached");
    // Without the host's accounting, the same status is the guest's own failure.
    assert_eq!(
        kind(c(Exit::Code(1816), Evidence::default())),
        ErrorKind::GuestException
    );
    // A reported result still wins over the accounting; the wall clock over both.
    assert_eq!(
        classify(value("1"), Exit::Code(1816), cpu, Reporter::Guest, MAX).unwrap(),
        json!(1)
    );
    assert_eq!(kind(c(Exit::TimedOut, cpu)), ErrorKind::Timeout);
}

#[test]
fn exceptions_are_crashes_except_a_stack_overflow() {
    let c = |exit| classify(None, exit, Evidence::default(), Reporter::Guest, MAX);
    let e = c(Exit::Exception(0xC000_0005)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BackendError);
    assert_eq!(
        e.message,
        "the guest interpreter crashed (an access violation, exception 0xC0000005)"
    );
    let e = c(Exit::Exception(0xC000_00FD)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::StackOverflow);
    let e = c(Exit::Exception(0xC000_0017)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BackendError, "no host evidence: a crash");
    assert!(e.message.contains("out of memory"), "{}", e.message);
    let e = c(Exit::Exception(0xC0AB_CDEF)).unwrap_err();
    assert_eq!(
        e.message,
        "the guest interpreter crashed (exception 0xC0ABCDEF)"
    );
    // With the job's report of its memory limit, it is the memory limit.
    let oom = Evidence {
        oom_killed: true,
        ..Evidence::default()
    };
    let r = classify(
        None,
        Exit::Exception(0xC000_0017),
        oom,
        Reporter::Guest,
        MAX,
    );
    assert_eq!(kind(r), ErrorKind::MemoryLimit);
}

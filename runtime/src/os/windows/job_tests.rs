use super::*;
use crate::ErrorKind;
use crate::os::classify::{Reporter, classify};

fn limits() -> JobLimits {
    JobLimits {
        process_memory_bytes: 128 << 20,
        job_memory_bytes: 256 << 20,
        active_processes: 64,
        job_user_time_100ns: 60_000_000,
        kill_on_job_close: true,
        die_on_unhandled_exception: true,
        ui_restrictions_all: true,
    }
}

#[test]
fn every_limit_is_set_and_breaking_away_never_is() {
    let plan = JobPlan::new(&limits());
    assert_eq!(
        plan,
        JobPlan {
            limit_flags: 0x0000_270C,
            per_job_user_time_limit: 60_000_000,
            active_process_limit: 64,
            process_memory_limit: 128 << 20,
            job_memory_limit: 256 << 20,
            ui_restrictions: 0x1FF,
        }
    );
    for flag in [
        LIMIT_PROCESS_MEMORY,
        LIMIT_JOB_MEMORY,
        LIMIT_ACTIVE_PROCESS,
        LIMIT_JOB_TIME,
        LIMIT_KILL_ON_JOB_CLOSE,
        LIMIT_DIE_ON_UNHANDLED_EXCEPTION,
    ] {
        assert_ne!(plan.limit_flags & flag, 0, "{flag:#x}");
    }
    assert_eq!(
        plan.limit_flags & (LIMIT_BREAKAWAY_OK | LIMIT_SILENT_BREAKAWAY_OK),
        0
    );
}

#[test]
fn the_switches_are_obeyed_and_times_saturate() {
    let plan = JobPlan::new(&JobLimits {
        kill_on_job_close: false,
        die_on_unhandled_exception: false,
        ui_restrictions_all: false,
        job_user_time_100ns: u64::MAX,
        ..limits()
    });
    assert_eq!(plan.limit_flags & LIMIT_KILL_ON_JOB_CLOSE, 0);
    assert_eq!(plan.limit_flags & LIMIT_DIE_ON_UNHANDLED_EXCEPTION, 0);
    assert_eq!(plan.ui_restrictions, 0);
    assert_eq!(plan.per_job_user_time_limit, i64::MAX);
}

#[test]
fn the_completion_port_messages_that_matter() {
    let mut events = JobEvents::default();
    for message in [6, 7, 8, 3, 11] {
        events.note(message); // new process, exit, abnormal exit, process limit, notification
    }
    assert_eq!(events, JobEvents::default());
    events.note(MSG_PROCESS_MEMORY_LIMIT);
    assert!(events.memory_limit_reached);
    let mut job = JobEvents::default();
    job.note(MSG_JOB_MEMORY_LIMIT);
    assert!(job.memory_limit_reached && !job.all_exited);
    job.note(MSG_ACTIVE_PROCESS_ZERO);
    assert!(job.all_exited);
}

#[test]
fn exit_codes_become_exits() {
    assert_eq!(exit_of_code(0), Exit::Code(0));
    assert_eq!(exit_of_code(1), Exit::Code(1));
    assert_eq!(exit_of_code(121), Exit::Code(121));
    assert_eq!(exit_of_code(ERROR_NOT_ENOUGH_QUOTA), Exit::Code(1816));
    assert_eq!(exit_of_code(u32::MAX), Exit::Code(-1), "sys.exit(-1)");
    assert_eq!(exit_of_code(0xC000_0005), Exit::Exception(0xC000_0005));
    assert_eq!(exit_of_code(0xC000_00FD), Exit::Exception(0xC000_00FD));
    assert_eq!(exit_of_code(0xC000_0017), Exit::Exception(0xC000_0017));
    assert_eq!(exit_of_code(0xC000_0409), Exit::Exception(0xC000_0409));
    assert_eq!(exit_of_code(0x8000_0003), Exit::Exception(0x8000_0003));
    assert_eq!(exit_of_code(0xC000_0135), Exit::SandboxFailed);
    assert_eq!(exit_of_code(0xC000_0142), Exit::SandboxFailed);
}

fn report(end: JobEnd) -> JobReport {
    JobReport {
        end,
        events: JobEvents {
            all_exited: true,
            ..JobEvents::default()
        },
        terminated_by_limit: 0,
        user_time_100ns: 1_000,
        user_time_limit_100ns: 60_000_000,
    }
}

/// The error kind the one classifier gives a report, with no result frame.
fn kind_of(report: &JobReport) -> Option<ErrorKind> {
    let (exit, evidence) = exit_of(report);
    classify(None, exit, evidence, Reporter::Guest, 1 << 20)
        .err()
        .map(|e| e.kind)
}

#[test]
fn the_host_classifies_what_the_job_saw() {
    assert_eq!(kind_of(&report(JobEnd::Exited(0))), None);
    assert_eq!(
        kind_of(&report(JobEnd::Exited(1))),
        Some(ErrorKind::GuestException)
    );
    assert_eq!(
        kind_of(&report(JobEnd::Exited(121))),
        Some(ErrorKind::BackendError),
        "the bootstrap could not start"
    );
    assert_eq!(kind_of(&report(JobEnd::TimedOut)), Some(ErrorKind::Timeout));
    assert_eq!(
        kind_of(&report(JobEnd::Exited(0xC000_0005))),
        Some(ErrorKind::BackendError)
    );
    assert_eq!(
        kind_of(&report(JobEnd::Exited(0xC000_00FD))),
        Some(ErrorKind::StackOverflow)
    );
    assert_eq!(
        kind_of(&report(JobEnd::Exited(0xC000_0135))),
        Some(ErrorKind::BackendError)
    );
}

#[test]
fn the_cpu_limit_counts_on_the_jobs_accounting_only() {
    // The kernel's termination for the limit: the processes exit with ERROR_NOT_ENOUGH_QUOTA.
    let killed = JobReport {
        terminated_by_limit: 1,
        user_time_100ns: 60_000_000,
        ..report(JobEnd::Exited(ERROR_NOT_ENOUGH_QUOTA))
    };
    let (exit, evidence) = exit_of(&killed);
    assert_eq!(exit, Exit::Code(1816));
    assert!(evidence.cpu_time_exceeded && !evidence.oom_killed);
    assert_eq!(kind_of(&killed), Some(ErrorKind::Timeout));
    // Either kernel count is enough.
    let spent = JobReport {
        terminated_by_limit: 0,
        ..killed
    };
    assert_eq!(kind_of(&spent), Some(ErrorKind::Timeout));
    // The same code chosen by the guest, without either, is its own failure.
    let claimed = report(JobEnd::Exited(ERROR_NOT_ENOUGH_QUOTA));
    assert!(!exit_of(&claimed).1.cpu_time_exceeded);
    assert_eq!(kind_of(&claimed), Some(ErrorKind::GuestException));
}

#[test]
fn the_memory_limit_counts_on_the_completion_port_only() {
    let mut hit = report(JobEnd::Exited(0xC000_0017));
    hit.events.note(MSG_PROCESS_MEMORY_LIMIT);
    assert_eq!(kind_of(&hit), Some(ErrorKind::MemoryLimit));
    let mut job_wide = report(JobEnd::Exited(1));
    job_wide.events.note(MSG_JOB_MEMORY_LIMIT);
    assert_eq!(kind_of(&job_wide), Some(ErrorKind::MemoryLimit));
    // STATUS_NO_MEMORY without the job's word: the host ran out, not the run's limit.
    assert_eq!(
        kind_of(&report(JobEnd::Exited(0xC000_0017))),
        Some(ErrorKind::BackendError)
    );
    // The wall clock wins over both.
    let mut late = report(JobEnd::TimedOut);
    late.events.note(MSG_JOB_MEMORY_LIMIT);
    assert_eq!(kind_of(&late), Some(ErrorKind::Timeout));
}

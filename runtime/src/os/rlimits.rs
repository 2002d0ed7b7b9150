//! [`Rlimits`]: the resource limits of a sandboxed process, derived from the run's
//! [`Limits`], and the `prlimit` command line that applies them.
//!
//! rlimits are per process, and `RLIMIT_NPROC` is not enforced for the real root user:
//! where the host allows it, a cgroup (see [`cgroup`](super::cgroup)) caps the whole process
//! tree's memory and process count on top of these.

use std::ffi::OsString;

use crate::Limits;

/// Where `prlimit` (util-linux) is; never looked up on `PATH`.
pub const PRLIMIT: &str = "/usr/bin/prlimit";

/// The most processes (and threads) a run may add.
pub const MAX_PROCESSES: u64 = 64;

/// The most open files per process.
pub const MAX_OPEN_FILES: u64 = 256;

/// The CPU seconds each process of a session's guest may use over the session's whole life.
///
/// `RLIMIT_CPU` counts a process's CPU time from its start, so for a process serving many
/// runs it cannot be one run's budget: each run's wall-clock deadline is enforced by the
/// host (which kills the tree), and this is the backstop behind it, an hour of CPU per
/// process (the default session lifetime of a
/// [`SessionConfig`](crate::SessionConfig)).
pub const SESSION_CPU_SECONDS: u64 = 3600;

/// The limits applied to every process of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rlimits {
    /// `RLIMIT_CPU`: seconds of CPU time. At this soft limit the process gets `SIGXCPU`; one
    /// second later (the hard limit) `SIGKILL`.
    pub cpu_seconds: u64,
    /// `RLIMIT_AS`: bytes of address space; `None` leaves it unlimited (a wasm engine
    /// reserves far more address space than it uses).
    pub address_space: Option<u64>,
    /// `RLIMIT_NPROC`: processes of the user; `None` leaves it as it is.
    pub processes: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file the run may write.
    pub file_size: u64,
    /// `RLIMIT_NOFILE`: open files per process.
    pub open_files: u64,
    /// `RLIMIT_CORE`: always 0. A crashing guest writes no core file (its memory) anywhere, and
    /// does not spend its wall clock writing one.
    pub core_bytes: u64,
}

impl Rlimits {
    /// The rlimits for a run: CPU seconds one more than the wall-clock limit (rounded up),
    /// address space at the memory limit, file size at [`scratch_bytes`], [`MAX_OPEN_FILES`],
    /// no core files, and `processes` as given.
    ///
    /// `RLIMIT_NPROC` counts every process of the user, not only the run's, so the caller
    /// passes the user's current count plus [`MAX_PROCESSES`].
    pub fn for_limits(limits: &Limits, processes: Option<u64>) -> Rlimits {
        let wall = limits.wall_timeout();
        let secs = wall.as_secs() + u64::from(wall.subsec_nanos() > 0);
        Rlimits {
            cpu_seconds: secs + 1,
            address_space: Some(limits.memory_bytes()),
            processes,
            file_size: scratch_bytes(limits),
            open_files: MAX_OPEN_FILES,
            core_bytes: 0,
        }
    }

    /// The rlimits for a session's guest: as [`for_limits`](Self::for_limits) with the
    /// session's limits, but [`SESSION_CPU_SECONDS`] of CPU time.
    pub fn for_session(limits: &Limits, processes: Option<u64>) -> Rlimits {
        Rlimits {
            cpu_seconds: SESSION_CPU_SECONDS,
            ..Self::for_limits(limits, processes)
        }
    }

    /// The `prlimit` arguments (after the program) that apply these limits, up to and
    /// including the `--` before the command.
    pub fn prlimit_args(&self) -> Vec<OsString> {
        let mut args = vec![format!(
            "--cpu={}:{}",
            self.cpu_seconds,
            self.cpu_seconds + 1
        )];
        if let Some(bytes) = self.address_space {
            args.push(format!("--as={bytes}"));
        }
        if let Some(n) = self.processes {
            args.push(format!("--nproc={n}"));
        }
        args.push(format!("--fsize={}", self.file_size));
        args.push(format!("--nofile={}", self.open_files));
        args.push(format!("--core={}", self.core_bytes));
        args.push("--".into());
        args.into_iter().map(OsString::from).collect()
    }

    /// `command` run under these limits: `/usr/bin/prlimit <limits> -- command...`.
    pub fn wrap(&self, command: Vec<OsString>) -> Vec<OsString> {
        let mut argv = vec![OsString::from(PRLIMIT)];
        argv.extend(self.prlimit_args());
        argv.extend(command);
        argv
    }
}

/// The space a run may write (its `/tmp`, and the largest file): a quarter of the memory
/// limit, so a full disk is an `OSError` before the writes (which a tmpfs keeps in memory)
/// exhaust the memory limit.
pub fn scratch_bytes(limits: &Limits) -> u64 {
    limits.memory_bytes() / 4
}

/// How many processes the user `uid` runs now, counted in `/proc` (for `RLIMIT_NPROC`,
/// which counts them all). Uses ambient authority: the process's view of `/proc`.
pub fn user_process_count(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            e.metadata()
                .is_ok_and(|m| super::sys::owner(&m) == Some(uid))
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn limits_become_prlimit_arguments() {
        let limits = Limits::builder()
            .wall_timeout(Duration::from_millis(1500))
            .memory_bytes(128 << 20)
            .build()
            .unwrap();
        let r = Rlimits::for_limits(&limits, Some(70));
        assert_eq!(r.cpu_seconds, 3);
        let argv = r.wrap(vec!["/usr/bin/python3".into()]);
        let argv: Vec<_> = argv.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            argv,
            [
                "/usr/bin/prlimit",
                "--cpu=3:4",
                "--as=134217728",
                "--nproc=70",
                "--fsize=33554432",
                "--nofile=256",
                "--core=0",
                "--",
                "/usr/bin/python3"
            ]
        );
    }

    #[test]
    fn a_session_has_a_lifetime_cpu_budget_and_the_run_limits_otherwise() {
        let limits = Limits::builder()
            .wall_timeout(Duration::from_millis(1500))
            .build()
            .unwrap();
        let session = Rlimits::for_session(&limits, Some(70));
        assert_eq!(session.cpu_seconds, SESSION_CPU_SECONDS);
        assert_eq!(
            Rlimits {
                cpu_seconds: 3,
                ..session
            },
            Rlimits::for_limits(&limits, Some(70))
        );
    }

    #[test]
    fn optional_limits_are_left_out() {
        let mut r = Rlimits::for_limits(&Limits::default(), None);
        r.address_space = None;
        assert_eq!(r.cpu_seconds, 31);
        let args: Vec<_> = r.prlimit_args().into_iter().collect();
        assert!(!args.iter().any(|a| a.to_str().unwrap().starts_with("--as")));
        assert!(
            !args
                .iter()
                .any(|a| a.to_str().unwrap().starts_with("--nproc"))
        );
        assert_eq!(args.last().unwrap(), "--");
    }

    #[test]
    fn the_user_runs_at_least_this_process() {
        assert!(user_process_count(crate::os::sys::uid()) >= 1);
    }
}

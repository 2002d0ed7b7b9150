//! The Seatbelt backend (macOS): native CPython under a `sandbox-exec` profile.
//!
//! # Security
//!
//! The profile ([`render_profile`]) denies all network access except the run's broker
//! socket, denies file writes outside the run's private directory (and `/dev/null`), and
//! denies reads of a configurable list of secret directories (by default `~/.ssh`, `~/.aws`,
//! `~/.config/gcloud`, `~/.azure`, `~/.kube`, `~/.docker`, `~/.gnupg`, `~/.netrc`,
//! `~/Library/Keychains`, ...). The environment is cleared, and a shell applies the CPU,
//! open-file and file-size rlimits before `sandbox-exec` starts.
//!
//! Not protected: everything else the user can read stays readable (Seatbelt here is a
//! deny-list for reads), processes and memory are not capped (macOS has no cgroups, does not
//! enforce `RLIMIT_AS`, and counts `RLIMIT_NPROC` over all of the user's processes), and
//! the profile language is undocumented and
//! deprecated by Apple. This module's profile text is unit-tested on every platform; the run
//! path has not been exercised on macOS in this repository's CI.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::native::SOCKET_NAME;
use super::native::{
    self, DEFAULT_INTERPRETER, GUEST_ENV, INTERPRETER_FLAGS, NativeRun, NativeSandbox,
    SandboxCommand,
};
use super::rlimits::{MAX_OPEN_FILES, Rlimits};
use crate::Limits;
use crate::backend::{Availability, Backend, Job, RunFuture, Unavailable};
use crate::broker::ToolGate;

/// Where `sandbox-exec` is; never looked up on `PATH`.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// The shell that applies rlimits before `sandbox-exec` (macOS has no `prlimit`).
pub const SH: &str = "/bin/sh";

/// Secret directories and files under the home directory that the guest may not read.
pub const DEFAULT_SECRET_PATHS: &[&str] = &[
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker",
    ".gnupg",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".config/gh",
    ".git-credentials",
    "Library/Keychains",
    "Library/Cookies",
];

/// What the profile allows and denies, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatbeltPolicy {
    /// Paths (directories or files) whose contents may not be read.
    pub deny_read: Vec<PathBuf>,
}

impl SeatbeltPolicy {
    /// The default deny-list under `home`: [`DEFAULT_SECRET_PATHS`].
    pub fn for_home(home: &Path) -> SeatbeltPolicy {
        SeatbeltPolicy {
            deny_read: DEFAULT_SECRET_PATHS.iter().map(|p| home.join(p)).collect(),
        }
    }

    /// Adds a path to the deny-list.
    pub fn deny_read(mut self, path: impl Into<PathBuf>) -> Self {
        self.deny_read.push(path.into());
        self
    }
}

/// A string literal of the profile language (quotes and backslashes escaped).
fn literal(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `sandbox-exec` profile for one run whose private directory is `run_dir`. Pure.
///
/// Later rules take precedence over earlier ones, so each allowance follows the denial it
/// narrows.
pub fn render_profile(policy: &SeatbeltPolicy, run_dir: &Path) -> String {
    let run = literal(run_dir);
    let socket = literal(&run_dir.join(SOCKET_NAME));
    let mut p = String::new();
    p.push_str("(version 1)\n");
    p.push_str("(allow default)\n");
    p.push_str("; No network, except the run's broker socket.\n");
    p.push_str("(deny network*)\n");
    p.push_str(&format!(
        "(allow network-outbound (remote unix-socket (path-literal {socket})))\n"
    ));
    p.push_str("; No writes outside the run's directory.\n");
    p.push_str("(deny file-write*)\n");
    p.push_str(&format!(
        "(allow file-write* (subpath {run}) (literal \"/dev/null\"))\n"
    ));
    p.push_str("; No reads of secrets.\n");
    for path in &policy.deny_read {
        let lit = literal(path);
        p.push_str(&format!(
            "(deny file-read* (subpath {lit}) (literal {lit}))\n"
        ));
    }
    p.push_str("; No other processes' secrets.\n");
    p.push_str("(deny process-info* (target others))\n");
    p.push_str("(deny mach-priv-task-port)\n");
    p
}

/// The shell script that applies rlimits before the sandbox starts (`ulimit`, as macOS has
/// no `prlimit`). Pure.
///
/// There is no process cap: `RLIMIT_NPROC` counts every process of the user (hundreds on a
/// desktop), so no fixed value both fits and contains a fork bomb; the wall clock ends one.
pub fn render_ulimits(limits: &Limits) -> String {
    let r = Rlimits::for_limits(limits, None);
    // `ulimit -f` counts 512-byte blocks.
    format!(
        "ulimit -t {} -n {MAX_OPEN_FILES} -f {} -c 0 && exec \"$@\"",
        r.cpu_seconds,
        r.file_size.div_ceil(512)
    )
}

/// The Seatbelt backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SeatbeltBackend {
    interpreter: PathBuf,
    policy: Arc<SeatbeltPolicy>,
}

impl Default for SeatbeltBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl SeatbeltBackend {
    /// The backend with the system's Python and the default deny-list under `$HOME`.
    pub fn new() -> Self {
        let home =
            std::env::var_os("HOME").map_or_else(|| PathBuf::from("/var/empty"), PathBuf::from);
        Self::with_policy(SeatbeltPolicy::for_home(&home))
    }

    /// The backend with another policy.
    pub fn with_policy(policy: SeatbeltPolicy) -> Self {
        SeatbeltBackend {
            interpreter: DEFAULT_INTERPRETER.into(),
            policy: Arc::new(policy),
        }
    }

    /// The whole command line of one run: the `ulimit` shell, `sandbox-exec` with the
    /// profile, the interpreter on the guest script. Pure.
    pub fn render(&self, limits: &Limits, run_dir: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            SH.into(),
            "-c".into(),
            render_ulimits(limits).into(),
            "pycage-seatbelt".into(),
            SANDBOX_EXEC.into(),
            "-p".into(),
            render_profile(&self.policy, run_dir).into(),
            self.interpreter.as_os_str().to_owned(),
        ];
        argv.extend(INTERPRETER_FLAGS.iter().map(OsString::from));
        argv.push(run_dir.join("pycage_socket.py").into_os_string());
        argv
    }
}

impl NativeSandbox for SeatbeltBackend {
    fn name(&self) -> &'static str {
        "seatbelt"
    }

    fn preflight(&self) -> Result<(), Unavailable> {
        Backend::availability(self).into_result()
    }

    fn guest_dir(&self, host_dir: &Path) -> PathBuf {
        host_dir.to_owned()
    }

    fn command(&self, run: &NativeRun<'_>) -> Result<SandboxCommand, String> {
        // Profiles match resolved paths (`/var` is `/private/var` on macOS).
        let run_dir = std::fs::canonicalize(run.host_dir)
            .map_err(|e| format!("resolving the run directory: {e}"))?;
        let work = run_dir.join("work");
        std::fs::create_dir(&work).map_err(|e| format!("creating the working directory: {e}"))?;
        let mut env: Vec<(String, String)> = GUEST_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let work_text = work.to_string_lossy().into_owned();
        env.push(("HOME".into(), work_text.clone()));
        env.push(("TMPDIR".into(), work_text));
        Ok(SandboxCommand {
            argv: self.render(run.limits, &run_dir),
            env,
            cwd: work,
            container: None,
        })
    }

    fn uses_cgroup(&self) -> bool {
        false
    }
}

impl Backend for SeatbeltBackend {
    fn name(&self) -> &'static str {
        "seatbelt"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        if !cfg!(target_os = "macos") {
            return Availability::Unavailable(Unavailable::wrong_os(
                "wrong OS: Seatbelt needs macOS",
            ));
        }
        if !Path::new(SANDBOX_EXEC).is_file() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "binary missing: {SANDBOX_EXEC}"
            )));
        }
        if !self.interpreter.exists() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "interpreter missing: {}",
                self.interpreter.display()
            )));
        }
        Availability::Available
    }

    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(native::run(self, job, gate))
    }
}

#[cfg(test)]
#[path = "seatbelt_tests.rs"]
mod tests;

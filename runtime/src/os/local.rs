//! The local backend: a plain subprocess. **No isolation.**
//!
//! # Security
//!
//! The guest runs as the host user with the host's files, network and processes. What it
//! gets is hygiene, not protection: a cleared environment (no secrets from the host's
//! environment), a private temporary working directory, rlimits (CPU seconds, address space,
//! processes, file size, open files) and, where the host allows, a cgroup capping the tree's
//! processes and memory; the wall clock kills its process group and cgroup. Its
//! [`provides_isolation`](Backend::provides_isolation) is false, so the
//! [`Runner`](crate::Runner) refuses it unless
//! [`allow_no_isolation`](crate::RunnerBuilder::allow_no_isolation) is set. Use it only for
//! code you would run yourself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bubblewrap::process_allowance;
use super::native::{
    self, DEFAULT_INTERPRETER, GUEST_ENV, INTERPRETER_FLAGS, NativeRun, NativeSandbox,
    SandboxCommand,
};
use super::rlimits::{PRLIMIT, Rlimits};
use crate::Limits;
use crate::backend::{Availability, Backend, Job, RunFuture, Unavailable};
use crate::broker::ToolGate;

/// The name of the private working directory inside the run directory.
pub const WORK_DIR: &str = "work";

/// The local backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    interpreter: PathBuf,
}

impl Default for LocalBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalBackend {
    /// The backend with the system's Python ([`DEFAULT_INTERPRETER`]).
    pub fn new() -> Self {
        Self::with_interpreter(DEFAULT_INTERPRETER)
    }

    /// The backend with another interpreter (an absolute path).
    pub fn with_interpreter(interpreter: impl Into<PathBuf>) -> Self {
        LocalBackend {
            interpreter: interpreter.into(),
        }
    }

    /// The command line of one run: `prlimit` with the run's rlimits, then the interpreter on
    /// the guest script in `run_dir`. Pure.
    pub fn render(&self, limits: &Limits, run_dir: &Path, processes: Option<u64>) -> Vec<OsString> {
        let mut program = vec![self.interpreter.as_os_str().to_owned()];
        program.extend(INTERPRETER_FLAGS.iter().map(OsString::from));
        program.push(run_dir.join("pycage_socket.py").into_os_string());
        Rlimits::for_limits(limits, processes).wrap(program)
    }

    /// The environment of one run: fixed variables, `HOME` and `TMPDIR` in the private
    /// working directory. Pure.
    pub fn environment(run_dir: &Path) -> Vec<(String, String)> {
        let work = run_dir.join(WORK_DIR).to_string_lossy().into_owned();
        let mut env: Vec<(String, String)> = GUEST_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.push(("HOME".into(), work.clone()));
        env.push(("TMPDIR".into(), work));
        env
    }
}

impl NativeSandbox for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn preflight(&self) -> Result<(), Unavailable> {
        Backend::availability(self).into_result()
    }

    fn guest_dir(&self, host_dir: &Path) -> PathBuf {
        host_dir.to_owned()
    }

    fn command(&self, run: &NativeRun<'_>) -> Result<SandboxCommand, String> {
        let work = run.host_dir.join(WORK_DIR);
        super::sys::create_private_dir(&work)
            .map_err(|e| format!("creating the working directory: {e}"))?;
        Ok(SandboxCommand {
            argv: self.render(run.limits, run.host_dir, Some(process_allowance())),
            env: Self::environment(run.host_dir),
            cwd: work,
            container: None,
        })
    }

    fn uses_cgroup(&self) -> bool {
        true
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn provides_isolation(&self) -> bool {
        false
    }

    fn availability(&self) -> Availability {
        if !cfg!(unix) {
            return Availability::Unavailable(Unavailable::wrong_os(
                "wrong OS: the local backend needs Unix",
            ));
        }
        if !Path::new(PRLIMIT).is_file() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "binary missing: {PRLIMIT}"
            )));
        }
        if !self.interpreter.is_absolute() || !self.interpreter.exists() {
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
mod tests {
    use super::*;

    #[test]
    fn it_says_it_does_not_isolate() {
        assert!(!LocalBackend::new().provides_isolation());
    }

    #[test]
    fn the_command_runs_the_guest_script_under_rlimits() {
        let argv: Vec<_> = LocalBackend::new()
            .render(&Limits::default(), Path::new("/tmp/pycage-x"), None)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(argv[0], PRLIMIT);
        assert!(argv.iter().any(|a| a.starts_with("--as=")));
        assert_eq!(
            &argv[argv.len() - 4..],
            [
                "/usr/bin/python3",
                "-I",
                "-B",
                "/tmp/pycage-x/pycage_socket.py"
            ]
        );
    }

    #[test]
    fn the_environment_holds_nothing_of_the_hosts() {
        let env = LocalBackend::environment(Path::new("/tmp/pycage-x"));
        let names: Vec<_> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "LC_ALL", "HOME", "TMPDIR"]);
        assert!(
            env.iter()
                .any(|(k, v)| k == "HOME" && v == "/tmp/pycage-x/work")
        );
    }
}

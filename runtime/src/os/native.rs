//! One run of a native CPython guest in an OS sandbox, shared by the bubblewrap, Docker,
//! Seatbelt and local backends: a private run directory with the guest's Python files and the
//! broker's socket, the sandbox's command line, the process tree's containment, and the one
//! classifier.

// Off Unix the run path below is compiled out; what it shares with the backends stays, for
// their renderers and tests.
#![cfg_attr(not(unix), allow(dead_code))]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::cgroup::{self, RunCgroup};
use super::container::Container;
use super::rlimits::MAX_PROCESSES;
use super::token::{Token, random_hex};
use crate::backend::Job;
use crate::{ErrorKind, RunError};

/// The broker socket's file name inside a run directory.
pub const SOCKET_NAME: &str = "broker.sock";

/// Where the run directory appears inside a sandbox that mounts it.
pub const GUEST_MOUNT: &str = "/run/pycage";

/// The default native interpreter: the system's Python 3, at its absolute path.
pub const DEFAULT_INTERPRETER: &str = "/usr/bin/python3";

/// The interpreter's flags: isolated mode (no environment variables, no user site, no
/// script directory on the path) and no bytecode files.
pub const INTERPRETER_FLAGS: &[&str] = &["-I", "-B"];

/// The guest's whole environment (plus `HOME`, set per sandbox).
pub const GUEST_ENV: &[(&str, &str)] = &[("PATH", "/usr/bin:/bin"), ("LC_ALL", "C.UTF-8")];

/// What one run looks like to the sandbox that renders its command.
#[derive(Debug)]
pub(crate) struct NativeRun<'a> {
    pub limits: &'a crate::Limits,
    /// The run directory's host path.
    pub host_dir: &'a Path,
    /// A short, non-secret tag for names (container, cgroup).
    pub tag: &'a str,
    /// True for a session's guest: one process serving run after run (its CPU-time rlimit
    /// is the session's, not one run's).
    pub session: bool,
    /// The size of the working directory the sandbox makes at
    /// [`GUEST_DIR`](crate::files::GUEST_DIR), for a sandbox that
    /// [takes files](NativeSandbox::takes_files).
    pub work_bytes: Option<u64>,
}

/// A sandbox's command for one run.
#[derive(Debug)]
pub(crate) struct SandboxCommand {
    pub argv: Vec<OsString>,
    /// The environment of the command itself (the sandbox sets the guest's).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The run's container, for Docker.
    pub container: Option<Container>,
}

/// What a sandbox contributes to a native run.
// Off Unix only `name` and `preflight` are called: runs fail before a command is built.
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) trait NativeSandbox: Send + Sync {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// The cheap local checks of `availability` (binaries and interpreter present, right OS),
    /// made before every run: a sandbox that cannot start fails as `backend_error`, not as a
    /// guest that exited.
    fn preflight(&self) -> Result<(), crate::Unavailable>;
    /// Where the run directory is, as the guest sees it.
    fn guest_dir(&self, host_dir: &Path) -> PathBuf;
    /// The command line for one run.
    fn command(&self, run: &NativeRun<'_>) -> Result<SandboxCommand, String>;
    /// True when the run's processes go into a cgroup (when the host has them).
    fn uses_cgroup(&self) -> bool;
    /// True when a run (one-shot, or a session's) gets a working directory with input files,
    /// whose produced files come back (see the [`workdir`](super::workdir) module).
    fn takes_files(&self) -> bool {
        false
    }
}

/// The refusal of a fuel budget by a backend that cannot meter it.
pub(crate) fn fuel_refused(backend: &str) -> RunError {
    RunError::new(
        ErrorKind::InvalidInput,
        format!(
            "a fuel budget is a wasm-only limit; the `{backend}` backend cannot meter fuel (use the wall-clock limit)"
        ),
    )
}

/// The refusal of input files by a backend that does not place them yet.
pub(crate) fn files_refused(backend: &str) -> RunError {
    RunError::new(
        ErrorKind::InvalidInput,
        format!(
            "the `{backend}` backend does not take input files yet (the `wasm`, `wasm+bubblewrap` and `bubblewrap` backends do)"
        ),
    )
}

/// A run's name tag. Names (container, cgroup) are visible to other users: the tag is random
/// and its own, never the token.
pub(crate) fn run_tag() -> Result<String, RunError> {
    random_hex(4)
        .map(|r| format!("{r}-{}", std::process::id()))
        .map_err(|e| backend_failure("no randomness for the run's name", e))
}

/// The run's cgroup, capped at [`MAX_PROCESSES`] and `memory_bytes`, where the host delegates
/// cgroups to us; `None` where it does not (the rlimits still apply).
pub(crate) fn run_cgroup(tag: &str, memory_bytes: u64) -> Result<Option<RunCgroup>, RunError> {
    let Ok(support) = cgroup::support() else {
        return Ok(None);
    };
    RunCgroup::create(support, &format!("run-{tag}"), MAX_PROCESSES, memory_bytes)
        .map(Some)
        .map_err(|e| backend_failure("the run's cgroup could not be created", e))
}

/// A backend failure with a fixed message; the detail goes to the log only (it may hold host
/// paths).
pub(crate) fn backend_failure(message: &str, detail: impl std::fmt::Display) -> RunError {
    tracing::error!(detail = %detail, "pycage: {message}");
    RunError::new(ErrorKind::BackendError, message)
}

/// The request the guest's runner reads (as in the WIT contract).
pub(crate) fn request_json(job: &Job) -> String {
    request_value(job).to_string()
}

/// The request of a run in a session: the runner keeps the code's globals across runs.
pub(crate) fn session_request_json(job: &Job) -> String {
    let mut request = request_value(job);
    request["session"] = true.into();
    request.to_string()
}

fn request_value(job: &Job) -> Value {
    json!({
        "vars": Value::Object(job.vars.clone()),
        "tools": crate::policy::wire_bindings(&job.tools),
        "max_value_bytes": job.limits.max_value_bytes(),
    })
}

/// What a session's guest reads on stdin: one JSON header line (`socket`, `token`,
/// `session`: true, `max_args_bytes`) and nothing else; its runs come as answers to its
/// `next` requests (see [`SessionJob`](super::protocol::SessionJob)).
/// With `workdir_socket`, the guest hands its working directory over on that socket first
/// (as a one-shot run's does, see [`guest_stdin`]).
pub(crate) fn session_stdin(
    socket: &str,
    workdir_socket: Option<&str>,
    token: &Token,
    limits: &crate::Limits,
) -> Vec<u8> {
    let mut header = json!({
        "socket": socket,
        "token": token.as_str(),
        "session": true,
        "max_args_bytes": limits.max_tool_args_bytes(),
    });
    if let Some(workdir_socket) = workdir_socket {
        header["workdir_socket"] = workdir_socket.into();
        header["workdir"] = crate::files::GUEST_DIR.into();
    }
    let mut stdin = header.to_string().into_bytes();
    stdin.push(b'\n');
    stdin
}

/// What the guest reads on stdin, for every transport: one JSON header line (`socket`: where
/// the broker listens, as the guest names it: a Unix socket's path or a Windows pipe's name;
/// `token`; `request_json`; `max_args_bytes`), then the code. With `workdir_socket`, the
/// guest's bootstrap hands its working directory over on that socket (as the guest names it)
/// before the code runs.
pub(crate) fn guest_stdin(
    socket: &str,
    workdir_socket: Option<&str>,
    token: &Token,
    job: &Job,
) -> Vec<u8> {
    let mut header = json!({
        "socket": socket,
        "token": token.as_str(),
        "request_json": request_json(job),
        "max_args_bytes": job.limits.max_tool_args_bytes(),
    });
    if let Some(workdir_socket) = workdir_socket {
        header["workdir_socket"] = workdir_socket.into();
        header["workdir"] = crate::files::GUEST_DIR.into();
    }
    let mut stdin = header.to_string().into_bytes();
    stdin.push(b'\n');
    stdin.extend_from_slice(job.code.as_bytes());
    stdin
}

/// Runs a job's native guest in `sandbox`: off Unix, a `backend_error` saying why (these
/// sandboxes reach the broker over a Unix socket).
#[cfg(not(unix))]
pub(crate) async fn run(
    sandbox: &dyn NativeSandbox,
    _job: Job,
    _gate: std::sync::Arc<dyn crate::broker::ToolGate>,
) -> crate::RunResult {
    let why = sandbox.preflight().err().map_or_else(
        || "its broker transport needs a Unix host".to_owned(),
        |u| u.to_string(),
    );
    crate::RunResult::failed(
        sandbox.name(),
        RunError::new(
            ErrorKind::BackendError,
            format!("the `{}` backend cannot run here: {why}", sandbox.name()),
        ),
        std::time::Duration::ZERO,
    )
}

#[cfg(unix)]
pub(crate) use unix::{run, run_sandbox};

#[cfg(unix)]
mod unix {
    use std::sync::Arc;
    use std::time::{Instant, SystemTime};

    use super::super::cgroup::{self, RunCgroup};
    use super::super::classify::{self, Evidence, Exit, Reporter};
    use super::super::container;
    use super::super::guest_files;
    use super::super::protocol::Outcome;
    use super::super::run_dir::RunDir;
    use super::super::server::SocketServer;
    use super::super::spawn::{self, Containment, Ended, SpawnSpec};
    use super::super::workdir::{self, WORKDIR_SOCKET, WorkdirListener};
    use super::{
        NativeRun, NativeSandbox, SOCKET_NAME, backend_failure, files_refused, fuel_refused,
        guest_stdin, run_cgroup, run_tag,
    };
    use crate::RunResult;
    use crate::backend::Job;
    use crate::broker::ToolGate;
    use crate::capture::Captured;
    use crate::files::{self, Scratch};

    /// Runs a job's native guest in `sandbox`.
    pub(crate) async fn run(
        sandbox: &dyn NativeSandbox,
        job: Job,
        gate: Arc<dyn ToolGate>,
    ) -> RunResult {
        let started = Instant::now();
        let started_at = SystemTime::now();
        let name = sandbox.name();
        let fail = |error| RunResult::failed(name, error, started.elapsed());
        if job.limits.fuel().is_some() {
            return fail(fuel_refused(name));
        }
        let takes_files = sandbox.takes_files();
        if !job.files.is_empty() && !takes_files {
            return fail(files_refused(name));
        }
        if takes_files && let Err(e) = files::check_inputs(&job.files, &job.limits) {
            return fail(e);
        }
        if let Err(why) = sandbox.preflight() {
            return fail(backend_failure("the sandbox cannot run here", why));
        }
        let limits = job.limits.clone();
        let dir = match RunDir::create() {
            Ok(dir) => dir,
            Err(e) => return fail(backend_failure("the run directory could not be created", e)),
        };
        for (file, text) in guest_files::ALL {
            if let Err(e) = dir.write_file(file, text.as_bytes()) {
                return fail(backend_failure("the guest's files could not be written", e));
            }
        }
        let host_dir = dir.path().to_owned();
        let guest_socket = sandbox.guest_dir(&host_dir).join(SOCKET_NAME);
        let Some(guest_socket) = guest_socket.to_str().map(str::to_owned) else {
            return fail(backend_failure(
                "the run directory's path is not text",
                host_dir.display(),
            ));
        };
        let workdir = if takes_files {
            match WorkdirListener::bind(&host_dir) {
                Ok(listener) => Some(listener),
                Err(e) => {
                    return fail(backend_failure(
                        "the working directory's socket could not be opened",
                        e,
                    ));
                }
            }
        } else {
            None
        };
        let server = match SocketServer::start(dir, gate, &limits) {
            Ok(server) => server,
            Err(e) => {
                return fail(backend_failure(
                    "the broker's socket could not be opened",
                    e,
                ));
            }
        };
        let tag = match run_tag() {
            Ok(tag) => tag,
            Err(e) => return fail(e),
        };
        let cgroup = if sandbox.uses_cgroup() {
            match run_cgroup(&tag, limits.memory_bytes()) {
                Ok(cg) => cg,
                Err(e) => return fail(e),
            }
        } else {
            None
        };
        let run = NativeRun {
            limits: &limits,
            host_dir: &host_dir,
            tag: &tag,
            session: false,
            work_bytes: takes_files.then(|| workdir::work_bytes(&job.files, &limits)),
        };
        let command = match sandbox.command(&run) {
            Ok(c) => c,
            Err(e) => {
                return fail(backend_failure(
                    "the sandbox's command could not be built",
                    e,
                ));
            }
        };
        let argv = match &cgroup {
            Some(cg) => cgroup::wrap(cg.procs_files(), command.argv),
            None => command.argv,
        };
        let guest_workdir = workdir.as_ref().map(|_| {
            let path = sandbox.guest_dir(&host_dir).join(WORKDIR_SOCKET);
            path.to_string_lossy().into_owned()
        });
        let stdin = guest_stdin(
            &guest_socket,
            guest_workdir.as_deref(),
            server.token(),
            &job,
        );
        // The working directory arrives while the sandbox runs, before the code does.
        let scratch = workdir.map(|listener| {
            let files = job.files.clone();
            tokio::spawn(listener.receive(files, limits.clone()))
        });
        let spec = SpawnSpec {
            argv,
            env: command.env,
            cwd: command.cwd,
            stdin,
            output_cap: limits.max_output_bytes(),
            output_meter: job.output_meter.clone(),
            deadline: started + limits.wall_timeout(),
        };
        let finished =
            match run_sandbox(spec, cgroup, command.container.as_ref(), server, started_at).await {
                Ok(f) => f,
                Err(e) => return fail(backend_failure("the sandbox could not be started", e)),
            };
        // The process tree is gone: nothing changes the directory any more.
        // A guest that never handed its directory over never ran the code either (its
        // bootstrap exits first, which the classifier reports): there are no files then.
        let scratch = match scratch {
            Some(task) => take_scratch(task)
                .await
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "pycage: no working directory from the guest");
                })
                .ok(),
            None => None,
        };
        let mut stderr = finished.stderr;
        let produced = scratch.map_or_else(Vec::new, |scratch| {
            let max_files = usize::try_from(limits.max_files()).unwrap_or(usize::MAX);
            let (produced, overflow) =
                scratch.produced_within(limits.max_returned_bytes(), max_files);
            if overflow {
                stderr.text.push_str(&workdir::overflow_notice(max_files));
            }
            produced
        });
        let value = classify::classify(
            finished.outcome,
            finished.exit,
            finished.evidence,
            Reporter::Guest,
            limits.max_value_bytes(),
        );
        RunResult::builder(name, value)
            .stdout(finished.stdout)
            .stderr(stderr)
            .files(produced)
            .duration(started.elapsed())
            .build()
    }

    /// The working directory the guest handed over. Its task has ended or never will: the
    /// sandbox has, so an unfinished task is aborted.
    async fn take_scratch(
        task: tokio::task::JoinHandle<std::io::Result<Scratch>>,
    ) -> std::io::Result<Scratch> {
        if !task.is_finished() {
            task.abort();
        }
        task.await.map_err(std::io::Error::other)?
    }

    /// What a sandboxed process tree left when it ended: the outcome its guest (or worker)
    /// reported, how it ended, the host's evidence, and its captured output.
    pub(crate) struct Finished {
        pub outcome: Option<Outcome>,
        pub exit: Exit,
        pub evidence: Evidence,
        pub stdout: Captured,
        pub stderr: Captured,
    }

    /// Runs `spec` to its end (nothing of it outlives this call), then collects what it left,
    /// for every native run and the layered backend's worker alike: the cgroup's OOM record
    /// (and, for a container killed by SIGKILL, whether Docker saw the memory cap), the
    /// outcome frame, the exit. The cgroup is removed and the server closed on the way.
    ///
    /// # Errors
    ///
    /// When the process could not be started.
    pub(crate) async fn run_sandbox(
        spec: SpawnSpec,
        cgroup: Option<RunCgroup>,
        container: Option<&container::Container>,
        server: SocketServer,
        started_at: SystemTime,
    ) -> std::io::Result<Finished> {
        let contain = Containment {
            cgroup: cgroup.as_ref(),
            container,
        };
        let spawned = spawn::run(spec, contain).await;
        let mut evidence = Evidence {
            oom_killed: cgroup.as_ref().is_some_and(RunCgroup::oom_killed),
            ..Evidence::default()
        };
        if let Some(cg) = cgroup {
            cg.finish().await;
        }
        let outcome = server.take_outcome();
        drop(server);
        let spawned = spawned?;
        let exit = match spawned.ended {
            Ended::TimedOut => Exit::TimedOut,
            Ended::Exited(status) => classify::exit_of(status, container.is_some()),
        };
        // A container killed by SIGKILL: the engine's memory cap, if Docker says so.
        if let (Some(container), Exit::Signal(9)) = (container, exit) {
            evidence.oom_killed |= container::oom_event(container, started_at).await;
        }
        Ok(Finished {
            outcome,
            exit,
            evidence,
            stdout: spawned.stdout,
            stderr: spawned.stderr,
        })
    }
}

#[cfg(test)]
#[path = "native_tests.rs"]
mod tests;

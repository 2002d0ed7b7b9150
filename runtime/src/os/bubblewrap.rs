//! The bubblewrap backend (Linux): native CPython in fresh namespaces.
//!
//! # Security
//!
//! Each run gets `bwrap --unshare-all` (user, mount, pid, network, ipc, uts and cgroup
//! namespaces) with `--disable-userns` (no nested user namespaces), an unprivileged uid and
//! gid inside (65534) and every capability dropped, `--die-with-parent` and `--new-session`.
//! The file system is empty except for read-only binds of the interpreter's system
//! directories (`/usr`, and `/bin`, `/lib`, ... as the host has them), a fresh `/tmp`
//! (tmpfs, capped at a quarter of the memory limit), a fresh `/proc`, a minimal `/dev`, and the run's
//! private directory (read-only) holding the guest's Python files and the broker's socket.
//! There is no network (only an unconfigured loopback in the new namespace) and the
//! environment is cleared. A host may opt out of the network part alone
//! ([`BubblewrapBackend::allow_network`], `--allow-network`): the sandbox then shares the
//! host's network namespace, loopback included.
//!
//! Limits: rlimits (CPU seconds, address space, processes, file size, open files) through
//! `prlimit`, and, where the host's cgroup file system is writable, a cgroup capping the
//! tree's processes and memory (see the [`cgroup`] module). The wall clock is enforced by
//! the host, which kills the whole tree (process group, pid namespace, cgroup).
//!
//! A session is one such sandbox for the session's whole life: the same command with the
//! session's limits (and a lifetime CPU-time backstop instead of one run's, see
//! [`Rlimits::for_session`]), its guest serving run after run over the same socket; each
//! run's deadline still kills the whole tree, and dropping the session does too. Threads
//! or processes the code leaves running go on between runs, inside the sandbox.
//!
//! Not protected: the host's kernel is shared (a kernel exploit escapes), and everything
//! under the bound system directories is readable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::cgroup;
use super::host_layout::HostLayout;
use super::native::{
    self, DEFAULT_INTERPRETER, GUEST_ENV, GUEST_MOUNT, INTERPRETER_FLAGS, NativeRun, NativeSandbox,
    SandboxCommand,
};
use super::rlimits::{self, MAX_PROCESSES, PRLIMIT, Rlimits};
use crate::Limits;
use crate::backend::{
    Availability, Backend, Job, RunFuture, SessionFuture, Unavailable, UnavailableKind,
};
use crate::broker::ToolGate;
use crate::files::GUEST_DIR;

/// Where bubblewrap is; never looked up on `PATH`.
pub const BWRAP: &str = "/usr/bin/bwrap";

/// The uid and gid the guest has inside its user namespace ("nobody").
pub const SANDBOX_ID: u32 = 65534;

/// What one bubblewrap sandbox exposes. Plain data; [`render_bwrap`] turns it into argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwrapSpec {
    /// The host's system directories, bound read-only (or recreated as links).
    pub layout: HostLayout,
    /// The run directory's host path, bound read-only at [`GUEST_MOUNT`].
    pub run_dir: Option<PathBuf>,
    /// Further read-only binds, `(host path, sandbox path)`.
    pub extra_ro_binds: Vec<(PathBuf, PathBuf)>,
    /// The size of the fresh `/tmp`.
    pub tmp_bytes: u64,
    /// The size of a fresh tmpfs at [`GUEST_DIR`], the guest's working directory (for a
    /// one-shot run's files, see the `workdir` module); `None` leaves the guest in `/tmp`.
    pub work_bytes: Option<u64>,
    /// The guest's environment.
    pub env: Vec<(String, String)>,
    /// The command run inside.
    pub program: Vec<OsString>,
    /// Share the host's network namespace (`--share-net`): the guest can reach whatever the
    /// host can, its loopback services included. Off unless a host asks for it.
    pub share_net: bool,
}

/// The bubblewrap command line for `spec` (starting with [`BWRAP`]). Pure.
pub fn render_bwrap(spec: &BwrapSpec) -> Vec<OsString> {
    let mut argv: Vec<OsString> = [
        BWRAP,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--hostname",
        "pycage",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    if spec.share_net {
        argv.insert(2, "--share-net".into());
    }
    let id = SANDBOX_ID.to_string();
    argv.extend(["--uid".into(), id.clone().into(), "--gid".into(), id.into()]);
    for (k, v) in &spec.env {
        argv.extend(["--setenv".into(), k.into(), v.into()]);
    }
    argv.extend(spec.layout.bwrap_args());
    argv.extend([
        "--size".into(),
        spec.tmp_bytes.to_string().into(),
        "--tmpfs".into(),
        "/tmp".into(),
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
    ]);
    if let Some(run_dir) = &spec.run_dir {
        argv.extend([
            "--ro-bind".into(),
            run_dir.as_os_str().to_owned(),
            GUEST_MOUNT.into(),
        ]);
    }
    for (host, inside) in &spec.extra_ro_binds {
        argv.extend([
            "--ro-bind".into(),
            host.as_os_str().to_owned(),
            inside.as_os_str().to_owned(),
        ]);
    }
    // The working directory is a tmpfs made here, capped by the kernel, not a host
    // directory bound read-write (which nothing would cap): see the `workdir` module.
    let cwd = match spec.work_bytes {
        Some(bytes) => {
            argv.extend([
                "--size".into(),
                bytes.to_string().into(),
                "--tmpfs".into(),
                GUEST_DIR.into(),
            ]);
            GUEST_DIR
        }
        None => "/tmp",
    };
    argv.extend(["--chdir".into(), cwd.into(), "--".into()]);
    argv.extend(spec.program.iter().cloned());
    argv
}

/// The environment a native guest gets inside bubblewrap.
pub(crate) fn guest_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = GUEST_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.push(("HOME".into(), "/tmp".into()));
    env
}

/// The bubblewrap backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BubblewrapBackend {
    interpreter: PathBuf,
    layout: Arc<HostLayout>,
    network: bool,
}

impl Default for BubblewrapBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl BubblewrapBackend {
    /// The backend with the system's Python ([`DEFAULT_INTERPRETER`]).
    pub fn new() -> Self {
        Self::with_interpreter(DEFAULT_INTERPRETER)
    }

    /// The backend with another interpreter: an absolute path under the host's system
    /// directories (only those are bound into the sandbox).
    pub fn with_interpreter(interpreter: impl Into<PathBuf>) -> Self {
        BubblewrapBackend {
            interpreter: interpreter.into(),
            layout: Arc::new(HostLayout::probe()),
            network: false,
        }
    }

    /// With `allow`, every sandbox shares the host's network namespace: the code can open
    /// any connection the host can, to the host's own loopback services too. Off by default;
    /// the `net.fetch` tool is the way to reach a list of hosts.
    #[must_use]
    pub fn allow_network(mut self, allow: bool) -> Self {
        self.network = allow;
        self
    }

    /// The whole command line of one run: `prlimit` with the run's rlimits, then bubblewrap,
    /// then the interpreter. Pure.
    pub fn render(&self, limits: &Limits, run_dir: &Path, processes: Option<u64>) -> Vec<OsString> {
        self.render_with(
            Rlimits::for_limits(limits, processes),
            limits,
            run_dir,
            None,
        )
    }

    /// As [`render`](Self::render), with a working directory at [`GUEST_DIR`]: a tmpfs of
    /// `work_bytes`, and no file larger than `max_file_bytes` (`RLIMIT_FSIZE`, so a write
    /// past it is `EFBIG`; CPython ignores `SIGXFSZ`). Pure.
    pub fn render_with_workdir(
        &self,
        limits: &Limits,
        run_dir: &Path,
        processes: Option<u64>,
        work_bytes: u64,
    ) -> Vec<OsString> {
        let mut rlimits = Rlimits::for_limits(limits, processes);
        rlimits.file_size = rlimits.file_size.min(limits.max_file_bytes());
        self.render_with(rlimits, limits, run_dir, Some(work_bytes))
    }

    /// The command line of a session's guest: as [`render`](Self::render) with the session's
    /// limits, but the session's CPU-time budget (see [`Rlimits::for_session`]). Pure.
    pub fn render_session(
        &self,
        limits: &Limits,
        run_dir: &Path,
        processes: Option<u64>,
    ) -> Vec<OsString> {
        self.render_with(
            Rlimits::for_session(limits, processes),
            limits,
            run_dir,
            None,
        )
    }

    /// As [`render_session`](Self::render_session), with a working directory at
    /// [`GUEST_DIR`] for the whole session (as
    /// [`render_with_workdir`](Self::render_with_workdir)). Pure.
    pub fn render_session_with_workdir(
        &self,
        limits: &Limits,
        run_dir: &Path,
        processes: Option<u64>,
        work_bytes: u64,
    ) -> Vec<OsString> {
        let mut rlimits = Rlimits::for_session(limits, processes);
        rlimits.file_size = rlimits.file_size.min(limits.max_file_bytes());
        self.render_with(rlimits, limits, run_dir, Some(work_bytes))
    }

    fn render_with(
        &self,
        rlimits: Rlimits,
        limits: &Limits,
        run_dir: &Path,
        work_bytes: Option<u64>,
    ) -> Vec<OsString> {
        let mut program = vec![self.interpreter.as_os_str().to_owned()];
        program.extend(INTERPRETER_FLAGS.iter().map(OsString::from));
        program.push(
            Path::new(GUEST_MOUNT)
                .join("pycage_socket.py")
                .into_os_string(),
        );
        let spec = BwrapSpec {
            layout: (*self.layout).clone(),
            run_dir: Some(run_dir.to_owned()),
            extra_ro_binds: Vec::new(),
            tmp_bytes: rlimits::scratch_bytes(limits),
            work_bytes,
            env: guest_env(),
            program,
            share_net: self.network,
        };
        rlimits.wrap(render_bwrap(&spec))
    }

    /// How the run's process tree is contained here: cgroup caps, or rlimits alone.
    pub fn containment(&self) -> String {
        containment_note()
    }
}

/// How process trees are contained on this host (for `availability` notes and the CLI).
pub fn containment_note() -> String {
    match cgroup::support() {
        Ok(s) => format!("{}; rlimits per process", s.describe()),
        Err(why) => format!(
            "rlimits only ({why}): RLIMIT_NPROC does not bind root, so a fork bomb run by root is bounded by the pid namespace and the wall clock"
        ),
    }
}

impl NativeSandbox for BubblewrapBackend {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    fn preflight(&self) -> Result<(), Unavailable> {
        check_binaries(&self.interpreter, &self.layout)
    }

    fn guest_dir(&self, _host_dir: &Path) -> PathBuf {
        PathBuf::from(GUEST_MOUNT)
    }

    fn command(&self, run: &NativeRun<'_>) -> Result<SandboxCommand, String> {
        let processes = Some(process_allowance());
        let argv = match (run.session, run.work_bytes) {
            (true, Some(bytes)) => {
                self.render_session_with_workdir(run.limits, run.host_dir, processes, bytes)
            }
            (true, None) => self.render_session(run.limits, run.host_dir, processes),
            (false, Some(bytes)) => {
                self.render_with_workdir(run.limits, run.host_dir, processes, bytes)
            }
            (false, None) => self.render(run.limits, run.host_dir, processes),
        };
        Ok(SandboxCommand {
            argv,
            env: Vec::new(),
            cwd: run.host_dir.to_owned(),
            container: None,
        })
    }

    fn uses_cgroup(&self) -> bool {
        true
    }

    fn takes_files(&self) -> bool {
        true
    }
}

/// `RLIMIT_NPROC` counts all of the user's processes: allow the run [`MAX_PROCESSES`] more
/// than the user has now.
pub(crate) fn process_allowance() -> u64 {
    rlimits::user_process_count(super::sys::uid()) + MAX_PROCESSES
}

impl Backend for BubblewrapBackend {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        if let Err(why) = check_binaries(&self.interpreter, &self.layout) {
            return Availability::Unavailable(why);
        }
        match probe_namespaces(&self.interpreter, &self.layout) {
            Ok(()) => Availability::Available,
            Err(why) => Availability::Unavailable(why),
        }
    }

    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(native::run(self, job, gate))
    }

    fn supports_sessions(&self) -> bool {
        true
    }

    /// One sandboxed guest process for the whole session, with a one-shot run's isolation
    /// and the session's limits, serving its runs one after another.
    fn open_session(&self, limits: &Limits) -> SessionFuture<'_> {
        let limits = limits.clone();
        Box::pin(async move { super::native_session::open(self, limits).await })
    }
}

/// The static checks: the right OS, the binaries, an interpreter inside the bound
/// directories.
pub(crate) fn check_binaries(interpreter: &Path, layout: &HostLayout) -> Result<(), Unavailable> {
    if !cfg!(target_os = "linux") {
        return Err(Unavailable::wrong_os("wrong OS: bubblewrap needs Linux"));
    }
    for binary in [BWRAP, PRLIMIT] {
        if !Path::new(binary).is_file() {
            return Err(Unavailable::missing(format!("binary missing: {binary}")));
        }
    }
    if !interpreter.is_absolute() || !interpreter.exists() {
        return Err(Unavailable::missing(format!(
            "interpreter missing: {}",
            interpreter.display()
        )));
    }
    if !layout.entries.iter().any(|(dir, e)| {
        *e != super::host_layout::SystemEntry::Missing && interpreter.starts_with(dir)
    }) {
        return Err(Unavailable::new(
            UnavailableKind::Misconfigured,
            format!(
                "the interpreter {} is outside the system directories the sandbox binds",
                interpreter.display()
            ),
        ));
    }
    Ok(())
}

/// Starts one empty sandbox (once per process) to see whether this host lets bubblewrap
/// create its namespaces.
pub(crate) fn probe_namespaces(interpreter: &Path, layout: &HostLayout) -> Result<(), Unavailable> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let spec = BwrapSpec {
                layout: layout.clone(),
                run_dir: None,
                extra_ro_binds: Vec::new(),
                tmp_bytes: 1 << 20,
                work_bytes: None,
                env: guest_env(),
                program: vec![
                    interpreter.as_os_str().to_owned(),
                    "-I".into(),
                    "-c".into(),
                    "pass".into(),
                ],
                share_net: false,
            };
            let argv = render_bwrap(&spec);
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("bubblewrap cannot start: {e}"))?;
            if out.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .last()
                .unwrap_or("no message")
                .trim()
                .to_owned();
            Err(format!("bubblewrap cannot create its sandbox here: {last}"))
        })
        .clone()
        .map_err(Unavailable::refused)
}

#[cfg(test)]
#[path = "bubblewrap_tests.rs"]
mod tests;

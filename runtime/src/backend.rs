//! The [`Backend`] trait: one way to run a guest.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::broker::ToolGate;
use crate::policy::Binding;
use crate::{ErrorKind, Limits, RunError, RunResult};

/// One run as a backend receives it: already validated by the [`Runner`](crate::Runner),
/// which builds it (`#[non_exhaustive]`: a run may gain inputs, such as files).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Job {
    /// The Python source.
    pub code: String,
    /// Initial global variables (names are identifiers, values are JSON).
    pub vars: Map<String, Value>,
    /// The run's limits.
    pub limits: Limits,
    /// The tools the guest should define (the broker decides what each call may do).
    pub tools: Vec<Binding>,
    /// The files the code gets in its working directory (checked against the limits).
    pub files: Vec<crate::InputFile>,
    /// Counts the run's output while it runs, where the backend sees it live.
    pub output_meter: Option<crate::OutputMeter>,
}

/// Whether a backend can run on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// It can run here.
    Available,
    /// It cannot run here, and why.
    Unavailable(Unavailable),
}

impl Availability {
    /// True when available.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available)
    }

    /// `Ok` when available, else why not.
    ///
    /// # Errors
    ///
    /// The [`Unavailable`] reason.
    pub fn into_result(self) -> Result<(), Unavailable> {
        match self {
            Availability::Available => Ok(()),
            Availability::Unavailable(why) => Err(why),
        }
    }
}

/// Why a backend cannot run on this host: a kind a program can act on, and a sentence for a
/// person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    kind: UnavailableKind,
    reason: String,
}

/// The kinds of reason a backend cannot run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnavailableKind {
    /// It belongs on another operating system.
    WrongOs,
    /// Something it needs is not there: a binary, the interpreter, an image.
    Missing,
    /// The host refuses what it needs: namespaces, the daemon, an engine.
    Refused,
    /// It was set up wrong (a relative path where an absolute one is needed, ...).
    Misconfigured,
}

impl UnavailableKind {
    /// The kind's snake_case name (`wrong_os`), as `pycage backends --json` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            UnavailableKind::WrongOs => "wrong_os",
            UnavailableKind::Missing => "missing",
            UnavailableKind::Refused => "refused",
            UnavailableKind::Misconfigured => "misconfigured",
        }
    }
}

impl Unavailable {
    /// A reason of `kind`.
    pub fn new(kind: UnavailableKind, reason: impl Into<String>) -> Self {
        Unavailable {
            kind,
            reason: reason.into(),
        }
    }

    /// It belongs on another operating system.
    pub fn wrong_os(reason: impl Into<String>) -> Self {
        Self::new(UnavailableKind::WrongOs, reason)
    }

    /// Something it needs is not there.
    pub fn missing(reason: impl Into<String>) -> Self {
        Self::new(UnavailableKind::Missing, reason)
    }

    /// The host refuses what it needs.
    pub fn refused(reason: impl Into<String>) -> Self {
        Self::new(UnavailableKind::Refused, reason)
    }

    /// The kind of reason.
    pub fn kind(&self) -> UnavailableKind {
        self.kind
    }

    /// The sentence (`wrong OS: bubblewrap needs Linux`).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unavailable {}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Availability::Available => f.write_str("available"),
            Availability::Unavailable(why) => write!(f, "unavailable: {why}"),
        }
    }
}

/// The future a backend's run returns.
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = RunResult> + Send + 'a>>;

/// The future [`Backend::open_session`] returns: the session's guest, or why there is none.
pub type SessionFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Box<dyn BackendSession>, RunError>> + Send + 'a>>;

/// The result a session's backend gives when its previous run was cancelled mid-call (its
/// future dropped): the guest was unwound or killed there, so the session ends now.
pub(crate) fn cancelled_run_ended(backend: &str, took: std::time::Duration) -> RunResult {
    let error = RunError::new(
        ErrorKind::SessionEnded,
        "the session's previous run was cancelled before it finished",
    );
    RunResult::builder(backend, Err(error))
        .session_ended(true)
        .duration(took)
        .build()
}

/// How long a session's code has to stop after the interrupt its run's deadline sent
/// (`KeyboardInterrupt`, as Ctrl-C in a notebook), before its guest is killed or trapped and
/// the session ends with it.
pub(crate) const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The error of a session run that passed its deadline, was interrupted, and stopped: a
/// timeout, with the guest's traceback and exception where the interrupt ended the code
/// (`guest`, the failure the guest reported, if it reported one).
pub(crate) fn interrupted(guest: Option<RunError>) -> RunError {
    let message = "the wall-clock limit was reached: the code was interrupted, and the \
                   session keeps its state";
    match guest {
        Some(guest) => RunError {
            kind: ErrorKind::Timeout,
            message: message.to_owned(),
            ..guest
        },
        None => RunError::new(ErrorKind::Timeout, message),
    }
}

/// The error of a session run that passed its deadline and did not stop within
/// [`INTERRUPT_GRACE`] of its interrupt: its guest is gone, and the session with it.
pub(crate) fn interrupt_ignored() -> RunError {
    RunError::new(
        ErrorKind::Timeout,
        format!(
            "the wall-clock limit was reached, and the code did not stop within {} ms of the \
             KeyboardInterrupt it was sent",
            INTERRUPT_GRACE.as_millis()
        ),
    )
}

/// One session's guest, kept alive by its backend between runs (see
/// [`Runner::session`](crate::Runner::session), which owns it).
///
/// A run whose result has [`RunResult::session_ended`] set was the guest's last: the backend
/// has dropped it, and every later run fails with `session_ended`. Nothing else ends it.
pub trait BackendSession: Send + 'static {
    /// Runs one job in the session's guest, its code in the globals earlier runs left. The
    /// job's memory limit and file budgets must be the session's (the guest and its scratch
    /// directory outlive the run).
    fn run(&mut self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_>;
}

/// One way to run a guest: wasm in-process, or an operating-system sandbox.
///
/// Every backend enforces the job's [`Limits`] on the host side, reaches host tools only
/// through the run's [`ToolGate`] (its [`Broker`](crate::Broker), or something standing in
/// front of it: a journal, a proxy; the result's `tool_calls` is the gate owner's to fill),
/// and reports the same [`RunResult`]. A backend never panics on
/// guest behaviour; its failures are `backend_error` results.
pub trait Backend: Send + Sync + 'static {
    /// The backend's name, as `--backend` takes it.
    fn name(&self) -> &'static str;

    /// True when the backend puts an isolation boundary between the guest and the host. The
    /// [`Runner`](crate::Runner) refuses a backend without one unless explicitly allowed.
    fn provides_isolation(&self) -> bool;

    /// Whether the backend can run here, and if not, why.
    fn availability(&self) -> Availability;

    /// Runs one job. `gate` is the only channel to host tools.
    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_>;

    /// The seed when the backend runs deterministically (same code, inputs and tool results
    /// give the same run), `None` otherwise. A resumed run must be re-executed by a backend
    /// with the seed it first ran with.
    fn deterministic_seed(&self) -> Option<u64> {
        None
    }

    /// The third-party packages baked into the backend's guest, one Markdown phrase each
    /// (``"`python-dateutil` 2.9.0 (import `dateutil`)"``), from a custom wasm guest's
    /// manifest; empty for the others, whose Python is the host's.
    fn packages(&self) -> Vec<String> {
        Vec::new()
    }

    /// True when the backend keeps sessions ([`open_session`](Self::open_session) can
    /// succeed).
    fn supports_sessions(&self) -> bool {
        false
    }

    /// Starts a guest for a session with `limits` (its memory and file budgets hold for the
    /// session's life). The default: an `unsupported` error.
    fn open_session(&self, limits: &Limits) -> SessionFuture<'_> {
        let _ = limits;
        let error = RunError::new(
            ErrorKind::Unsupported,
            format!("the {} backend does not keep sessions", self.name()),
        );
        Box::pin(async move { Err(error) })
    }
}

/// What [`backend_by_name`] needs beyond a name. The defaults: the process-wide
/// [`WasmBackend::shared`](crate::WasmBackend::shared) for `wasm`, and this process's own
/// executable as the layered backend's worker.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    wasm: Option<crate::WasmBackend>,
    worker: Option<std::path::PathBuf>,
    network: bool,
}

impl BackendOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The backend `wasm` names (a host keeps its own handle to it: its cache, its pool).
    pub fn wasm(mut self, backend: crate::WasmBackend) -> Self {
        self.wasm = Some(backend);
        self
    }

    /// The layered backend's worker: an absolute path to an executable that serves
    /// `<exe> worker --cache-dir DIR` with [`os::worker::serve`](crate::os) (the `pycage`
    /// CLI does).
    pub fn worker(mut self, executable: std::path::PathBuf) -> Self {
        self.worker = Some(executable);
        self
    }

    /// Give an OS backend's sandbox the network: bubblewrap shares the host's network
    /// namespace, docker joins the default bridge (see their `allow_network`). Off by
    /// default. `wasm` and `wasm+bubblewrap` have no network to give (their code reaches
    /// hosts through the `net.fetch` tool), nor do `seatbelt` and `windows` yet: asking
    /// for it there is [`BackendError::NoNetwork`]. `local` has the host's network anyway.
    pub fn allow_network(mut self, allow: bool) -> Self {
        self.network = allow;
        self
    }
}

/// A built-in backend, named as `--backend`, `pycage backends` and a server's `backend`
/// name it: the one list of names the CLI, the servers and the library share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum BackendKind {
    /// CPython compiled to WASI, in wasmtime in this process (the default).
    #[default]
    Wasm,
    /// The host's Python in a bubblewrap sandbox (Linux).
    Bubblewrap,
    /// The host's Python in a Docker container.
    Docker,
    /// The host's Python under a Seatbelt profile (macOS).
    Seatbelt,
    /// The host's Python in an AppContainer (Windows).
    Windows,
    /// The host's Python with no isolation at all.
    Local,
    /// The wasm backend in a worker process inside bubblewrap (Linux).
    #[serde(rename = "wasm+bubblewrap")]
    WasmBubblewrap,
}

impl BackendKind {
    /// Every backend, in the order `pycage backends` lists them.
    pub const ALL: [BackendKind; 7] = [
        BackendKind::Wasm,
        BackendKind::Bubblewrap,
        BackendKind::Docker,
        BackendKind::Seatbelt,
        BackendKind::Windows,
        BackendKind::Local,
        BackendKind::WasmBubblewrap,
    ];

    /// Its name (`wasm+bubblewrap`), as [`Backend::name`] gives it.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Wasm => "wasm",
            BackendKind::Bubblewrap => "bubblewrap",
            BackendKind::Docker => "docker",
            BackendKind::Seatbelt => "seatbelt",
            BackendKind::Windows => "windows",
            BackendKind::Local => "local",
            BackendKind::WasmBubblewrap => "wasm+bubblewrap",
        }
    }

    /// Whether its sandbox can be given the network
    /// ([`BackendOptions::allow_network`]): bubblewrap and docker, and `local`, which has
    /// the host's anyway.
    pub const fn can_have_network(self) -> bool {
        matches!(
            self,
            BackendKind::Bubblewrap | BackendKind::Docker | BackendKind::Local
        )
    }

    /// The backend, with `options`. A backend that cannot run on this host is still
    /// returned; its [`availability`](Backend::availability) says why not.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the network is asked of a backend that cannot give it, or the
    /// backend cannot even be constructed.
    pub fn backend(self, options: &BackendOptions) -> Result<Arc<dyn Backend>, BackendError> {
        use crate::os::{
            BubblewrapBackend, DockerBackend, LayeredBackend, LocalBackend, SeatbeltBackend,
            WindowsBackend,
        };
        if options.network && !self.can_have_network() {
            return Err(BackendError::NoNetwork(self));
        }
        Ok(match self {
            BackendKind::Wasm => Arc::new(match &options.wasm {
                Some(wasm) => wasm.clone(),
                None => crate::WasmBackend::shared().map_err(BackendError::Wasm)?,
            }),
            BackendKind::Bubblewrap => {
                Arc::new(BubblewrapBackend::new().allow_network(options.network))
            }
            BackendKind::Docker => Arc::new(DockerBackend::new().allow_network(options.network)),
            BackendKind::Seatbelt => Arc::new(SeatbeltBackend::new()),
            BackendKind::Windows => Arc::new(WindowsBackend::new()),
            BackendKind::Local => Arc::new(LocalBackend::new()),
            BackendKind::WasmBubblewrap => {
                let worker = match &options.worker {
                    Some(exe) => exe.clone(),
                    None => std::env::current_exe().map_err(|e| {
                        BackendError::Worker(format!("cannot find this executable: {e}"))
                    })?,
                };
                let cache = crate::wasm::default_cache_dir().ok_or_else(|| {
                    BackendError::Worker(
                        "needs the artifact cache (PYCAGE_CACHE_DIR is `off` or no cache \
                         directory is known)"
                            .into(),
                    )
                })?;
                Arc::new(LayeredBackend::new(worker, cache))
            }
        })
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = BackendError;

    /// The backend named `name`, exactly as [`name`](Self::name) gives it.
    fn from_str(name: &str) -> Result<Self, BackendError> {
        BackendKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| BackendError::Unknown(name.to_owned()))
    }
}

/// Why [`BackendKind::backend`] or [`backend_by_name`] could not give a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// No backend has that name; the error carries it.
    Unknown(String),
    /// The wasm engine could not be created (for `wasm`, or the layered backend's host side).
    Wasm(crate::WasmError),
    /// The layered backend has no worker executable or no artifact cache to give its worker.
    Worker(String),
    /// [`BackendOptions::allow_network`] asked for the network of a backend that cannot give
    /// its sandbox one.
    NoNetwork(BackendKind),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Unknown(name) => {
                let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
                write!(f, "unknown backend `{name}` (one of: {})", names.join(", "))
            }
            BackendError::Wasm(e) => write!(f, "wasm: {e}"),
            BackendError::Worker(why) => write!(f, "wasm+bubblewrap: {why}"),
            BackendError::NoNetwork(kind) => write!(
                f,
                "backend `{kind}` cannot give its sandbox the network (only bubblewrap and \
                 docker can); reach hosts through the net.fetch tool instead (--net-allow HOST)"
            ),
        }
    }
}

impl std::error::Error for BackendError {}

/// The backend called `name` ([`BackendKind`]'s names), with `options`: `name.parse()` then
/// [`BackendKind::backend`].
///
/// # Errors
///
/// [`BackendError`] for an unknown name, or as [`BackendKind::backend`].
pub fn backend_by_name(
    name: &str,
    options: &BackendOptions,
) -> Result<Arc<dyn Backend>, BackendError> {
    name.parse::<BackendKind>()?.backend(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_gives_the_backend_of_that_name() {
        let wasm = crate::WasmBackend::builder()
            .max_instances(1)
            .cache_dir(None)
            .build()
            .unwrap();
        let options = BackendOptions::new()
            .wasm(wasm)
            .worker("/usr/bin/pycage-worker".into());
        for kind in BackendKind::ALL {
            let backend = backend_by_name(kind.name(), &options).unwrap();
            assert_eq!(backend.name(), kind.name());
            assert_eq!(kind.name().parse::<BackendKind>().unwrap(), kind);
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::json!(kind.name()));
            assert_eq!(serde_json::from_value::<BackendKind>(json).unwrap(), kind);
        }
        let networked = options.clone().allow_network(true);
        let (open, closed): (Vec<_>, Vec<_>) = BackendKind::ALL
            .into_iter()
            .partition(|k| k.can_have_network());
        assert_eq!(
            open,
            [
                BackendKind::Bubblewrap,
                BackendKind::Docker,
                BackendKind::Local
            ]
        );
        for kind in open {
            assert_eq!(kind.backend(&networked).unwrap().name(), kind.name());
        }
        for kind in closed {
            let refused = kind.backend(&networked).err().unwrap();
            assert_eq!(refused, BackendError::NoNetwork(kind));
            assert!(refused.to_string().contains("net.fetch"), "{refused}");
        }
        let unknown = backend_by_name("wasm ", &options).err();
        assert_eq!(unknown, Some(BackendError::Unknown("wasm ".into())));
        assert!(
            unknown
                .unwrap()
                .to_string()
                .contains("one of: wasm, bubblewrap")
        );
    }
}

//! [`Runner`]: the public entry point. One runner serves many runs, concurrently.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pycage_tools::ToolRegistry;
use serde_json::{Map, Value};

use crate::backend::{Backend, Job};
use crate::broker::{Broker, Observers, ToolCallObserver};
use crate::journal::{
    CallJournal, Decision, Halt, Journal, JournalCall, JournalKey, OnDivergence, PendingCall,
    Suspended,
};
use crate::policy::{ExposedTools, PolicyError, ToolPolicy};
use crate::session::Session;
use crate::{ErrorKind, Limits, RunError, RunResult};

/// Runs untrusted Python behind a backend, with limits and a brokered set of tools.
///
/// Cheap to clone; clones share the backend (and its compiled guest).
///
/// ```no_run
/// # async fn demo() -> Result<(), pycage::BuildError> {
/// use pycage::{Runner, ToolPolicy};
/// let runner = Runner::builder()
///     .tools(pycage_tools::ToolRegistry::with_builtins())
///     .policy(ToolPolicy::new().namespace("math"))
///     .build()?;
/// let result = runner.run("return (await add(a=1, b=2))['sum']").await;
/// assert_eq!(result.value, serde_json::json!(3));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Runner {
    inner: Arc<RunnerInner>,
}

struct RunnerInner {
    backend: Arc<dyn Backend>,
    exposed: ExposedTools,
    limits: Limits,
    /// Told of every tool call of every run.
    observers: Observers,
    /// What the backend's guest environment is, probed once on first use (see
    /// [`Runner::description`]).
    environment: tokio::sync::OnceCell<Arc<crate::describe::Environment>>,
    /// Signs the journals and suspended states of its runs, and verifies those handed back.
    journal_key: JournalKey,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("backend", &self.inner.backend.name())
            .field("tools", &self.inner.exposed)
            .field("limits", &self.inner.limits)
            .finish()
    }
}

impl Runner {
    /// A builder with the defaults: the wasm backend, no tools exposed, default limits.
    pub fn builder() -> RunnerBuilder {
        RunnerBuilder::default()
    }

    /// The runner's default limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The backend this runner uses.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The tools each run exposes.
    pub fn exposed_tools(&self) -> &ExposedTools {
        &self.inner.exposed
    }

    /// This runner (the same backend, tools and limits) with `observer` also told of every
    /// tool call of its runs and sessions from now on: how a server counts the calls of a
    /// runner its host built. Runs and sessions of `self` are not observed by it.
    #[must_use]
    pub fn observed_by(&self, observer: Arc<dyn ToolCallObserver>) -> Runner {
        let inner = &self.inner;
        Runner {
            inner: Arc::new(RunnerInner {
                backend: inner.backend.clone(),
                exposed: inner.exposed.clone(),
                limits: inner.limits.clone(),
                observers: inner.observers.with(observer),
                environment: inner.environment.clone(),
                journal_key: inner.journal_key.clone(),
            }),
        }
    }

    /// Where [`Runner::description`] keeps the probed environment.
    pub(crate) fn environment_cell(
        &self,
    ) -> &tokio::sync::OnceCell<Arc<crate::describe::Environment>> {
        &self.inner.environment
    }

    /// Runs `code` in a fresh sandbox with the runner's limits and no initial variables.
    pub async fn run(&self, code: &str) -> RunResult {
        self.run_with(code, Map::new(), &self.inner.limits).await
    }

    /// Runs `code` with initial global variables `vars` and the given limits.
    ///
    /// Every run gets a fresh guest: nothing leaks from one run to the next. Problems with the
    /// request itself (code too large, bad variable names) come back as an `invalid_input`
    /// result, never as a panic.
    pub async fn run_with(
        &self,
        code: &str,
        vars: Map<String, Value>,
        limits: &Limits,
    ) -> RunResult {
        self.run_request(RunRequest::new(code).vars(vars).limits(limits.clone()))
            .await
    }

    /// Runs one request: code, initial variables, input files and limits (the runner's own
    /// when the request has none).
    ///
    /// The input files are placed in the run's scratch directory, the code's working
    /// directory; the files the code creates or changes there come back in
    /// [`RunResult::files`]. Problems with the request itself (code too large, bad variable
    /// names, a bad file name, files over their budgets) come back as an `invalid_input`
    /// result naming the problem, never as a panic.
    pub async fn run_request(&self, request: RunRequest) -> RunResult {
        let started = Instant::now();
        let backend = &self.inner.backend;
        // What a suspended state needs of the request, which the job consumes. Every
        // one-shot run keeps a journal: any tool may ask it to wait for a person.
        let asked = request.asks_journal();
        let kept = (
            request.code.clone(),
            request.vars.clone(),
            request.files.clone(),
            request.limits.clone(),
        );
        let (job, broker) = match self.job(request, None) {
            Ok(prepared) => prepared,
            Err(error) => return RunResult::failed(backend.name(), error, started.elapsed()),
        };
        let result = backend.run(job, broker.clone()).await;
        let result = finish(result, &broker, started);
        match broker.journal() {
            Some(journal) => self.with_journal(result, journal, asked, kept),
            None => result,
        }
    }

    /// Finishes a run suspended at a call that waited for a person: re-executes its code
    /// with its inputs, answers the calls before the pending one from its journal, gives
    /// the pending call `decision` (approved: the tool runs now; denied: the code gets a
    /// `ToolError` of kind `denied`; answered: the value is its result) and goes on live. The
    /// result is the run's as if it had never stopped (or suspended again, at a later call).
    ///
    /// The backend should be deterministic with the seed the run had (see
    /// [`WasmBackendBuilder::deterministic`](crate::WasmBackendBuilder::deterministic)), and
    /// the runner's tools and policy those it ran with: a call that then differs from the
    /// journal fails the resume with `replay_diverged`.
    ///
    /// A state whose signature does not verify with the runner's key, or made with another
    /// seed, is refused as `invalid_input`.
    pub async fn resume(&self, state: Suspended, decision: Decision) -> RunResult {
        self.resume_with(state, decision, Vec::new()).await
    }

    /// As [`resume`](Self::resume), with `replacements` serving calls in place of exposed
    /// tools as [`RunRequest::replace_tool`] does: the narrowed tools the run had (a server
    /// keeps them beside the state), so approving a call does not widen them. The run's
    /// limits are the state's ([`Suspended::limits`]).
    pub async fn resume_with(
        &self,
        state: Suspended,
        decision: Decision,
        replacements: Vec<Arc<dyn pycage_tools::Tool>>,
    ) -> RunResult {
        let started = Instant::now();
        let backend = &self.inner.backend;
        let refuse = |message: String| {
            RunResult::failed(
                backend.name(),
                RunError::new(ErrorKind::InvalidInput, message),
                started.elapsed(),
            )
        };
        if let Err(e) = state.verify(&self.inner.journal_key) {
            return refuse(format!("the suspended run is unusable: {e}"));
        }
        let seed = backend.deterministic_seed();
        if state.seed != seed {
            return refuse(format!(
                "the run was suspended {}, and this runner's backend runs {}: a resume \
                 re-executes the code as it ran",
                seed_text(state.seed),
                seed_text(seed)
            ));
        }
        let exposed = self.inner.exposed.qualified_names();
        if let Some(missing) = state.tools.iter().find(|t| !exposed.contains(&t.as_str())) {
            return refuse(format!(
                "the run exposed `{missing}`, which this runner does not: resume it with the \
                 tools and policy it ran with"
            ));
        }
        let Suspended {
            code,
            vars,
            files,
            calls,
            pending,
            approve,
            limits,
            ..
        } = state;
        let mut request = RunRequest::new(code).vars(vars).files(files);
        request.limits = limits;
        request.replacements.0 = replacements;
        request.resume = Some(Resume {
            calls,
            pending,
            decision,
            approve,
        });
        self.run_request(request).await
    }

    /// Completes a result with its suspended state or its divergence when the run stopped
    /// early, and with its signed journal when the request `asked` for one or it stopped.
    fn with_journal(
        &self,
        mut result: RunResult,
        journal: &CallJournal,
        asked: bool,
        (code, vars, files, limits): (
            String,
            Map<String, Value>,
            Vec<crate::InputFile>,
            Option<Limits>,
        ),
    ) -> RunResult {
        let key = &self.inner.journal_key;
        let seed = self.inner.backend.deterministic_seed();
        let halted = journal.halt();
        if let Some(halt) = &halted {
            let error = match halt {
                Halt::Suspended(pending) => RunError::new(
                    ErrorKind::Suspended,
                    format!(
                        "tool call {} waits for a person: {}",
                        pending.position, pending.reason
                    ),
                ),
                Halt::Diverged(message) => RunError::new(ErrorKind::ReplayDiverged, message),
            };
            result.ok = false;
            result.value = Value::Null;
            result.timed_out = false;
            result.error = Some(error);
        }
        if asked || halted.is_some() {
            result.journal = Some(journal.signed(key, &code, seed));
        }
        if let Some(Halt::Suspended(pending)) = halted {
            let state = Suspended {
                version: 0,
                id: String::new(),
                suspended_at: 0,
                code,
                vars,
                files,
                seed,
                calls: journal.calls(),
                pending,
                tools: self
                    .inner
                    .exposed
                    .qualified_names()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
                approve: self.approval_tools(journal),
                limits,
                mac: String::new(),
            };
            result.suspended = Some(Suspended::sign(key, state));
        }
        result
    }

    /// Opens a [`Session`] with the runner's limits: one guest kept alive, so variables,
    /// imports, functions, classes and files persist from one run to the next.
    ///
    /// # Errors
    ///
    /// `unsupported` when the backend keeps no sessions (see
    /// [`Backend::supports_sessions`]); `backend_error` when its guest cannot start.
    pub async fn session(&self) -> Result<Session, RunError> {
        self.session_with(self.inner.limits.clone()).await
    }

    /// Opens a [`Session`] whose memory limit and file budgets are `limits`' for its whole
    /// life; each run's other limits are its own (the runner's, or its request's).
    ///
    /// # Errors
    ///
    /// As for [`Runner::session`].
    pub async fn session_with(&self, limits: Limits) -> Result<Session, RunError> {
        let guest = self.inner.backend.open_session(&limits).await?;
        Ok(Session::new(self.clone(), limits, guest))
    }

    /// The job and the broker for `request`, checked; in a session, with the session's
    /// memory and file budgets.
    pub(crate) fn job(
        &self,
        request: RunRequest,
        session: Option<&Limits>,
    ) -> Result<(Job, Arc<Broker>), RunError> {
        // A session's guest outlives its runs, so a run in it cannot be re-executed from
        // its start: its calls that would wait for a person are refused instead.
        let journal = if session.is_some() {
            if request.asks_journal() {
                return Err(RunError::new(
                    ErrorKind::Unsupported,
                    "a session keeps no journal: record, replay and resume one-shot runs",
                ));
            }
            None
        } else {
            Some(self.call_journal(&request)?)
        };
        let RunRequest {
            code,
            vars,
            files,
            limits,
            output_meter,
            replacements,
            ..
        } = request;
        let mut exposed = self.inner.exposed.clone();
        for tool in replacements.0 {
            exposed = exposed.replaced(tool).map_err(|name| {
                RunError::new(
                    ErrorKind::InvalidInput,
                    format!("the run replaces the tool `{name}`, which is not exposed"),
                )
            })?;
        }
        let mut limits = limits.unwrap_or_else(|| self.inner.limits.clone());
        if let Some(session) = session {
            limits = limits.within_session(session);
        }
        validate(&code, &vars, &limits)?;
        crate::files::check_inputs(&files, &limits)?;
        let mut broker =
            Broker::new(next_run_id(), exposed, &limits).observed_by(self.inner.observers.clone());
        if let Some(journal) = journal {
            broker = broker.journaled(journal);
        }
        let broker = Arc::new(broker);
        let job = Job {
            code,
            vars,
            limits,
            tools: self.inner.exposed.bindings().to_vec(),
            files,
            output_meter,
        };
        Ok((job, broker))
    }

    /// The journal a request's run keeps: what it replays (verified with the runner's key)
    /// or resumes from.
    fn call_journal(&self, request: &RunRequest) -> Result<CallJournal, RunError> {
        if let Some(resume) = &request.resume {
            return Ok(CallJournal::new(
                resume.calls.clone(),
                Some((resume.pending.clone(), resume.decision.clone())),
                OnDivergence::Fail,
                resume.approve.clone(),
            ));
        }
        let replay = match &request.replay {
            Some(journal) => {
                journal.verify(&self.inner.journal_key).map_err(|e| {
                    RunError::new(
                        ErrorKind::InvalidInput,
                        format!("the journal to replay is unusable: {e}"),
                    )
                })?;
                journal.calls.clone()
            }
            None => Vec::new(),
        };
        Ok(CallJournal::new(
            replay,
            None,
            request.on_divergence,
            Vec::new(),
        ))
    }
}

impl Runner {
    /// The tools whose calls need approval in this run: the policy's, and a resumed run's.
    fn approval_tools(&self, journal: &CallJournal) -> Vec<String> {
        let mut tools: Vec<String> = self
            .inner
            .exposed
            .bindings()
            .iter()
            .filter(|b| b.needs_approval)
            .map(|b| b.qualified.clone())
            .collect();
        tools.extend(journal.extra_approvals());
        tools.sort();
        tools.dedup();
        tools
    }
}

fn seed_text(seed: Option<u64>) -> String {
    match seed {
        Some(seed) => format!("deterministically with seed {seed}"),
        None => "not deterministically".into(),
    }
}

/// Completes a backend's result with what the run's broker knows.
pub(crate) fn finish(mut result: RunResult, broker: &Broker, started: Instant) -> RunResult {
    broker.finish();
    result.tool_calls = broker.executed();
    // A ToolError the code let escape after the ceiling refused a call: the ceiling is
    // why the run failed. (A failure the code raised itself stays a guest exception.)
    if broker.ceiling_hit()
        && let Some(error) = &mut result.error
        && error.kind == ErrorKind::GuestException
        && error.exception.as_deref() == Some("ToolError")
    {
        error.kind = ErrorKind::ToolCallLimit;
    }
    result.duration = started.elapsed();
    result
}

/// What one run is asked to do: the code, and what it starts with.
///
/// ```no_run
/// # async fn demo(runner: pycage::Runner) {
/// use pycage::{InputFile, RunRequest};
/// let result = runner
///     .run_request(
///         RunRequest::new("import csv\nrows = list(csv.reader(open('data.csv')))\nopen('n.txt', 'w').write(str(len(rows)))")
///             .file(InputFile::new("data.csv", b"a,b\n1,2\n".to_vec())),
///     )
///     .await;
/// assert_eq!(result.files[0].path, "n.txt");
/// # }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct RunRequest {
    code: String,
    vars: Map<String, Value>,
    files: Vec<crate::InputFile>,
    limits: Option<Limits>,
    output_meter: Option<crate::OutputMeter>,
    record_journal: bool,
    replay: Option<Journal>,
    on_divergence: OnDivergence,
    resume: Option<Resume>,
    replacements: Replacements,
}

/// Tools that serve one run in place of the exposed tools of the same names.
#[derive(Clone, Default)]
struct Replacements(Vec<Arc<dyn pycage_tools::Tool>>);

impl fmt::Debug for Replacements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.0
                    .iter()
                    .map(|t| format!("{}.{}", t.namespace(), t.name())),
            )
            .finish()
    }
}

/// What a resumed run replays, and the decision for its pending call.
#[derive(Debug, Clone)]
struct Resume {
    calls: Vec<JournalCall>,
    pending: PendingCall,
    decision: Decision,
    approve: Vec<String>,
}

impl RunRequest {
    /// A request to run `code`, with no variables or files and the runner's limits.
    pub fn new(code: impl Into<String>) -> Self {
        RunRequest {
            code: code.into(),
            ..Self::default()
        }
    }

    /// The initial global variables (names must be identifiers).
    pub fn vars(mut self, vars: Map<String, Value>) -> Self {
        self.vars = vars;
        self
    }

    /// Counts the run's stdout and stderr bytes into `meter` while it runs (see
    /// [`OutputMeter`](crate::OutputMeter) for the backends that count live).
    pub fn output_meter(mut self, meter: crate::OutputMeter) -> Self {
        self.output_meter = Some(meter);
        self
    }

    /// Adds an input file.
    pub fn file(mut self, file: crate::InputFile) -> Self {
        self.files.push(file);
        self
    }

    /// Adds input files.
    pub fn files(mut self, files: impl IntoIterator<Item = crate::InputFile>) -> Self {
        self.files.extend(files);
        self
    }

    /// This run's limits, instead of the runner's.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Puts the run's signed tool-call journal in the result's
    /// [`journal`](RunResult::journal) (a replayed or resumed run's result has it anyway, and
    /// so has one that stopped early).
    pub fn record_journal(mut self) -> Self {
        self.record_journal = true;
        self
    }

    /// Answers the run's tool calls from `journal` while they match it, position by
    /// position, without calling the tools; the rest go live. The journal must verify with
    /// the runner's key (else the run is refused as `invalid_input`). A call that differs
    /// from the journal at its position is handled by [`on_divergence`](Self::on_divergence).
    pub fn replay(mut self, journal: Journal) -> Self {
        self.replay = Some(journal);
        self
    }

    /// What a replay does at a call that differs from its journal (default: the run fails
    /// with `replay_diverged`).
    pub fn on_divergence(mut self, on_divergence: OnDivergence) -> Self {
        self.on_divergence = on_divergence;
        self
    }

    /// For this run only, `tool` serves the calls of the exposed tool of the same qualified
    /// name: a narrower version of it (`net.fetch` to fewer hosts). The code sees the same
    /// function; the description is the runner's. A tool the runner does not expose is
    /// refused when the run starts (`invalid_input`), as a run cannot add a tool.
    pub fn replace_tool(mut self, tool: Arc<dyn pycage_tools::Tool>) -> Self {
        self.replacements.0.push(tool);
        self
    }

    /// True when the request asks for its run's journal in the result.
    fn asks_journal(&self) -> bool {
        self.record_journal || self.replay.is_some() || self.resume.is_some()
    }
}

fn next_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "run-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn validate(code: &str, vars: &Map<String, Value>, limits: &Limits) -> Result<(), RunError> {
    if code.len() as u64 > limits.max_code_bytes() {
        return Err(RunError::new(
            ErrorKind::InvalidInput,
            format!(
                "the code is {} bytes; the limit is {}",
                code.len(),
                limits.max_code_bytes()
            ),
        ));
    }
    for name in vars.keys() {
        if !is_identifier(name) {
            return Err(RunError::new(
                ErrorKind::InvalidInput,
                format!(
                    "variable name `{}` is not a Python identifier",
                    name.escape_debug()
                ),
            ));
        }
    }
    Ok(())
}

/// A Python identifier not starting with a double underscore (those names are the runtime's).
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c == '_' || c.is_alphabetic());
    first_ok && chars.all(|c| c == '_' || c.is_alphanumeric()) && !name.starts_with("__")
}

/// Why a [`Runner`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The tool policy does not fit the registry.
    Policy(PolicyError),
    /// The backend does not isolate and `allow_no_isolation` was not set.
    NoIsolation(&'static str),
    /// The default wasm backend could not be created.
    Backend(crate::wasm::WasmError),
    /// No journal key was given, and none could be made.
    JournalKey(crate::JournalError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Policy(e) => write!(f, "tool policy: {e}"),
            BuildError::NoIsolation(name) => write!(
                f,
                "backend `{name}` provides no isolation; refusing it without allow_no_isolation"
            ),
            BuildError::Backend(e) => write!(f, "backend: {e}"),
            BuildError::JournalKey(e) => write!(f, "journal key: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Builds a [`Runner`].
#[derive(Default)]
pub struct RunnerBuilder {
    backend: Option<Arc<dyn Backend>>,
    tools: ToolRegistry,
    policy: ToolPolicy,
    limits: Limits,
    allow_no_isolation: bool,
    observers: Observers,
    journal_key: Option<JournalKey>,
}

impl RunnerBuilder {
    /// Uses `backend` instead of the default wasm backend.
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The registry the policy picks tools from.
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// Which tools to expose. The default exposes none.
    pub fn policy(mut self, policy: ToolPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The limits of each run started with [`Runner::run`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Tells `observer` of every tool call of every run and session (in addition to the
    /// audit event each call emits on `pycage::audit`).
    pub fn observe_tool_calls(mut self, observer: Arc<dyn ToolCallObserver>) -> Self {
        self.observers = self.observers.with(observer);
        self
    }

    /// The key that signs the runs' journals and suspended states and verifies those handed
    /// back. The default is a random key of this runner alone; give runners (or processes)
    /// one key for a journal or a suspended run to pass between them (see
    /// [`JournalKey::load_or_create`]).
    pub fn journal_key(mut self, key: JournalKey) -> Self {
        self.journal_key = Some(key);
        self
    }

    /// Accepts a backend that provides no isolation (such as `local`).
    ///
    /// # Security
    ///
    /// With such a backend the guest runs with the host user's authority: files, network,
    /// processes. Only for code you would run yourself.
    pub fn allow_no_isolation(mut self, allow: bool) -> Self {
        self.allow_no_isolation = allow;
        self
    }

    /// Builds the runner.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when the policy does not resolve, the backend does not isolate and that
    /// was not allowed, or the default backend cannot be created.
    pub fn build(self) -> Result<Runner, BuildError> {
        let exposed = self
            .policy
            .resolve(&self.tools)
            .map_err(BuildError::Policy)?;
        let backend = match self.backend {
            Some(b) => b,
            None => Arc::new(crate::wasm::WasmBackend::shared().map_err(BuildError::Backend)?),
        };
        if !backend.provides_isolation() && !self.allow_no_isolation {
            return Err(BuildError::NoIsolation(backend.name()));
        }
        let journal_key = match self.journal_key {
            Some(key) => key,
            None => JournalKey::generate().map_err(BuildError::JournalKey)?,
        };
        Ok(Runner {
            inner: Arc::new(RunnerInner {
                backend,
                exposed,
                limits: self.limits,
                observers: self.observers,
                environment: tokio::sync::OnceCell::new(),
                journal_key,
            }),
        })
    }
}

//! [`Session`]: one guest kept alive across runs; [`SessionManager`]: the live sessions of a
//! server, by unguessable id, with a cap, an idle timeout and a maximum lifetime.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backend::BackendSession;
use crate::runner::{RunRequest, Runner, finish};
use crate::{ErrorKind, Limits, RunError, RunResult};

/// One guest kept alive across runs: variables, imports, functions, classes and the files in
/// its scratch directory persist from one run to the next.
///
/// Each run has its own wall clock, fuel budget, tool-call ceiling and output caps (the
/// runner's limits, or its request's); the memory limit and the file budgets are the
/// session's, for its whole life. A run that fails in the code (an exception, a
/// `MemoryError`, a refused tool call) leaves the session as it was; a run whose guest
/// traps, exits or passes its deadline ends the session: that run's result has
/// [`RunResult::session_ended`] set, and every later run fails with `session_ended`, saying
/// why. Runs in one session never overlap: a run sent while another is running fails at once
/// with `session_busy`.
///
/// ```no_run
/// # async fn demo(runner: pycage::Runner) -> Result<(), pycage::RunError> {
/// let session = runner.session().await?;
/// session.run("import math\nx = 2").await;
/// let result = session.run("return math.sqrt(x * 8)").await;
/// assert_eq!(result.value, 4.0);
/// # Ok(()) }
/// ```
pub struct Session {
    runner: Runner,
    limits: Limits,
    /// The backend's guest; `None` once a run ended it.
    guest: tokio::sync::Mutex<Option<Box<dyn BackendSession>>>,
    /// Why the session ended, once it has.
    ended: Mutex<Option<RunError>>,
    runs: AtomicU64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.runner.backend().name())
            .field("runs", &self.runs())
            .field("ended", &self.ended())
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(runner: Runner, limits: Limits, guest: Box<dyn BackendSession>) -> Self {
        Session {
            runner,
            limits,
            guest: tokio::sync::Mutex::new(Some(guest)),
            ended: Mutex::new(None),
            runs: AtomicU64::new(0),
        }
    }

    /// Runs `code` in the session with the runner's limits and no new variables.
    pub async fn run(&self, code: &str) -> RunResult {
        self.run_request(RunRequest::new(code)).await
    }

    /// Runs one request in the session: its variables are added to the session's globals,
    /// its input files to the session's scratch directory (replacing files of the same
    /// name). [`RunResult::files`] lists the files this run created or changed.
    pub async fn run_request(&self, request: RunRequest) -> RunResult {
        let started = Instant::now();
        let backend = self.runner.backend().name();
        let fail = |kind, message: String| {
            RunResult::failed(backend, RunError::new(kind, message), started.elapsed())
        };
        let Ok(mut guest) = self.guest.try_lock() else {
            return fail(
                ErrorKind::SessionBusy,
                "the session is running another run; runs in one session do not overlap".into(),
            );
        };
        let Some(live) = guest.as_mut() else {
            return fail(ErrorKind::SessionEnded, self.ended_message());
        };
        let (job, broker) = match self.runner.job(request, Some(&self.limits)) {
            Ok(prepared) => prepared,
            Err(error) => return RunResult::failed(backend, error, started.elapsed()),
        };
        let run = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        let result = finish(live.run(job, broker.clone()).await, &broker, started);
        if result.session_ended {
            *guest = None;
            let why = result
                .error
                .clone()
                .unwrap_or_else(|| RunError::new(ErrorKind::BackendError, "the guest exited"));
            let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            *ended = Some(RunError::new(
                why.kind,
                format!("run {run} ended it: {} ({})", why.message, why.kind),
            ));
        }
        result
    }

    /// Why the session ended (the run that ended it, and that run's error); `None` while it
    /// is live.
    pub fn ended(&self) -> Option<RunError> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True while a run is in progress.
    pub fn is_busy(&self) -> bool {
        self.guest.try_lock().is_err()
    }

    /// How many runs the session has started.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// The session's limits: its memory limit and file budgets hold for its whole life.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn ended_message(&self) -> String {
        match self.ended() {
            Some(why) => format!("the session has ended: {}", why.message),
            None => "the session has ended".to_owned(),
        }
    }
}

/// An unguessable session id: 128 random bits from the operating system, as 32 hex digits.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    fn random() -> Result<SessionId, RunError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            tracing::error!(error = %e, "pycage: no randomness for a session id");
            RunError::new(ErrorKind::BackendError, "a session id could not be made")
        })?;
        Ok(SessionId(
            bytes.iter().map(|b| format!("{b:02x}")).collect(),
        ))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SessionId {
    /// An id as a client sent it (it need not name a live session).
    fn from(text: &str) -> Self {
        SessionId(text.to_owned())
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    /// Only a prefix: an id is a bearer credential, and logs are read by more people.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix: String = self.0.chars().take(6).collect();
        write!(f, "SessionId({prefix}…)")
    }
}

/// The settings of a [`SessionManager`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    /// The most live sessions (default 16).
    pub max_sessions: usize,
    /// A session unused for this long is destroyed (default 10 minutes).
    #[serde(with = "secs")]
    pub idle_timeout: Duration,
    /// A session older than this is destroyed, used or not (default 1 hour).
    #[serde(with = "secs")]
    pub max_lifetime: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_sessions: 16,
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(3600),
        }
    }
}

impl SessionConfig {
    /// Checks that every setting is usable.
    ///
    /// # Errors
    ///
    /// An `invalid_input` error naming the setting that is zero.
    pub fn validate(&self) -> Result<(), RunError> {
        let zero = |name: &str| {
            Err(RunError::new(
                ErrorKind::InvalidInput,
                format!("session setting `{name}` must be more than zero"),
            ))
        };
        if self.max_sessions == 0 {
            return zero("max_sessions");
        }
        if self.idle_timeout.is_zero() {
            return zero("idle_timeout");
        }
        if self.max_lifetime.is_zero() {
            return zero("max_lifetime");
        }
        Ok(())
    }
}

/// Durations as whole seconds in configuration files.
mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

/// The live sessions of a server, by unguessable id.
///
/// At most [`SessionConfig::max_sessions`] live at once; a session unused for
/// [`SessionConfig::idle_timeout`], or older than [`SessionConfig::max_lifetime`], is
/// destroyed (its guest's memory and its scratch directory) at the next
/// [`sweep`](Self::sweep) or lookup, and its id then answers `session_not_found`. A
/// session in a run is never idle; one past its lifetime is removed at once, and destroyed
/// when its run ends. Clocks are tokio's, so tests can pause them.
pub struct SessionManager {
    runner: Runner,
    config: SessionConfig,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    live: HashMap<SessionId, Entry>,
    /// Sessions being opened: they count against the cap before they exist.
    opening: usize,
}

struct Entry {
    session: Arc<Session>,
    created: tokio::time::Instant,
    last_used: tokio::time::Instant,
}

impl fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionManager")
            .field("config", &self.config)
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

impl SessionManager {
    /// A manager whose sessions run on `runner`.
    ///
    /// # Errors
    ///
    /// When `config` does not validate, or the runner's backend keeps no sessions
    /// (`unsupported`).
    pub fn new(runner: Runner, config: SessionConfig) -> Result<Self, RunError> {
        config.validate()?;
        if !runner.backend().supports_sessions() {
            return Err(RunError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} backend does not keep sessions",
                    runner.backend().name()
                ),
            ));
        }
        Ok(SessionManager {
            runner,
            config,
            table: Mutex::new(Table::default()),
        })
    }

    /// The manager's settings.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.table().live.len()
    }

    /// True when no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opens a session with the runner's limits.
    ///
    /// # Errors
    ///
    /// `too_many_sessions` when [`SessionConfig::max_sessions`] are live (expired ones are
    /// swept first); otherwise as for [`Runner::session`].
    pub async fn create(&self) -> Result<SessionId, RunError> {
        self.create_with(self.runner.limits().clone()).await
    }

    /// Opens a session whose memory limit and file budgets are `limits`' (see
    /// [`Runner::session_with`]).
    ///
    /// # Errors
    ///
    /// As for [`create`](Self::create).
    pub async fn create_with(&self, limits: Limits) -> Result<SessionId, RunError> {
        {
            let mut table = self.table();
            self.sweep_locked(&mut table);
            if table.live.len() + table.opening >= self.config.max_sessions {
                return Err(RunError::new(
                    ErrorKind::TooManySessions,
                    format!(
                        "{} sessions are live, the most allowed; close one or wait for one \
                         to expire",
                        self.config.max_sessions
                    ),
                ));
            }
            table.opening += 1;
        }
        let opened = match SessionId::random() {
            Ok(id) => self.runner.session_with(limits).await.map(|s| (id, s)),
            Err(e) => Err(e),
        };
        let mut table = self.table();
        table.opening -= 1;
        let (id, session) = opened?;
        let now = tokio::time::Instant::now();
        table.live.insert(
            id.clone(),
            Entry {
                session: Arc::new(session),
                created: now,
                last_used: now,
            },
        );
        Ok(id)
    }

    /// The live session `id`, if it is one.
    pub fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        let mut table = self.table();
        self.sweep_locked(&mut table);
        table.live.get(id).map(|e| e.session.clone())
    }

    /// Runs `request` in session `id`; `session_not_found` when there is no such live
    /// session.
    pub async fn run(&self, id: &SessionId, request: RunRequest) -> RunResult {
        let Some(session) = self.touch(id) else {
            return RunResult::failed(self.runner.backend().name(), not_found(), Duration::ZERO);
        };
        let result = session.run_request(request).await;
        // The run's end is the session's last use (a long run is not idleness).
        if let Some(entry) = self.table().live.get_mut(id) {
            entry.last_used = tokio::time::Instant::now();
        }
        result
    }

    /// Destroys session `id`; false when there was no such live session. A run in progress
    /// finishes first (its guest goes when the run ends).
    pub fn close(&self, id: &SessionId) -> bool {
        self.table().live.remove(id).is_some()
    }

    /// Destroys every expired session; returns how many.
    pub fn sweep(&self) -> usize {
        let mut table = self.table();
        self.sweep_locked(&mut table)
    }

    /// Sweeps every `every` on the current tokio runtime while the manager lives.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let manager: Weak<SessionManager> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                let swept = manager.sweep();
                if swept > 0 {
                    tracing::debug!(swept, "pycage: expired sessions destroyed");
                }
            }
        })
    }

    fn touch(&self, id: &SessionId) -> Option<Arc<Session>> {
        let mut table = self.table();
        self.sweep_locked(&mut table);
        let entry = table.live.get_mut(id)?;
        entry.last_used = tokio::time::Instant::now();
        Some(entry.session.clone())
    }

    fn sweep_locked(&self, table: &mut Table) -> usize {
        let now = tokio::time::Instant::now();
        let before = table.live.len();
        table.live.retain(|_, e| {
            let too_old = now.duration_since(e.created) >= self.config.max_lifetime;
            let idle =
                now.duration_since(e.last_used) >= self.config.idle_timeout && !e.session.is_busy();
            !(too_old || idle)
        });
        before - table.live.len()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn not_found() -> RunError {
    RunError::new(
        ErrorKind::SessionNotFound,
        "no live session has that id (it never existed, was closed, or expired)",
    )
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;

//! What both servers serve: one runner with its sessions and maxima, the `[net]` fetch a run
//! may narrow, the store of suspended runs, and one admission path. `pycage serve`
//! ([`HttpApi`](crate::http::HttpApi)) and `pycage mcp` ([`PythonTool`](crate::PythonTool))
//! each hold one and translate their protocol to and from it; a run's reply is
//! [`Reply`](crate::reply::Reply).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pycage::{
    Decision, ErrorKind, Limits, RunError, RunRequest, RunResult, Runner, SessionManager,
};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::suspended::SuspendedRun;
use crate::{ServerConfig, StartError, SuspendedRuns};

/// The tools that replace exposed ones for one run ([`pycage::RunRequest::replace_tool`]).
pub type Replacements = Vec<Arc<dyn pycage_tools::Tool>>;

/// Why a server refused a run before any code ran: the server's state, apart from a run's
/// own outcome (`ErrorKind`) and from bad input.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The server is shutting down and takes no new runs.
    Draining,
    /// Every slot is taken and the wait queue is full, or no slot came free in time.
    Busy(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Draining => f.write_str("the server is shutting down and takes no new runs"),
            Refusal::Busy(why) => f.write_str(why),
        }
    }
}

impl From<Refusal> for RunError {
    /// A refusal as a run's error, where a protocol has no other place for it (MCP's tool
    /// result): `busy` either way, since a later try may be taken.
    fn from(refusal: Refusal) -> Self {
        RunError::new(ErrorKind::Busy, refusal.to_string())
    }
}

/// A run's admission: while held, it counts against the queue and holds a slot.
#[derive(Debug)]
pub struct Admission {
    _queued: OwnedSemaphorePermit,
    _slot: OwnedSemaphorePermit,
}

/// The runner and what both servers keep beside it (see the [module docs](self)).
#[derive(Debug)]
pub struct Service {
    pub(crate) runner: Runner,
    pub(crate) sessions: Option<Arc<SessionManager>>,
    pub(crate) maxima: Limits,
    /// Runs suspended at a call that waits for approval, until resumed.
    pub(crate) suspended: SuspendedRuns,
    /// The `[net]` table's `net.fetch`, which a run's `net_allow` narrows.
    fetch: Option<pycage_tools::net::FetchTool>,
    /// One permit per run that may be running or waiting for a slot.
    queued: Arc<Semaphore>,
    /// `queued`'s size: runs at once plus runs that may wait.
    capacity: usize,
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    queue_timeout: Duration,
    draining: AtomicBool,
}

impl Service {
    /// The service over `runner`, with `config`'s sessions, `[net]`, `[suspended]` and
    /// `[runs]` bounds, and the given maxima.
    ///
    /// # Errors
    ///
    /// [`StartError`] naming what is unusable.
    pub(crate) fn new(
        runner: Runner,
        config: &ServerConfig,
        maxima: Limits,
    ) -> Result<Self, StartError> {
        let sessions = crate::sandbox::sessions(&runner, config)?;
        let fetch = crate::sandbox::fetch_tool(config).map_err(StartError::Sandbox)?;
        let max_concurrent = config.runs.max_concurrent;
        let capacity = max_concurrent.saturating_add(config.runs.max_queued());
        Ok(Service {
            runner,
            sessions,
            maxima,
            suspended: SuspendedRuns::new(config.suspended.clone()),
            fetch,
            queued: Arc::new(Semaphore::new(capacity)),
            capacity,
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            queue_timeout: config.runs.queue_timeout,
            draining: AtomicBool::new(false),
        })
    }

    /// Admits one run: refused at once while draining or when `max_concurrent` run and
    /// `max_queued` wait; else it waits at most `queue_timeout` for a slot.
    ///
    /// # Errors
    ///
    /// The [`Refusal`]; nothing ran.
    pub async fn admit(&self) -> Result<Admission, Refusal> {
        if self.is_draining() {
            return Err(Refusal::Draining);
        }
        let queued = self.queued.clone().try_acquire_owned().map_err(|_| {
            Refusal::Busy(
                "every run slot is taken and the wait queue is full; nothing ran, retry shortly"
                    .into(),
            )
        })?;
        let slot = tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned());
        match slot.await {
            Ok(Ok(slot)) => Ok(Admission {
                _queued: queued,
                _slot: slot,
            }),
            // The semaphore is never closed; a closed one is as good as full.
            Ok(Err(_)) | Err(_) => Err(Refusal::Busy(format!(
                "the server is running as many runs as it allows and none finished within {}; \
                 nothing ran, try again later",
                pycage_tools::units::format_duration(self.queue_timeout)
            ))),
        }
    }

    /// Resumes the kept run `id` with `decision` once admitted; the result, and the tools
    /// that replaced exposed ones for it (kept again if it stops again).
    ///
    /// # Errors
    ///
    /// The [`Refusal`]: nothing ran, and the run waits on for a later resume.
    pub(crate) async fn resume(
        &self,
        id: String,
        run: SuspendedRun,
        decision: Decision,
    ) -> Result<(RunResult, Replacements), Refusal> {
        let _admitted = match self.admit().await {
            Ok(admitted) => admitted,
            Err(refused) => {
                self.suspended.put_back(id, run);
                return Err(refused);
            }
        };
        let replacements = run.replacements.clone();
        let result = self
            .runner
            .resume_with(run.state, decision, run.replacements)
            .await;
        Ok((result, replacements))
    }

    /// Stops admitting runs; those admitted finish.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// True once [`drain`](Self::drain) was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Runs admitted now (running or waiting for a slot).
    pub fn runs_admitted(&self) -> usize {
        self.capacity
            .saturating_sub(self.queued.available_permits())
    }

    /// Runs holding a slot now (at most `max_concurrent`).
    pub fn runs_running(&self) -> usize {
        self.max_concurrent
            .saturating_sub(self.slots.available_permits())
    }

    /// `request` with `net.fetch` narrowed to `hosts` (a run's `net_allow`) when it names
    /// some, and the narrowed tool, to keep with the run if it suspends.
    ///
    /// # Errors
    ///
    /// What is wrong with `hosts`, for the caller's bad-input error.
    pub(crate) fn narrow(
        &self,
        request: RunRequest,
        hosts: Option<&Value>,
    ) -> Result<(RunRequest, Replacements), String> {
        let Some(hosts) = hosts else {
            return Ok((request, Vec::new()));
        };
        let narrowed = crate::sandbox::narrowed_fetch(self.fetch.as_ref(), hosts)?;
        Ok((request.replace_tool(narrowed.clone()), vec![narrowed]))
    }

    /// True when `[net]` exposes `net.fetch`.
    pub(crate) fn has_fetch(&self) -> bool {
        self.fetch.is_some()
    }
}

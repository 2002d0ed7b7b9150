//! The [`Backend`] trait: one way to run a guest.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::broker::ToolGate;
use crate::policy::Binding;
use crate::{Limits, RunResult};

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
}

/// Whether a backend can run on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// It can run here.
    Available,
    /// It cannot run here; the reason says why (binary missing, wrong OS, ...).
    Unavailable(String),
}

impl Availability {
    /// True when available.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available)
    }

    /// `Ok` when available, else the reason.
    pub fn into_result(self) -> Result<(), String> {
        match self {
            Availability::Available => Ok(()),
            Availability::Unavailable(why) => Err(why),
        }
    }
}

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
}

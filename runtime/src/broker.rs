//! The [`Broker`]: the host-side gate every tool call of a run passes.
//!
//! # Security
//!
//! The broker is the guest's only way to make the host act. Every check happens here, on the
//! host, in this order, before a tool sees anything:
//!
//! 1. the run is still live (no calls after its result);
//! 2. the arguments' size is within the cap (checked on the raw text, before parsing);
//! 3. the name resolves exactly to an exposed tool (no trimming, no case folding);
//! 4. the arguments parse as a JSON object (nested at most 200 deep; floats bit for bit;
//!    an integer beyond 64 bits is refused, never rounded);
//! 5. the call ceiling admits one more call (an atomic check-and-increment);
//!
//! then the tool runs under the per-call timeout, with panics caught, and its result's size is
//! capped before it crosses back. Calls refused by 1–4 are not counted against the ceiling;
//! calls that execute count even when the tool fails. Each call emits one audit event on the
//! `pycage::audit` tracing target, and reaches the run's [`ToolCallObserver`]s.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pycage_tools::json::{self, JsonError};
use pycage_tools::{Args, Tool, ToolError};
use serde_json::Value;

use crate::Limits;
use crate::journal::{CallJournal, Step};
use crate::policy::ExposedTools;

/// Why the broker refused or failed a call. Mirrors the WIT `tool-error` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// No exposed tool has that name.
    NotFound(String),
    /// The arguments are not a JSON object or do not fit the tool.
    InvalidArguments(String),
    /// The run is over, or the policy refuses the call.
    Denied(String),
    /// The tool failed, timed out or panicked.
    Failed(String),
    /// The call ceiling or a byte cap was reached.
    LimitExceeded(String),
}

impl CallError {
    /// The short message shown to the guest.
    pub fn message(&self) -> &str {
        match self {
            CallError::NotFound(m)
            | CallError::InvalidArguments(m)
            | CallError::Denied(m)
            | CallError::Failed(m)
            | CallError::LimitExceeded(m) => m,
        }
    }

    /// The error of the kind named `kind` (as [`CallError::kind`] gives it) with `message`;
    /// an unknown kind reads as `failed`.
    pub fn from_kind(kind: &str, message: &str) -> Self {
        let message = message.to_owned();
        match kind {
            "not-found" => CallError::NotFound(message),
            "invalid-arguments" => CallError::InvalidArguments(message),
            "denied" => CallError::Denied(message),
            "limit-exceeded" => CallError::LimitExceeded(message),
            _ => CallError::Failed(message),
        }
    }

    /// The kind's wire name (`not-found`, `invalid-arguments`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::NotFound(_) => "not-found",
            CallError::InvalidArguments(_) => "invalid-arguments",
            CallError::Denied(_) => "denied",
            CallError::Failed(_) => "failed",
            CallError::LimitExceeded(_) => "limit-exceeded",
        }
    }
}

/// The future of one gated call.
pub type GateFuture<'a> = Pin<Box<dyn Future<Output = Result<String, CallError>> + Send + 'a>>;

/// Where a guest's tool calls go. On the host this is the run's [`Broker`]; a backend whose
/// guest runs in a confined worker process gives it a gate that forwards each call to the
/// host's broker, so policy is still decided on the host.
pub trait ToolGate: Send + Sync + 'static {
    /// Handles one call: `name` as the guest wrote it, `args_json` as raw text.
    fn call<'a>(&'a self, name: &'a str, args_json: &'a str) -> GateFuture<'a>;
    /// The run's id, for audit events.
    fn run_id(&self) -> &str;
    /// True once the run has stopped early at a call (suspended for approval, or diverged
    /// from the journal it replays): the backend may stop the guest at once, and every later
    /// call is denied.
    fn halted(&self) -> bool {
        false
    }
}

impl ToolGate for Broker {
    fn call<'a>(&'a self, name: &'a str, args_json: &'a str) -> GateFuture<'a> {
        Box::pin(Broker::call(self, name, args_json))
    }

    fn run_id(&self) -> &str {
        Broker::run_id(self)
    }

    fn halted(&self) -> bool {
        self.journal.as_ref().is_some_and(CallJournal::halted)
    }
}

/// One tool call as the broker saw it, for a [`ToolCallObserver`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ToolCallEvent<'a> {
    /// The run's id, as in the audit events.
    pub run_id: &'a str,
    /// The exposed tool's qualified name (`math.add`), or `None` when the call named no
    /// exposed tool: a name the guest made up never reaches an observer, so it cannot become
    /// a metric label of its choosing.
    pub tool: Option<&'a str>,
    /// `ok`, or the [`CallError::kind`] of a refused or failed call.
    pub outcome: &'static str,
    /// From the call's arrival at the broker to its answer.
    pub duration: Duration,
}

/// Sees every tool call a run's broker handles, after it is answered (metrics, for example).
/// Called on the call's path: keep it quick and never block.
pub trait ToolCallObserver: Send + Sync + 'static {
    /// One call, answered.
    fn observe(&self, call: &ToolCallEvent<'_>);
}

/// The observers of a runner's runs: shared by every broker it makes.
#[derive(Clone, Default)]
pub struct Observers(Arc<[Arc<dyn ToolCallObserver>]>);

impl Observers {
    /// These observers and `more`.
    #[must_use]
    pub fn with(&self, more: Arc<dyn ToolCallObserver>) -> Self {
        Observers(self.0.iter().cloned().chain([more]).collect())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

/// The limits the broker applies, taken from the run's [`Limits`].
#[derive(Debug, Clone, Copy)]
struct CallLimits {
    max_calls: u32,
    timeout: Duration,
    max_args_bytes: u64,
    max_result_bytes: u64,
}

/// The gate between one run's guest and the host's tools. One per run; shared by reference
/// with the backend that runs the guest.
#[derive(Debug)]
pub struct Broker {
    run_id: String,
    tools: ExposedTools,
    limits: CallLimits,
    executed: AtomicU32,
    ceiling_hit: AtomicBool,
    finished: AtomicBool,
    observers: Observers,
    /// The run's journal, when it keeps one.
    journal: Option<CallJournal>,
}

impl Broker {
    /// A broker for one run exposing `tools` under `limits`. `run_id` tags the audit events.
    pub fn new(run_id: impl Into<String>, tools: ExposedTools, limits: &Limits) -> Self {
        Broker {
            run_id: run_id.into(),
            tools,
            limits: CallLimits {
                max_calls: limits.max_tool_calls(),
                timeout: limits.tool_timeout(),
                max_args_bytes: limits.max_tool_args_bytes(),
                max_result_bytes: limits.max_tool_result_bytes(),
            },
            executed: AtomicU32::new(0),
            ceiling_hit: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            observers: Observers::default(),
            journal: None,
        }
    }

    /// This broker, recording its calls in `journal` (and answering from it what it replays).
    #[must_use]
    pub(crate) fn journaled(mut self, journal: CallJournal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// The run's journal, when it keeps one.
    pub(crate) fn journal(&self) -> Option<&CallJournal> {
        self.journal.as_ref()
    }

    /// This broker, with `observers` told of each call it answers.
    #[must_use]
    pub fn observed_by(mut self, observers: Observers) -> Self {
        self.observers = observers;
        self
    }

    /// The run's id, as in the audit events.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The tools this run exposes.
    pub fn tools(&self) -> &ExposedTools {
        &self.tools
    }

    /// How many calls have executed.
    pub fn executed(&self) -> u32 {
        self.executed.load(Ordering::SeqCst)
    }

    /// True when a call was refused because the ceiling was reached.
    pub fn ceiling_hit(&self) -> bool {
        self.ceiling_hit.load(Ordering::SeqCst)
    }

    /// Marks the run as over: every later call is denied.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }

    /// Handles one call from the guest: `name` as the guest wrote it, `args_json` as raw text.
    ///
    /// # Errors
    ///
    /// A [`CallError`] whose message is safe to show to the guest.
    pub async fn call(&self, name: &str, args_json: &str) -> Result<String, CallError> {
        let started = Instant::now();
        let outcome = self.call_inner(name, args_json).await;
        let (outcome_kind, result_bytes) = match &outcome {
            Ok(text) => ("ok", text.len()),
            Err(e) => (e.kind(), 0),
        };
        let duration = started.elapsed();
        if !self.observers.is_empty() {
            let tool = self
                .tools
                .lookup(name)
                .map(|t| format!("{}.{}", t.namespace(), t.name()));
            let event = ToolCallEvent {
                run_id: &self.run_id,
                tool: tool.as_deref(),
                outcome: outcome_kind,
                duration,
            };
            for observer in self.observers.0.iter() {
                observer.observe(&event);
            }
        }
        tracing::info!(
            target: "pycage::audit",
            run = %self.run_id,
            tool = %printable(name),
            outcome = outcome_kind,
            args_bytes = args_json.len(),
            result_bytes,
            micros = duration.as_micros() as u64,
            executed = self.executed(),
            "tool call"
        );
        outcome
    }

    async fn call_inner(&self, name: &str, args_json: &str) -> Result<String, CallError> {
        if self.finished.load(Ordering::SeqCst) {
            return Err(CallError::Denied("the run has finished".into()));
        }
        if args_json.len() as u64 > self.limits.max_args_bytes {
            return Err(CallError::LimitExceeded(format!(
                "tool arguments are {} bytes; the limit is {}",
                args_json.len(),
                self.limits.max_args_bytes
            )));
        }
        let Some(tool) = self.tools.lookup(name) else {
            return Err(CallError::NotFound(format!(
                "tool `{}` is not available",
                printable(name)
            )));
        };
        let args = parse_args(args_json)?;
        self.admit()?;
        let qualified = || format!("{}.{}", tool.namespace(), tool.name());
        let needs_approval = |qualified: &str| {
            self.tools.any_need_approval() && self.tools.needs_approval(qualified)
        };
        let Some(journal) = &self.journal else {
            if needs_approval(&qualified()) {
                return Err(CallError::Denied(format!(
                    "`{}` needs a person's approval, which a run that keeps no journal (a \
                     session's) cannot wait for",
                    qualified()
                )));
            }
            return match self.invoke(tool, args).await {
                Invoked::Done(outcome) => outcome,
                Invoked::Suspend(reason) => Err(CallError::Denied(format!(
                    "`{}` waits for a person ({reason}), which a run that keeps no journal \
                     (a session's) cannot do",
                    qualified()
                ))),
            };
        };
        let qualified = qualified();
        match journal.begin(&qualified, &args, needs_approval(&qualified)) {
            Step::Answer(answer) => answer,
            Step::Halt => Err(self.halt()),
            Step::Call { position } => {
                let recorded_args = args.clone();
                match self.invoke(tool, args).await {
                    Invoked::Done(outcome) => {
                        journal.record(position, qualified, recorded_args, &outcome);
                        outcome
                    }
                    Invoked::Suspend(reason) => {
                        journal.tool_suspended(position, &qualified, &recorded_args, &reason);
                        Err(self.halt())
                    }
                }
            }
        }
    }

    /// The run stopped at this call: no later call is answered.
    fn halt(&self) -> CallError {
        self.finish();
        CallError::Denied("the run has stopped here".into())
    }

    /// Calls `tool` under the per-call timeout with panics caught, and caps its result.
    async fn invoke(&self, tool: &Arc<dyn Tool>, args: Args) -> Invoked {
        let timeout = tool
            .timeout()
            .map_or(self.limits.timeout, |t| t.min(self.limits.timeout));
        let result = tokio::time::timeout(timeout, CatchUnwind(tool.call(args))).await;
        let value = match result {
            Err(_) => {
                return Invoked::Done(Err(CallError::Failed(format!(
                    "tool timed out after {}",
                    pycage_tools::units::format_duration(timeout)
                ))));
            }
            Ok(Err(())) => return Invoked::Done(Err(CallError::Failed("tool crashed".into()))),
            Ok(Ok(Err(ToolError::InvalidArguments(m)))) => {
                return Invoked::Done(Err(CallError::InvalidArguments(m)));
            }
            Ok(Ok(Err(ToolError::Suspend(reason)))) => return Invoked::Suspend(reason),
            Ok(Ok(Err(ToolError::Denied(m)))) => {
                return Invoked::Done(Err(CallError::Denied(m)));
            }
            Ok(Ok(Err(e))) => {
                return Invoked::Done(Err(CallError::Failed(e.message().to_owned())));
            }
            Ok(Ok(Ok(value))) => value,
        };
        Invoked::Done(self.cap_result(&value))
    }

    /// A tool's value as the JSON text the guest gets, within the result cap.
    fn cap_result(&self, value: &Value) -> Result<String, CallError> {
        let max = self.limits.max_result_bytes;
        let mut out = CappedWriter {
            buf: Vec::new(),
            max: usize::try_from(max).unwrap_or(usize::MAX),
        };
        match serde_json::to_writer(&mut out, value) {
            Ok(()) => {}
            Err(e) if e.is_io() => {
                return Err(CallError::LimitExceeded(format!(
                    "tool result is larger than the limit of {max} bytes"
                )));
            }
            Err(_) => return Err(CallError::Failed("tool result is not JSON".into())),
        }
        // The guest reads results by the bound it returns values by.
        json::check_nesting(&out.buf, json::MAX_DEPTH)
            .map_err(|e| CallError::Failed(format!("in the tool's result, {e}")))?;
        String::from_utf8(out.buf).map_err(|_| CallError::Failed("tool result is not JSON".into()))
    }

    /// The atomic check-and-increment of the call ceiling.
    fn admit(&self) -> Result<(), CallError> {
        let max = self.limits.max_calls;
        self.executed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .map(drop)
            .map_err(|_| {
                self.ceiling_hit.store(true, Ordering::SeqCst);
                CallError::LimitExceeded(format!("tool call limit reached ({max} calls)"))
            })
    }
}

/// How a live call ended: with an outcome for the guest, or with the tool asking the run to
/// wait for a person.
enum Invoked {
    Done(Result<String, CallError>),
    Suspend(String),
}

const ARGS_NOT_JSON: &str = "arguments are not JSON";
const ARGS_NOT_AN_OBJECT: &str = "arguments must be a JSON object";

/// A call's arguments as the broker reads them: a JSON object nested at most
/// [`json::MAX_DEPTH`] deep, floats bit for bit and integers exact (one beyond 64 bits is
/// refused, never rounded).
fn parse_args(args_json: &str) -> Result<Args, CallError> {
    match json::parse(args_json.as_bytes(), json::MAX_DEPTH) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(CallError::InvalidArguments(ARGS_NOT_AN_OBJECT.into())),
        Err(JsonError::Syntax) => Err(CallError::InvalidArguments(ARGS_NOT_JSON.into())),
        Err(e @ JsonError::IntegerOutOfRange(_)) => Err(CallError::InvalidArguments(format!(
            "in the arguments, {e}; pass such a number as a string"
        ))),
        Err(e) => Err(CallError::InvalidArguments(format!(
            "in the arguments, {e}"
        ))),
    }
}

/// Checks that `args_json` is a JSON object without parsing it into values, for a gate that
/// forwards the text to the broker (which then applies [`parse_args`]): the same messages for
/// the same faults.
///
/// # Errors
///
/// `InvalidArguments` when the text is not JSON, or not an object.
#[cfg(unix)]
pub(crate) fn raw_args(args_json: &str) -> Result<&serde_json::value::RawValue, CallError> {
    use serde_json::value::RawValue;
    match serde_json::from_str::<&RawValue>(args_json) {
        Ok(raw) if raw.get().starts_with('{') => Ok(raw),
        Ok(_) => Err(CallError::InvalidArguments(ARGS_NOT_AN_OBJECT.into())),
        Err(_) => Err(CallError::InvalidArguments(ARGS_NOT_JSON.into())),
    }
}

/// Serializes into memory and stops at the cap, so an oversized result is refused without
/// first being written out whole.
struct CappedWriter {
    buf: Vec<u8>,
    max: usize,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + bytes.len() > self.max {
            return Err(std::io::Error::other("over the result cap"));
        }
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A guest-supplied name made safe for messages and logs: control characters escaped, at most
/// 64 characters.
fn printable(name: &str) -> String {
    let mut out: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().nth(64).is_some() {
        out.push('…');
    }
    out
}

/// Polls a tool's future with panics caught, so a panicking tool fails its call instead of
/// taking the run (or the host) down.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(_) => Poll::Ready(Err(())),
        }
    }
}

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;

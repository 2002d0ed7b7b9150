//! [`RunResult`]: what one run produced, and [`RunError`]: why it produced no value.

use std::fmt;
use std::time::Duration;

use pycage_tools::json::{self, JsonError};

use crate::capture::Captured;
use crate::files::OutputFile;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The outcome of one run. Serialized as one JSON object with these field names.
///
/// A backend builds it with [`RunResult::builder`]; new fields may be added (it is
/// `#[non_exhaustive]`), each with a default the builder fills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunResult {
    /// True when the code ran to the end (or returned) and its value crossed back.
    pub ok: bool,
    /// The code's return value, as JSON (`null` when it returned nothing or failed).
    pub value: Value,
    /// What the guest wrote to stdout, head and tail kept within the output cap.
    pub stdout: String,
    /// What the guest wrote to stderr, head and tail kept within the output cap.
    pub stderr: String,
    /// True when stdout went over the cap and its middle was cut.
    pub stdout_truncated: bool,
    /// True when stderr went over the cap and its middle was cut.
    pub stderr_truncated: bool,
    /// Why the run produced no value; `None` when `ok`.
    pub error: Option<RunError>,
    /// How many tool calls were executed (refused calls are not counted).
    pub tool_calls: u32,
    /// Fuel consumed, where the backend meters it (the wasm backend always does).
    pub fuel_consumed: Option<u64>,
    /// Wall-clock time of the run, from the request to the result.
    #[serde(with = "duration_ms")]
    pub duration: Duration,
    /// The backend that ran the code.
    pub backend: String,
    /// True when the wall-clock limit ended the run.
    pub timed_out: bool,
    /// The files the code created or changed in its working directory, sorted by path.
    /// Serialized with their bytes as base64 (`null` for a file past `max_returned_bytes`).
    #[serde(default)]
    pub files: Vec<OutputFile>,
    /// In a [`Session`](crate::Session): true when this run ended the session (a trap, an
    /// exit, or a deadline poisoned its guest); `error` says why. Later runs in it fail with
    /// `session_ended`. Serialized only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session_ended: bool,
    /// The run's tool calls, signed, when it kept a journal (see
    /// [`RunRequest::record_journal`](crate::RunRequest::record_journal)). Serialized only
    /// when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<crate::Journal>,
    /// When the run stopped at a call waiting for a person (`error.kind` is `suspended`):
    /// the signed state [`Runner::resume`](crate::Runner::resume) finishes it from.
    /// Serialized only when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<crate::Suspended>,
}

impl RunResult {
    /// Starts the result of a run on `backend` that produced `value` (or the error saying why
    /// it produced none). `ok` and `timed_out` follow from it; output, fuel and duration are
    /// the builder's to set. `tool_calls` is the [`Runner`](crate::Runner)'s: it owns the
    /// broker that counted them.
    pub fn builder(backend: &str, value: Result<Value, RunError>) -> RunResultBuilder {
        let (ok, value, error) = match value {
            Ok(value) => (true, value, None),
            Err(error) => (false, Value::Null, Some(error)),
        };
        RunResultBuilder(RunResult {
            ok,
            value,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            timed_out: error.as_ref().is_some_and(|e| e.kind == ErrorKind::Timeout),
            error,
            tool_calls: 0,
            fuel_consumed: None,
            duration: Duration::ZERO,
            backend: backend.to_owned(),
            files: Vec::new(),
            session_ended: false,
            journal: None,
            suspended: None,
        })
    }

    /// A failed result with nothing else to report; used before a guest has run.
    pub fn failed(backend: &str, error: RunError, duration: Duration) -> Self {
        RunResult::builder(backend, Err(error))
            .duration(duration)
            .build()
    }
}

/// Builds a [`RunResult`]; see [`RunResult::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RunResultBuilder(RunResult);

impl RunResultBuilder {
    /// What the guest wrote to stdout, as its capture kept it.
    pub fn stdout(mut self, captured: Captured) -> Self {
        self.0.stdout = captured.text;
        self.0.stdout_truncated = captured.truncated;
        self
    }

    /// What the guest wrote to stderr, as its capture kept it.
    pub fn stderr(mut self, captured: Captured) -> Self {
        self.0.stderr = captured.text;
        self.0.stderr_truncated = captured.truncated;
        self
    }

    /// The fuel the run consumed, where the backend meters it.
    pub fn fuel_consumed(mut self, fuel: Option<u64>) -> Self {
        self.0.fuel_consumed = fuel;
        self
    }

    /// The files the code produced.
    pub fn files(mut self, files: Vec<OutputFile>) -> Self {
        self.0.files = files;
        self
    }

    /// Marks the run as the one that ended its session.
    pub fn session_ended(mut self, ended: bool) -> Self {
        self.0.session_ended = ended;
        self
    }

    /// How long the run took.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.0.duration = duration;
        self
    }

    /// The result.
    pub fn build(self) -> RunResult {
        self.0
    }
}

/// Why a run produced no value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// One short line; never host paths, host backtraces or panic texts.
    pub message: String,
    /// The guest's traceback, limited to the user's code, where there is one.
    pub traceback: Option<String>,
    /// The Python exception type that ended the run (`ZeroDivisionError`), where there is one.
    pub exception: Option<String>,
}

impl RunError {
    /// An error of `kind` with `message` and no traceback.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RunError {
            kind,
            message: message.into(),
            traceback: None,
            exception: None,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for RunError {}

/// The kinds of run failure. Serialized in snake_case (`"fuel_exhausted"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The wall-clock limit ended the run.
    Timeout,
    /// The fuel budget ran out.
    FuelExhausted,
    /// The guest asked for more memory than the limit allows.
    MemoryLimit,
    /// The guest's stack overflowed (deeper than the interpreter could catch).
    StackOverflow,
    /// The code hit the run's tool-call ceiling and did not recover.
    ToolCallLimit,
    /// The return value's JSON is larger than the limit.
    ValueTooLarge,
    /// The code raised an exception it did not catch.
    GuestException,
    /// The code does not compile.
    SyntaxError,
    /// The request is unusable: code too large or not text, bad variables, bad settings.
    InvalidInput,
    /// The guest used a capability the sandbox does not grant.
    CapabilityDenied,
    /// The sandbox itself failed (could not start, crashed, or is unavailable here).
    BackendError,
    /// The backend cannot do what was asked (for example, keep a session).
    Unsupported,
    /// The session this run was sent to has ended (the message says why); open a new one.
    SessionEnded,
    /// The session is running another run; runs in one session do not overlap.
    SessionBusy,
    /// No live session has that id (it never existed, was closed, or expired).
    SessionNotFound,
    /// The most sessions allowed are live; close one or wait for one to expire.
    TooManySessions,
    /// A server is running as many runs as it allows, and none finished within its queue
    /// timeout; nothing ran. Try again later.
    Busy,
    /// The run stopped at a tool call that waits for a person's approval; the result's
    /// `suspended` state resumes it (see [`Runner::resume`](crate::Runner::resume)).
    Suspended,
    /// A call differed from the journal the run replayed, at its position; the message
    /// names both calls.
    ReplayDiverged,
}

impl ErrorKind {
    /// True when nothing ran because the request was refused: bad input, a session's state
    /// (not found, busy, ended, too many), a busy server, or an ask the backend cannot do.
    /// The other kinds are a run's own outcome. A server answers a refusal as an error of
    /// the request (an HTTP status), and an outcome as a result.
    pub fn is_refusal(self) -> bool {
        matches!(
            self,
            ErrorKind::InvalidInput
                | ErrorKind::Unsupported
                | ErrorKind::SessionEnded
                | ErrorKind::SessionBusy
                | ErrorKind::SessionNotFound
                | ErrorKind::TooManySessions
                | ErrorKind::Busy
        )
    }

    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::FuelExhausted => "fuel_exhausted",
            ErrorKind::MemoryLimit => "memory_limit",
            ErrorKind::StackOverflow => "stack_overflow",
            ErrorKind::ToolCallLimit => "tool_call_limit",
            ErrorKind::ValueTooLarge => "value_too_large",
            ErrorKind::GuestException => "guest_exception",
            ErrorKind::SyntaxError => "syntax_error",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::CapabilityDenied => "capability_denied",
            ErrorKind::BackendError => "backend_error",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::SessionEnded => "session_ended",
            ErrorKind::SessionBusy => "session_busy",
            ErrorKind::SessionNotFound => "session_not_found",
            ErrorKind::TooManySessions => "too_many_sessions",
            ErrorKind::Busy => "busy",
            ErrorKind::Suspended => "suspended",
            ErrorKind::ReplayDiverged => "replay_diverged",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Host-side caps on a guest's failure texts, for every backend (the guest caps them too; it
/// is not trusted to).
pub(crate) const MAX_MESSAGE_CHARS: usize = 2000;
pub(crate) const MAX_TRACEBACK_CHARS: usize = 16_000;
pub(crate) const MAX_EXCEPTION_CHARS: usize = 200;

/// The guest's value JSON, checked on the host: within the cap, valid JSON, nested at most
/// [`json::MAX_DEPTH`] deep, floats bit for bit and integers exact or refused.
pub(crate) fn decode_value(json: &str, max_bytes: u64) -> Result<Value, RunError> {
    if json.len() as u64 > max_bytes {
        return Err(RunError::new(
            ErrorKind::ValueTooLarge,
            format!(
                "the return value is {} bytes of JSON; the limit is {max_bytes}",
                json.len()
            ),
        ));
    }
    json::parse(json.as_bytes(), json::MAX_DEPTH).map_err(|e| {
        let hint = match e {
            JsonError::IntegerOutOfRange(_) => "; return such a number as a string, str(n)",
            _ => "",
        };
        RunError::new(
            ErrorKind::GuestException,
            format!("in the return value, {e}{hint}"),
        )
    })
}

/// `text` cut to `max` characters, with an ellipsis when it was longer.
pub(crate) fn cap_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// `n` with a comma between groups of three digits: `1,048,576`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Durations serialize as fractional milliseconds (`"duration": 1.25`).
mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Duration::try_from_secs_f64(ms / 1000.0).map_err(serde::de::Error::custom)
    }
}

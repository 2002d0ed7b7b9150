//! The wire protocol between a sandboxed guest and the host's broker: plain functions that
//! encode and decode frames, with no I/O, so they can be unit-tested and fuzzed.
//!
//! # Frames
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON, one
//! object. The reader checks the length against [`max_frame_bytes`] before it reads (or
//! allocates for) the body.
//!
//! # Requests (guest → host)
//!
//! ```json
//! {"token": "…", "id": 1, "method": "call", "name": "add", "namespace": "math", "arguments": {"a": 1}}
//! {"token": "…", "id": 2, "method": "result", "outcome": {"ok": true, "value_json": "15"}}
//! {"token": "…", "id": 2, "method": "result", "outcome": {"ok": false, "kind": "guest-exception",
//!     "message": "ZeroDivisionError: division by zero", "traceback": "…", "exception": "ZeroDivisionError"}}
//! ```
//!
//! `namespace` is optional; `traceback` and `exception` may be `null` or absent. A layered
//! worker adds a `report` to its outcome (see [`WorkerReport`]). Unknown fields are errors.
//!
//! A session's guest (one process serving run after run) also asks for its next run, and
//! the host answers when there is one (see [`SessionJob`]); a one-shot run's server refuses
//! the method as `bad-request`:
//!
//! ```json
//! {"token": "…", "id": 3, "method": "next"}
//! ```
//!
//! # Responses (host → guest)
//!
//! ```json
//! {"id": 1, "ok": true, "result_json": "{\"sum\":3}"}
//! {"id": 1, "ok": false, "error": {"kind": "not-found", "message": "tool `x` is not available"}}
//! ```
//!
//! Error kinds are the broker's five (`not-found`, `invalid-arguments`, `denied`, `failed`,
//! `limit-exceeded`) plus `unauthorized` (wrong or missing token: nothing else in the frame
//! was looked at) and `bad-request` (a malformed frame). A frame over the cap is answered
//! `limit-exceeded` without its body being read, and its connection is closed. `id` is `null`
//! when the request's id could not be read.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::token::Token;
use crate::{ErrorKind, Limits, RunError};

/// Bytes of a frame's length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;

/// Room in a frame for everything around its payload (field names, token, id, escapes).
pub const FRAME_SLACK_BYTES: u64 = 64 * 1024;

/// The largest frame a run accepts.
///
/// A call frame carries at most `max_tool_args_bytes` of arguments. A result frame carries the
/// return value's JSON as a JSON string (at most twice `max_value_bytes` once escaped) and, from
/// a layered worker, the captured stdout and stderr (at most six bytes per byte once escaped)
/// and the produced files (their bytes as base64, a third more than `max_returned_bytes`, and
/// for each of at most `max_files` its path, six bytes per byte once escaped, and its size).
/// The cap is the larger of the two plus [`FRAME_SLACK_BYTES`], and never more than 4 GiB.
pub fn max_frame_bytes(limits: &Limits) -> u64 {
    let call = limits.max_tool_args_bytes();
    let per_file = (crate::files::MAX_PATH_BYTES as u64) * 6 + 64;
    let files = (limits.max_returned_bytes() / 3 + 1)
        .saturating_mul(4)
        .saturating_add(u64::from(limits.max_files()).saturating_mul(per_file));
    let result = limits
        .max_value_bytes()
        .saturating_mul(2)
        .saturating_add(limits.max_output_bytes().saturating_mul(12))
        .saturating_add(files);
    call.max(result)
        .saturating_add(FRAME_SLACK_BYTES)
        .min(u64::from(u32::MAX))
}

/// Checks a frame's length prefix against the cap, before any of the body is read.
///
/// # Errors
///
/// A `limit-exceeded` [`ProtocolError`] when the frame is larger than `cap` (a byte cap was
/// reached, as the broker would say of arguments over theirs).
pub fn check_frame_len(header: [u8; FRAME_HEADER_BYTES], cap: u64) -> Result<usize, ProtocolError> {
    let len = u32::from_be_bytes(header);
    let too_large = || ProtocolError {
        kind: WireErrorKind::LimitExceeded,
        id: None,
        message: format!("the frame is {len} bytes; the limit is {cap}"),
    };
    if u64::from(len) > cap {
        return Err(too_large());
    }
    usize::try_from(len).map_err(|_| too_large())
}

/// Prefixes a body with its length. Bodies of 4 GiB or more are cut to an empty frame (the
/// encoders here never produce them).
pub fn frame(body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap_or(0);
    let body = if len == 0 { &[][..] } else { body };
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// One decoded request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A tool call.
    Call(CallRequest),
    /// The guest's final outcome.
    Result {
        /// The request id.
        id: u64,
        /// How the run ended.
        outcome: Outcome,
    },
    /// A session's guest asks for its next run (answered when the host has one).
    Next {
        /// The request id.
        id: u64,
    },
}

impl Request {
    /// The request's id.
    pub fn id(&self) -> u64 {
        match self {
            Request::Call(call) => call.id,
            Request::Result { id, .. } | Request::Next { id } => *id,
        }
    }
}

/// A tool call as the guest sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRequest {
    /// The request id, echoed in the response.
    pub id: u64,
    /// The tool's name (bare, or qualified when no namespace is given).
    pub name: String,
    /// The namespace, when the guest gave one.
    pub namespace: Option<String>,
    /// The arguments object: the JSON text the guest sent, not parsed here (the broker checks
    /// its size, then parses it).
    pub arguments: String,
}

impl CallRequest {
    /// The name the broker resolves: `namespace.name` when a namespace was given.
    pub fn tool_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// How a guest's run ended, as it reports it. Untrusted: the host checks the value's size
/// and validity, and which failure kinds a guest may claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The return value's JSON text, or why there is none.
    pub value: Result<String, RunError>,
    /// What a layered worker adds: the guest's captured output and fuel.
    pub report: Option<WorkerReport>,
}

/// What a layered worker reports besides the value: it runs the wasm engine, so it holds the
/// guest's captured output and the fuel consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerReport {
    /// The guest's stdout, as captured (head and tail within the cap).
    pub stdout: String,
    /// The guest's stderr, as captured.
    pub stderr: String,
    /// True when stdout was cut.
    pub stdout_truncated: bool,
    /// True when stderr was cut.
    pub stderr_truncated: bool,
    /// Fuel consumed.
    pub fuel_consumed: Option<u64>,
    /// The files the guest produced (made and read back inside the worker's sandbox).
    #[serde(default)]
    pub files: Vec<crate::OutputFile>,
}

/// One run of a session, as the host answers a guest's `next` request: the JSON text of
/// the response's `result_json`.
///
/// ```json
/// {"code": "x += 1", "request_json": "{…, \"session\": true}", "max_args_bytes": 1048576,
///  "marker": "…"}
/// ```
///
/// `marker` is the run's end-of-output marker: after the run, the guest writes it to its
/// stdout and its stderr, and the host takes what came before it as the run's output. (The
/// code can read it too: it can only mislabel its own output, which the host caps either
/// way.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionJob {
    /// The Python source.
    pub code: String,
    /// The runner's request (variables, tools, value cap, `"session": true`).
    pub request_json: String,
    /// The run's cap on one call's arguments.
    pub max_args_bytes: u64,
    /// The run's end-of-output marker.
    pub marker: String,
}

impl SessionJob {
    /// The job as the text of a `next` response's `result_json`.
    pub fn encode(&self) -> String {
        // A struct of strings and an integer always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A response to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The call succeeded (or the result was accepted: `result_json` is `null`).
    Ok {
        /// The request id.
        id: u64,
        /// The tool's result as JSON text.
        result_json: String,
    },
    /// The request was refused or failed.
    Err {
        /// The request id; `None` when it could not be read.
        id: Option<u64>,
        /// Why.
        kind: WireErrorKind,
        /// A short message, safe to show to the guest.
        message: String,
    },
}

/// The error kinds of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireErrorKind {
    /// No exposed tool has that name.
    NotFound,
    /// The arguments do not fit the tool.
    InvalidArguments,
    /// The policy refuses the call, or the run is over.
    Denied,
    /// The tool failed.
    Failed,
    /// The call ceiling or a byte cap was reached.
    LimitExceeded,
    /// The frame's token is missing or wrong.
    Unauthorized,
    /// The frame is malformed.
    BadRequest,
}

impl WireErrorKind {
    /// The kind's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            WireErrorKind::NotFound => "not-found",
            WireErrorKind::InvalidArguments => "invalid-arguments",
            WireErrorKind::Denied => "denied",
            WireErrorKind::Failed => "failed",
            WireErrorKind::LimitExceeded => "limit-exceeded",
            WireErrorKind::Unauthorized => "unauthorized",
            WireErrorKind::BadRequest => "bad-request",
        }
    }

    /// The kind for a wire name.
    pub fn parse(name: &str) -> Option<WireErrorKind> {
        [
            WireErrorKind::NotFound,
            WireErrorKind::InvalidArguments,
            WireErrorKind::Denied,
            WireErrorKind::Failed,
            WireErrorKind::LimitExceeded,
            WireErrorKind::Unauthorized,
            WireErrorKind::BadRequest,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }
}

impl fmt::Display for WireErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a frame was refused: answered to the peer as a `bad-request`, `unauthorized` or (for a
/// frame over the cap) `limit-exceeded` response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// `BadRequest`, `Unauthorized` or `LimitExceeded`.
    pub kind: WireErrorKind,
    /// The request's id, when it could be read.
    pub id: Option<u64>,
    /// A short message for the peer.
    pub message: String,
}

impl ProtocolError {
    /// A `bad-request` error.
    pub fn bad_request(id: Option<u64>, message: impl Into<String>) -> Self {
        ProtocolError {
            kind: WireErrorKind::BadRequest,
            id,
            message: message.into(),
        }
    }

    fn unauthorized() -> Self {
        ProtocolError {
            kind: WireErrorKind::Unauthorized,
            id: None,
            message: "the frame's token is missing or wrong".into(),
        }
    }

    /// The response that answers this error.
    pub fn response(&self) -> Response {
        Response::Err {
            id: self.id,
            kind: self.kind,
            message: self.message.clone(),
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ProtocolError {}

/// Decodes one request body, checking its token first.
///
/// The order is fixed: the body must be a JSON object; then its `token` must match
/// `expected` (otherwise `unauthorized`, and no other field is looked at); then every other
/// field is checked. A call's `arguments` are kept as the text the guest sent, unparsed: the
/// broker checks their size before it parses them, by the same rules as on every backend.
/// Fields are split without recursion, so a deeply nested frame costs no stack here.
///
/// # Errors
///
/// A [`ProtocolError`] naming the first problem.
pub fn decode_request(body: &[u8], expected: &Token) -> Result<Request, ProtocolError> {
    let mut fields: Fields<'_> = serde_json::from_slice(body).map_err(|e| {
        let message = match e.classify() {
            serde_json::error::Category::Data => "the frame is not a JSON object",
            _ => "the frame is not valid JSON",
        };
        ProtocolError::bad_request(None, message)
    })?;
    match field::<String>(fields.remove("token")) {
        Ok(Some(t)) if expected.matches(&t) => {}
        _ => return Err(ProtocolError::unauthorized()),
    }
    let id = match field::<u64>(fields.remove("id")) {
        Ok(Some(id)) => id,
        Ok(None) => return Err(ProtocolError::bad_request(None, "`id` is missing")),
        Err(()) => {
            return Err(ProtocolError::bad_request(
                None,
                "`id` must be a non-negative integer",
            ));
        }
    };
    let bad = |message: String| ProtocolError::bad_request(Some(id), message);
    let method = required::<String>(fields.remove("method"), "method", "a string").map_err(bad)?;
    let request = match method.as_str() {
        "call" => Request::Call(decode_call(id, &mut fields).map_err(bad)?),
        "result" => {
            let outcome = match fields.remove("outcome") {
                Some(raw) => match pycage_tools::json::parse(raw.get().as_bytes(), OUTCOME_DEPTH) {
                    Ok(Value::Object(o)) => decode_outcome(o).map_err(bad)?,
                    Ok(_) => return Err(bad("`outcome` must be an object".into())),
                    Err(e) => return Err(bad(format!("in `outcome`, {e}"))),
                },
                None => return Err(bad("`outcome` is missing".into())),
            };
            Request::Result { id, outcome }
        }
        "next" => Request::Next { id },
        other => return Err(bad(format!("unknown method `{}`", printable(other)))),
    };
    reject_unknown(fields.keys()).map_err(bad)?;
    Ok(request)
}

/// A request's fields, each as its raw JSON text.
type Fields<'a> = std::collections::BTreeMap<String, &'a RawValue>;

/// How deep an outcome nests: the outcome, its worker report, the report's list of files, and
/// each file.
const OUTCOME_DEPTH: usize = 4;

/// A field's value read as `T`: `Ok(None)` when absent, `Err(())` when of another type.
fn field<T: serde::de::DeserializeOwned>(raw: Option<&RawValue>) -> Result<Option<T>, ()> {
    raw.map(|raw| serde_json::from_str(raw.get()).map_err(|_| ()))
        .transpose()
}

/// A field that must be present and of type `T` (`what` says which type, for the message).
fn required<T: serde::de::DeserializeOwned>(
    raw: Option<&RawValue>,
    name: &str,
    what: &str,
) -> Result<T, String> {
    match field(raw) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(format!("`{name}` is missing")),
        Err(()) => Err(format!("`{name}` must be {what}")),
    }
}

fn decode_call(id: u64, fields: &mut Fields<'_>) -> Result<CallRequest, String> {
    let name = required::<String>(fields.remove("name"), "name", "a string")?;
    let namespace = field::<String>(fields.remove("namespace"))
        .map_err(|()| "`namespace` must be a string".to_owned())?;
    let arguments = match fields.remove("arguments") {
        Some(raw) if raw.get().starts_with('{') => raw.get().to_owned(),
        Some(_) => return Err("`arguments` must be an object".into()),
        None => return Err("`arguments` is missing".into()),
    };
    Ok(CallRequest {
        id,
        name,
        namespace,
        arguments,
    })
}

fn decode_outcome(mut o: Map<String, Value>) -> Result<Outcome, String> {
    let ok = match o.remove("ok") {
        Some(Value::Bool(ok)) => ok,
        _ => return Err("`outcome.ok` must be a boolean".into()),
    };
    let report = match o.remove("report") {
        None | Some(Value::Null) => None,
        Some(r) => Some(
            serde_json::from_value::<WorkerReport>(r)
                .map_err(|_| "`outcome.report` is malformed".to_owned())?,
        ),
    };
    let value = if ok {
        match o.remove("value_json") {
            Some(Value::String(v)) => Ok(v),
            _ => return Err("`outcome.value_json` must be a string".into()),
        }
    } else {
        let kind = match o.remove("kind") {
            Some(Value::String(k)) => kind_from_wire(&k)
                .ok_or_else(|| format!("unknown failure kind `{}`", printable(&k)))?,
            _ => return Err("`outcome.kind` must be a string".into()),
        };
        let message = match o.remove("message") {
            Some(Value::String(m)) => m,
            _ => return Err("`outcome.message` must be a string".into()),
        };
        let optional = |v: Option<Value>, field: &str| match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(format!("`outcome.{field}` must be a string or null")),
        };
        Err(RunError {
            kind,
            message,
            traceback: optional(o.remove("traceback"), "traceback")?,
            exception: optional(o.remove("exception"), "exception")?,
        })
    };
    reject_unknown(o.keys()).map_err(|e| format!("in `outcome`: {e}"))?;
    Ok(Outcome { value, report })
}

fn reject_unknown<'a>(mut keys: impl Iterator<Item = &'a String>) -> Result<(), String> {
    match keys.next() {
        None => Ok(()),
        Some(key) => Err(format!("unknown field `{}`", printable(key))),
    }
}

/// A failure kind's wire name: the [`ErrorKind`] name with hyphens (`guest-exception`).
pub fn kind_to_wire(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Timeout => "timeout",
        ErrorKind::FuelExhausted => "fuel-exhausted",
        ErrorKind::MemoryLimit => "memory-limit",
        ErrorKind::StackOverflow => "stack-overflow",
        ErrorKind::ToolCallLimit => "tool-call-limit",
        ErrorKind::ValueTooLarge => "value-too-large",
        ErrorKind::GuestException => "guest-exception",
        ErrorKind::SyntaxError => "syntax-error",
        ErrorKind::InvalidInput => "invalid-input",
        ErrorKind::CapabilityDenied => "capability-denied",
        ErrorKind::BackendError => "backend-error",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::SessionEnded => "session-ended",
        ErrorKind::SessionBusy => "session-busy",
        ErrorKind::SessionNotFound => "session-not-found",
        ErrorKind::TooManySessions => "too-many-sessions",
        ErrorKind::Busy => "busy",
        ErrorKind::Suspended => "suspended",
        ErrorKind::ReplayDiverged => "replay-diverged",
    }
}

/// The [`ErrorKind`] for a failure kind's wire name.
pub fn kind_from_wire(name: &str) -> Option<ErrorKind> {
    [
        ErrorKind::Timeout,
        ErrorKind::FuelExhausted,
        ErrorKind::MemoryLimit,
        ErrorKind::StackOverflow,
        ErrorKind::ToolCallLimit,
        ErrorKind::ValueTooLarge,
        ErrorKind::GuestException,
        ErrorKind::SyntaxError,
        ErrorKind::InvalidInput,
        ErrorKind::CapabilityDenied,
        ErrorKind::BackendError,
    ]
    .into_iter()
    .find(|k| kind_to_wire(*k) == name)
}

/// Encodes a response body (without the length prefix).
pub fn encode_response(response: &Response) -> Vec<u8> {
    let value = match response {
        Response::Ok { id, result_json } => {
            json!({"id": id, "ok": true, "result_json": result_json})
        }
        Response::Err { id, kind, message } => json!({
            "id": id,
            "ok": false,
            "error": {"kind": kind.as_str(), "message": message},
        }),
    };
    value.to_string().into_bytes()
}

/// Decodes a response body (the client side: a worker, or a test).
///
/// # Errors
///
/// A `bad-request` [`ProtocolError`] when the body is not a well-formed response.
pub fn decode_response(body: &[u8]) -> Result<Response, ProtocolError> {
    let bad = |m: &str| ProtocolError::bad_request(None, m);
    let value: Value =
        serde_json::from_slice(body).map_err(|_| bad("the response is not valid JSON"))?;
    let Value::Object(obj) = value else {
        return Err(bad("the response is not a JSON object"));
    };
    let id = match obj.get("id") {
        Some(Value::Null) | None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| bad("`id` must be an integer"))?),
    };
    match obj.get("ok") {
        Some(Value::Bool(true)) => {
            let id = id.ok_or_else(|| bad("a successful response needs an id"))?;
            let result_json = obj
                .get("result_json")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("`result_json` must be a string"))?
                .to_owned();
            Ok(Response::Ok { id, result_json })
        }
        Some(Value::Bool(false)) => {
            let error = obj
                .get("error")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("`error` must be an object"))?;
            let kind = error
                .get("kind")
                .and_then(Value::as_str)
                .and_then(WireErrorKind::parse)
                .ok_or_else(|| bad("`error.kind` is not a known kind"))?;
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Ok(Response::Err { id, kind, message })
        }
        _ => Err(bad("`ok` must be a boolean")),
    }
}

/// Encodes a call request body. `arguments` goes into the frame as it is: the text the guest
/// wrote, so nothing in it is parsed and re-encoded on the way.
pub fn encode_call(
    token: &str,
    id: u64,
    name: &str,
    namespace: Option<&str>,
    arguments: &RawValue,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct Call<'a> {
        token: &'a str,
        id: u64,
        method: &'static str,
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        arguments: &'a RawValue,
    }
    let call = Call {
        token,
        id,
        method: "call",
        name,
        namespace,
        arguments,
    };
    // Serializing strings, an integer and text that is already JSON cannot fail.
    serde_json::to_vec(&call).unwrap_or_default()
}

/// Encodes a result request body.
pub fn encode_result(token: &str, id: u64, outcome: &Outcome) -> Vec<u8> {
    let mut o = Map::new();
    match &outcome.value {
        Ok(value_json) => {
            o.insert("ok".into(), true.into());
            o.insert("value_json".into(), value_json.as_str().into());
        }
        Err(e) => {
            o.insert("ok".into(), false.into());
            o.insert("kind".into(), kind_to_wire(e.kind).into());
            o.insert("message".into(), e.message.as_str().into());
            o.insert("traceback".into(), e.traceback.clone().into());
            o.insert("exception".into(), e.exception.clone().into());
        }
    }
    if let Some(report) = &outcome.report {
        o.insert(
            "report".into(),
            serde_json::to_value(report).unwrap_or(Value::Null),
        );
    }
    json!({"token": token, "id": id, "method": "result", "outcome": Value::Object(o)})
        .to_string()
        .into_bytes()
}

/// A peer-supplied text made safe for messages: control characters escaped, at most 64
/// characters.
fn printable(text: &str) -> String {
    let mut out: String = text.chars().take(64).flat_map(char::escape_debug).collect();
    if text.chars().nth(64).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;

//! A run's input, parsed once for both servers: `POST /v1/runs`'s body and `run_python`'s
//! arguments are the same JSON object.
//!
//! | field | what |
//! |---|---|
//! | `code` | the Python source (required) |
//! | `vars` | global variables set before the code runs |
//! | `files` | relative path → content: text, or base64 with `files_base64` |
//! | `files_base64` | whether `files` holds base64 (HTTP's default) or text (MCP's default) |
//! | `limits` | see [`clamp::apply`] |
//! | `net_allow` | narrows `net.fetch` to some of the server's `[net] allow` patterns |
//! | `session_id` | runs in that session (MCP; HTTP names it in the path) |
//!
//! `code`, `vars` and text `files` are the library's ([`Description::parse_input`]); the
//! rest are the servers'.

use base64::Engine as _;
use pycage::{Description, ErrorKind, InputFile, RunError, RunRequest, SessionId};
use serde_json::{Map, Value};

use crate::clamp::{self, Clamped};
use crate::service::{Replacements, Service};

/// What is wrong with a request's input; nothing ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputError {
    /// The input is malformed: not an object, a field unknown or of the wrong type (HTTP's
    /// 400 `invalid_input`).
    Input(String),
    /// Its `limits` are (HTTP's 422 `invalid_limits`).
    Limits(String),
}

impl InputError {
    /// What is wrong, naming the field.
    pub fn message(&self) -> &str {
        match self {
            InputError::Input(why) | InputError::Limits(why) => why,
        }
    }
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for InputError {}

impl From<InputError> for RunError {
    /// As a run's error, where a protocol has no other place for it (MCP's tool result).
    fn from(error: InputError) -> Self {
        RunError::new(ErrorKind::InvalidInput, error.message())
    }
}

/// How a server reads `files` when the input does not say (`files_base64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FilesAs {
    /// UTF-8 text (MCP: what a model writes).
    Text,
    /// Base64 (HTTP: any bytes).
    Base64,
}

/// One run's parsed input.
pub(crate) struct RunInput {
    /// The request, with its limits within the maxima and `net.fetch` narrowed.
    pub request: RunRequest,
    /// The limits lowered to the maxima.
    pub clamped: Vec<Clamped>,
    /// The tools that replace exposed ones for this run (kept with it if it suspends).
    pub replacements: Replacements,
    /// The session it names.
    pub session: Option<SessionId>,
}

/// Parses `input` (see the [module docs](self)): the library's fields by `description`, the
/// limits over `service`'s defaults within its maxima, `net_allow` by its `[net]` table.
///
/// # Errors
///
/// [`InputError`] naming the field.
pub(crate) fn parse(
    service: &Service,
    description: &Description,
    input: &Value,
    files_as: FilesAs,
) -> Result<RunInput, InputError> {
    let bad = InputError::Input;
    let mut object = input
        .as_object()
        .ok_or_else(|| bad("the input must be a JSON object".into()))?
        .clone();
    let session = match object.remove("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(SessionId::from(id.as_str())),
        Some(_) => return Err(bad("`session_id` must be a string".into())),
    };
    // Null is absent, as for every optional field here (HTTP's `net_allow` was an
    // `Option` before the one parser).
    let net_allow = object.remove("net_allow").filter(|v| !v.is_null());
    let limits = object.remove("limits");
    let base64 = match object.remove("files_base64") {
        None | Some(Value::Null) => files_as == FilesAs::Base64,
        Some(Value::Bool(base64)) => base64,
        Some(_) => return Err(bad("`files_base64` must be a boolean".into())),
    };
    let encoded = match object.get("files") {
        Some(files) if base64 && !files.is_null() => {
            if !description.environment().input_files {
                return Err(bad(
                    "this sandbox takes no input files (the input has no field `files`)".into(),
                ));
            }
            let files = decode_files(files)?;
            object.remove("files");
            files
        }
        _ => Vec::new(),
    };
    let request = description
        .parse_input(&Value::Object(object))
        .map_err(|e| bad(e.message))?
        .files(encoded);
    let (request, replacements) = service.narrow(request, net_allow.as_ref()).map_err(bad)?;
    let (limits, clamped) =
        clamp::apply(service.runner.limits(), &service.maxima, limits.as_ref())?;
    Ok(RunInput {
        request: request.limits(limits),
        clamped,
        replacements,
        session,
    })
}

/// `files` as base64: each value decoded.
fn decode_files(files: &Value) -> Result<Vec<InputFile>, InputError> {
    let map: &Map<String, Value> = files
        .as_object()
        .ok_or_else(|| InputError::Input("`files` must be an object".into()))?;
    map.iter()
        .map(|(path, text)| {
            let bytes = text
                .as_str()
                .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                .ok_or_else(|| {
                    InputError::Input(format!(
                        "file `{}`: its content must be base64 text (or set `files_base64`: \
                         false for UTF-8 text)",
                        path.escape_debug()
                    ))
                })?;
            Ok(InputFile::new(path.clone(), bytes))
        })
        .collect()
}

#[cfg(test)]
#[path = "input_tests.rs"]
mod tests;

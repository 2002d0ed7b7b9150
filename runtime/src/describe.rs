//! [`Description`]: the text and the input schema a host gives a language model for a
//! `run_python` tool, generated from a [`Runner`]'s live configuration.
//!
//! Nothing in it is written by hand: the Python version, the modules that do not import,
//! whether subprocesses, threads, the network and files work are asked of the runner's own
//! backend by a probe run (once per runner, then cached); the tools and their signatures come
//! from the runner's exposed tools, the limits from its limits.
//!
//! ```no_run
//! # async fn demo(runner: pycage::Runner) -> Result<(), pycage::DescribeError> {
//! let description = runner.description().await?;
//! let tool = serde_json::json!({
//!     "name": description.name(),
//!     "description": description.text(),
//!     "input_schema": description.input_schema(),
//! });
//! # let _ = tool;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::policy::ExposedTools;
use crate::{ErrorKind, InputFile, Limits, RunError, RunRequest, Runner};

mod probe;
mod signature;
mod text;

pub use probe::{Environment, PROBED_PACKAGES, STDLIB_MODULES};

/// The tool name a description gives by default.
pub const DEFAULT_TOOL_NAME: &str = "run_python";

/// Whether what a call leaves behind is there for the next call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Persistence {
    /// Every call runs in a fresh sandbox: nothing persists (the default).
    #[default]
    OneShot,
    /// The calls share one session: globals, imports and files persist until it ends.
    Session,
    /// A call runs fresh unless it names a session (a server's `create_session` makes
    /// one, and a call passing its `session_id` runs in it).
    OnRequest,
}

/// Why a [`Description`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DescribeError {
    /// The probe run through the backend failed.
    Probe {
        /// The backend that ran the probe.
        backend: String,
        /// Why the probe produced no answer.
        error: RunError,
    },
    /// The probe ran, but its answer is not one the probe gives (the guest environment is
    /// not what it should be).
    Malformed(String),
}

impl fmt::Display for DescribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DescribeError::Probe { backend, error } => {
                write!(f, "probing backend `{backend}` failed: {error}")
            }
            DescribeError::Malformed(what) => write!(f, "{what} is malformed"),
        }
    }
}

impl std::error::Error for DescribeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DescribeError::Probe { error, .. } => Some(error),
            DescribeError::Malformed(_) => None,
        }
    }
}

impl Runner {
    /// A description of this runner for a language model's `run_python` tool: the text and
    /// the input schema (see [`Description`]). Await the builder (or call
    /// [`DescriptionBuilder::build`]) to get it.
    ///
    /// The first description of a runner runs a fixed probe snippet through its backend
    /// (with default limits, and one small input file where the backend takes files), and
    /// caches what it found for the runner's life; a failed probe is not cached.
    pub fn description(&self) -> DescriptionBuilder {
        DescriptionBuilder {
            runner: self.clone(),
            persistence: Persistence::OneShot,
            limits: None,
            name: DEFAULT_TOOL_NAME.to_owned(),
        }
    }
}

/// Chooses what a [`Description`] describes; from [`Runner::description`].
#[derive(Debug, Clone)]
#[must_use]
pub struct DescriptionBuilder {
    runner: Runner,
    persistence: Persistence,
    limits: Option<Limits>,
    name: String,
}

impl DescriptionBuilder {
    /// Describes calls that share a session (`true`) or run one-shot (`false`, the default).
    pub fn session(self, session: bool) -> Self {
        self.persistence(if session {
            Persistence::Session
        } else {
            Persistence::OneShot
        })
    }

    /// Describes calls with this persistence.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Describes runs with these limits instead of the runner's (for a host that passes its
    /// own in each [`RunRequest`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// The tool's name for the model; [`DEFAULT_TOOL_NAME`] by default.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Probes the backend (once per runner) and makes the description.
    ///
    /// # Errors
    ///
    /// [`DescribeError`] when the probe run fails or its answer is malformed.
    pub async fn build(self) -> Result<Description, DescribeError> {
        let mut environment = self
            .runner
            .environment_cell()
            .get_or_try_init(|| async { probe::probe(&self.runner).await.map(Arc::new) })
            .await?
            .as_ref()
            .clone();
        environment.packages = self.runner.backend().packages();
        let limits = self.limits.unwrap_or_else(|| self.runner.limits().clone());
        Ok(Description::new(
            self.name,
            self.runner.backend().name(),
            self.runner.backend().provides_isolation(),
            self.persistence,
            environment,
            limits,
            self.runner.exposed_tools(),
        ))
    }
}

impl IntoFuture for DescriptionBuilder {
    type Output = Result<Description, DescribeError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.build())
    }
}

/// What a model is told about a `run_python` tool: [`text`](Self::text) for the tool's
/// description and [`input_schema`](Self::input_schema) for its input. Serialized (for
/// `pycage describe --json`) as one object: `name`, `description` (the text),
/// `input_schema`, and the facts the text was made from: `backend`, `isolation`,
/// `persistence`, `environment`, `limits`, `tools`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Description {
    name: String,
    #[serde(rename = "description")]
    text: String,
    input_schema: Value,
    backend: String,
    isolation: bool,
    persistence: Persistence,
    environment: Environment,
    limits: Limits,
    tools: Vec<ToolSignature>,
}

/// One exposed tool as the code calls it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ToolSignature {
    /// `namespace.name`, which `call_tool` takes.
    pub qualified: String,
    /// The async function's name in the globals; `None` when the bare name is ambiguous and
    /// only `call_tool` reaches the tool.
    pub binding: Option<String>,
    /// The Python signature: `async def add(*, a: float | str, b: float | str)` (named
    /// `namespace.name` when the bare name is ambiguous).
    pub signature: String,
    /// The tool's one-line description.
    pub description: String,
    /// The JSON schema of its arguments object.
    pub parameters: Value,
    /// True when a call of it waits for a person's approval.
    pub needs_approval: bool,
}

impl Description {
    fn new(
        name: String,
        backend: &str,
        isolation: bool,
        persistence: Persistence,
        environment: Environment,
        limits: Limits,
        exposed: &ExposedTools,
    ) -> Self {
        let tools: Vec<ToolSignature> = exposed
            .bindings()
            .iter()
            .map(|b| {
                let function = b.binding.as_deref().unwrap_or(&b.qualified);
                ToolSignature {
                    qualified: b.qualified.clone(),
                    binding: b.binding.clone(),
                    signature: signature::signature(function, &b.parameters),
                    description: b.description.clone(),
                    parameters: b.parameters.clone(),
                    needs_approval: b.needs_approval,
                }
            })
            .collect();
        let text = text::render(&text::Facts {
            persistence,
            environment: &environment,
            limits: &limits,
            tools: &tools,
        });
        let input_schema = input_schema(&environment);
        Description {
            name,
            text,
            input_schema,
            backend: backend.to_owned(),
            isolation,
            persistence,
            environment,
            limits,
            tools,
        }
    }

    /// The tool's name (`run_python`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text for the model: Markdown saying what the code finds, how to call tools, what
    /// comes back, what persists and every limit with its value.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The JSON schema of the tool's input: `code` (required), `vars`, and `files` where the
    /// backend takes input files.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    /// The tool definition in the shape model APIs and MCP take: `name`, `description`,
    /// `input_schema`.
    pub fn tool_definition(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.text,
            "input_schema": self.input_schema,
        })
    }

    /// What the probe found.
    pub fn environment(&self) -> &Environment {
        &self.environment
    }

    /// The limits described.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The exposed tools, ordered by qualified name.
    pub fn tools(&self) -> &[ToolSignature] {
        &self.tools
    }

    /// Whether calls share a session.
    pub fn persistence(&self) -> Persistence {
        self.persistence
    }

    /// The backend's name.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The request a model's tool input asks for, read by the schema it was given
    /// ([`input_schema`](Self::input_schema)): `code`, `vars` and (where the schema has it)
    /// `files`, each file's text as its bytes. The request carries the described limits, so
    /// the run gets the limits the model was told.
    ///
    /// # Errors
    ///
    /// An `invalid_input` [`RunError`] naming what does not fit the schema: not an object,
    /// no `code` string, `vars` or `files` of the wrong type, or another key.
    pub fn parse_input(&self, input: &Value) -> Result<RunRequest, RunError> {
        let invalid = |why: String| RunError::new(ErrorKind::InvalidInput, why);
        let object = input
            .as_object()
            .ok_or_else(|| invalid("the tool input must be a JSON object".into()))?;
        let takes_files = self.environment.input_files;
        let known = |key: &str| match key {
            "code" | "vars" => true,
            "files" => takes_files,
            _ => false,
        };
        if let Some(key) = object.keys().find(|k| !known(k)) {
            return Err(invalid(format!(
                "the tool input has no field `{}`",
                key.escape_debug()
            )));
        }
        let code = object
            .get("code")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("the tool input needs `code`, a string".into()))?;
        let mut request = RunRequest::new(code).limits(self.limits.clone());
        match object.get("vars") {
            None | Some(Value::Null) => {}
            Some(Value::Object(vars)) => request = request.vars(vars.clone()),
            Some(_) => return Err(invalid("`vars` must be an object".into())),
        }
        match object.get("files") {
            None | Some(Value::Null) => {}
            Some(Value::Object(files)) => {
                for (path, text) in files {
                    let text = text.as_str().ok_or_else(|| {
                        invalid(format!(
                            "file `{}`: its content must be a string",
                            path.escape_debug()
                        ))
                    })?;
                    request = request.file(InputFile::new(path.clone(), text.as_bytes().to_vec()));
                }
            }
            Some(_) => return Err(invalid("`files` must be an object".into())),
        }
        Ok(request)
    }
}

fn input_schema(environment: &Environment) -> Value {
    let mut properties = json!({
        "code": {
            "type": "string",
            "description": "The Python code to run. Top-level `await` and `return` are allowed; \
                            the returned value is the result, as JSON.",
        },
        "vars": {
            "type": "object",
            "description": "Global variables set before the code runs: each name a Python \
                            identifier (not starting with `__`), each value any JSON.",
        },
    });
    if environment.input_files
        && let Some(map) = properties.as_object_mut()
    {
        map.insert(
            "files".into(),
            json!({
                "type": "object",
                "description": format!(
                    "Input files placed in the working directory ({}) before the code runs: \
                     each key a relative path (`data.csv`, `in/a.json`), each value the file's \
                     text (UTF-8).",
                    environment.working_directory
                ),
                "additionalProperties": { "type": "string" },
            }),
        );
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": ["code"],
        "additionalProperties": false,
    })
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;

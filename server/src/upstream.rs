//! Code mode: the tools of other MCP servers ("upstreams") as tools the code can call.
//!
//! pycage is an MCP client of each configured upstream. At start it connects and lists the
//! upstream's tools; each becomes a [`Tool`] in the namespace named after the upstream, so
//! the code calls `await fs.read_file(path=...)` (or `call_tool("fs.read_file", ...)`) and
//! every call passes the run's broker like any other tool: allowlist (deny by default), call
//! ceiling, byte caps, per-call timeout, audit event.
//!
//! An upstream that exits, closes its connection, answers garbage or does not answer within
//! its `timeout` fails that call with a tool error of kind `failed`; its connection is
//! dropped (the child killed) and the next call starts it again. After `max_restarts` starts
//! in a row that fail, the upstream is down: calls fail at once until the server restarts.
//! Starts and failures are logged on `pycage::audit`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use pycage_tools::{Args, Tool, ToolError, ToolFuture, ToolRegistry, is_valid_name};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One upstream MCP server, as `[[upstream]]` in the config file or `--upstream` declares it.
///
/// ```toml
/// [[upstream]]
/// name = "fs"
/// command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
/// timeout = "30s"
///
/// [[upstream]]
/// name = "search"
/// url = "http://127.0.0.1:9000/mcp"   # a running server, over streamable HTTP
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The namespace its tools take in the code: an identifier (`fs` gives `fs.read_file`).
    pub name: String,
    /// The program and its arguments, started as a child speaking MCP on stdio. A relative
    /// program path holding a `/` is resolved against the config file's directory; a bare
    /// name is looked up on `PATH`. Either this or `url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The endpoint of a running server speaking streamable HTTP (`http://host:port/mcp`).
    /// Either this or `command`. Only `http`: this build has no TLS client, so an `https`
    /// URL is refused when the configuration is read (a local TLS-terminating proxy, or the
    /// server started as a `command`, are the ways to such a server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Variables set in the child's environment; with `command`. The child does not inherit
    /// pycage's environment: only `PATH`, `HOME`, the locale and the like
    /// ([`INHERITED_ENV`](pycage_tools::process::INHERITED_ENV)), what `pass_env` names, and
    /// these.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of pycage's own environment the child gets too (`["GITHUB_TOKEN"]`); with
    /// `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// How long one call (or the start) may take before the upstream counts as hung
    /// (default 60 s). The run's per-call timeout applies too; the smaller wins.
    #[serde(
        default = "default_timeout",
        with = "pycage_tools::units::duration_text"
    )]
    pub timeout: Duration,
    /// Starts in a row that may fail before the upstream is given up (default 3).
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
}

fn default_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_restarts() -> u32 {
    3
}

impl UpstreamConfig {
    /// An upstream started as `command` (program first), with the default timeout and
    /// restarts.
    pub fn command(name: impl Into<String>, command: Vec<String>) -> Self {
        UpstreamConfig {
            name: name.into(),
            command,
            url: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            timeout: default_timeout(),
            max_restarts: default_max_restarts(),
        }
    }

    /// An upstream reached at `url` over streamable HTTP, with the default timeout and
    /// restarts.
    pub fn url(name: impl Into<String>, url: impl Into<String>) -> Self {
        UpstreamConfig {
            url: Some(url.into()),
            ..Self::command(name, Vec::new())
        }
    }

    /// Parses `NAME=URL` for an `http://` or `https://` value, else `NAME=COMMAND ARGS...`
    /// (the `--upstream` flag): the command is split as a
    /// POSIX shell would split it, without running a shell.
    ///
    /// # Errors
    ///
    /// A message saying what is malformed.
    pub fn parse_flag(flag: &str) -> Result<Self, String> {
        let (name, command) = flag
            .split_once('=')
            .ok_or_else(|| format!("`{flag}`: expected NAME='COMMAND ARGS...'"))?;
        let value = command.trim();
        let config = if value.starts_with("http://") || value.starts_with("https://") {
            Self::url(name.trim(), value)
        } else {
            let words = shell_words::split(command).map_err(|e| format!("`{flag}`: {e}"))?;
            Self::command(name.trim(), words)
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the name and the command.
    ///
    /// # Errors
    ///
    /// A message naming the upstream and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !is_valid_name(&self.name) {
            return Err(format!(
                "upstream `{}`: the name must be an identifier (letters, digits, `_`; not a \
                 keyword): it is the namespace of its tools in the code",
                self.name
            ));
        }
        match (&self.url, self.command.is_empty()) {
            (Some(_), false) => {
                return Err(format!(
                    "upstream `{}`: give either `command` or `url`, not both",
                    self.name
                ));
            }
            (Some(url), true) => {
                check_url(url).map_err(|e| format!("upstream `{}`: {e}", self.name))?
            }
            (None, _) => {
                if self.command.first().is_none_or(String::is_empty) {
                    return Err(format!(
                        "upstream `{}`: the command is empty (give `command` or `url`)",
                        self.name
                    ));
                }
            }
        }
        if self.url.is_some() && !(self.env.is_empty() && self.pass_env.is_empty()) {
            return Err(format!(
                "upstream `{}`: `env` and `pass_env` are for a `command`; a `url` upstream \
                 runs elsewhere",
                self.name
            ));
        }
        if self.timeout.is_zero() {
            return Err(format!("upstream `{}`: timeout must be above 0", self.name));
        }
        Ok(())
    }

    /// Resolves a relative program path holding a `/` against `base`.
    pub(crate) fn resolve_against(&mut self, base: &Path) {
        if let Some(program) = self.command.first_mut()
            && program.contains('/')
            && Path::new(program.as_str()).is_relative()
        {
            *program = base.join(program.as_str()).to_string_lossy().into_owned();
        }
    }
}

/// Checks a `url` upstream's endpoint: `http://` with a host.
fn check_url(url: &str) -> Result<(), String> {
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{url}`: https is not supported (this build has no TLS client); reach the \
                 server through a local proxy, or start it as a `command`"
            ));
        }
        _ => return Err(format!("`{url}`: the URL must start with http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{url}`: the URL has no host"));
    }
    Ok(())
}

/// Why an upstream could not be used at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    /// The upstream's name.
    pub name: String,
    /// What went wrong.
    pub reason: String,
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upstream `{}`: {}", self.name, self.reason)
    }
}

impl std::error::Error for UpstreamError {}

type Client = RunningService<RoleClient, ()>;

/// A connection to one upstream, started again on the next call after it fails.
pub struct Upstream {
    config: UpstreamConfig,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    client: Option<Client>,
    /// Counts the connections made, so a failure drops only the connection it happened on.
    generation: u64,
    failed_starts: u32,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// Starts the upstream, lists its tools and registers each in `registry` under the
    /// upstream's name. A tool whose name is not a Python identifier is registered with
    /// each other character replaced by `_` (`get-sum` → `get_sum`); one that still is not
    /// (or clashes) is left out with a warning.
    ///
    /// # Errors
    ///
    /// [`UpstreamError`] when the upstream does not start, answer or list its tools.
    pub async fn connect(
        config: UpstreamConfig,
        registry: &mut ToolRegistry,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let fail = |reason: String| UpstreamError {
            name: config.name.clone(),
            reason,
        };
        config.validate().map_err(&fail)?;
        let client = start(&config).await.map_err(fail)?;
        let listed = tokio::time::timeout(config.timeout, client.list_all_tools())
            .await
            .map_err(|_| fail(format!("listing its tools took over {:?}", config.timeout)))?
            .map_err(|e| fail(format!("listing its tools failed: {e}")))?;
        let upstream = Arc::new(Upstream {
            config,
            state: tokio::sync::Mutex::new(State {
                client: Some(client),
                generation: 1,
                failed_starts: 0,
            }),
        });
        for tool in listed {
            let remote = tool.name.to_string();
            let name = python_name(&remote);
            let upstream_tool = UpstreamTool {
                upstream: upstream.clone(),
                remote: remote.clone(),
                name,
                description: tool
                    .description
                    .as_deref()
                    .or(tool.title.as_deref())
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
                parameters: Value::Object(tool.input_schema.as_ref().clone()),
            };
            if let Err(e) = registry.register(upstream_tool) {
                tracing::warn!(
                    upstream = %upstream.config.name,
                    tool = %remote.escape_debug(),
                    "an upstream tool is left out: {e}"
                );
            }
        }
        Ok(upstream)
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// A live peer and its generation: the current connection, or a new one.
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64), ToolError> {
        let mut state = self.state.lock().await;
        if let Some(client) = &state.client {
            if !client.is_closed() {
                return Ok((client.peer().clone(), state.generation));
            }
            state.client = None;
        }
        let name = &self.config.name;
        if state.failed_starts >= self.config.max_restarts {
            return Err(ToolError::Failed(format!(
                "upstream `{name}` is down: it failed to start {} times in a row",
                state.failed_starts
            )));
        }
        match start(&self.config).await {
            Ok(client) => {
                state.generation += 1;
                state.failed_starts = 0;
                tracing::info!(
                    target: "pycage::audit",
                    upstream = %name,
                    generation = state.generation,
                    "upstream restarted"
                );
                let peer = client.peer().clone();
                state.client = Some(client);
                Ok((peer, state.generation))
            }
            Err(why) => {
                state.failed_starts += 1;
                tracing::warn!(
                    target: "pycage::audit",
                    upstream = %name,
                    failed_starts = state.failed_starts,
                    "upstream restart failed: {why}"
                );
                Err(ToolError::Failed(format!(
                    "upstream `{name}` could not be started again"
                )))
            }
        }
    }

    /// Drops connection `generation` (killing its child) if it is still the current one.
    async fn discard(&self, generation: u64, why: &str) {
        let mut state = self.state.lock().await;
        if state.generation == generation && state.client.take().is_some() {
            tracing::warn!(
                target: "pycage::audit",
                upstream = %self.config.name,
                generation,
                "upstream connection dropped: {why}"
            );
        }
    }

    async fn call(&self, tool: &str, args: Args) -> Result<Value, ToolError> {
        let (peer, generation) = self.peer().await?;
        let name = &self.config.name;
        let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        let answer = tokio::time::timeout(self.config.timeout, peer.call_tool(request)).await;
        let broken = match answer {
            Ok(Ok(result)) => return value_of(result),
            Ok(Err(ServiceError::McpError(e))) => {
                return Err(ToolError::Failed(clip(&format!(
                    "upstream `{name}` refused the call: {}",
                    e.message
                ))));
            }
            Ok(Err(e)) => format!("the call failed: {e}"),
            Err(_) => format!("no answer within {:?}", self.config.timeout),
        };
        self.discard(generation, &broken).await;
        Err(ToolError::Failed(format!(
            "upstream `{name}`: {broken}; it is started again on the next call"
        )))
    }
}

/// Starts the child, or connects to the URL, and completes the MCP handshake within the
/// upstream's timeout.
async fn start(config: &UpstreamConfig) -> Result<Client, String> {
    if let Some(url) = &config.url {
        // The transport's reqwest client needs a TLS provider in this build (see there).
        pycage_tools::net::install_crypto_provider();
        let transport = StreamableHttpClientTransport::from_uri(url.as_str());
        return match tokio::time::timeout(config.timeout, ().serve(transport)).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(format!("the MCP handshake with {url} failed: {e}")),
            Err(_) => Err(format!(
                "the MCP handshake with {url} took over {:?}",
                config.timeout
            )),
        };
    }
    let mut command = tokio::process::Command::new(&config.command[0]);
    pycage_tools::process::inherit_env_only(&mut command, &config.pass_env);
    command.args(&config.command[1..]).envs(&config.env);
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("`{}` does not start: {e}", config.command[0]))?;
    match tokio::time::timeout(config.timeout, ().serve(transport)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(format!("the MCP handshake failed: {e}")),
        Err(_) => Err(format!("the MCP handshake took over {:?}", config.timeout)),
    }
}

/// What the code receives for a result: the structured content when there is some; else
/// the text of a lone text block; else the content blocks as MCP JSON. `isError` results are
/// tool errors carrying their text.
fn value_of(result: CallToolResult) -> Result<Value, ToolError> {
    let text = |blocks: &[ContentBlock]| -> Option<Vec<String>> {
        blocks
            .iter()
            .map(|b| b.as_text().map(|t| t.text.clone()))
            .collect()
    };
    if result.is_error == Some(true) {
        let message = text(&result.content)
            .map(|t| t.join("\n"))
            .unwrap_or_else(|| "the upstream tool failed".into());
        return Err(ToolError::Failed(clip(&message)));
    }
    if let Some(value) = result.structured_content {
        return Ok(value);
    }
    match text(&result.content) {
        Some(mut texts) if texts.len() == 1 => Ok(Value::String(texts.remove(0))),
        _ => serde_json::to_value(&result.content)
            .map_err(|e| ToolError::Failed(format!("the upstream result does not encode: {e}"))),
    }
}

/// An error message cut to at most 1000 characters.
fn clip(message: &str) -> String {
    const MAX: usize = 1000;
    match message.char_indices().nth(MAX) {
        None => message.to_owned(),
        Some((at, _)) => format!("{}…", &message[..at]),
    }
}

/// `remote` as a Python identifier: each character that is not an ASCII letter, digit or
/// `_` becomes `_`.
pub fn python_name(remote: &str) -> String {
    remote
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One upstream tool as the broker sees it.
struct UpstreamTool {
    upstream: Arc<Upstream>,
    /// The name the upstream knows it by.
    remote: String,
    /// The name the code uses.
    name: String,
    description: String,
    parameters: Value,
}

impl Tool for UpstreamTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn namespace(&self) -> &str {
        self.upstream.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn call(&self, args: Args) -> ToolFuture<'_> {
        Box::pin(self.upstream.call(&self.remote, args))
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;

//! The servers' one configuration: backend, tools, policy, limits, the maxima a client may
//! ask for, sessions and the bound on concurrent runs, read from one TOML file.
//!
//! ```toml
//! backend = "wasm"
//! tools = ["examples/tools.toml"]
//!
//! [policy]
//! allow = ["add", "word_count"]
//!
//! [limits]            # each call's, unless it asks for less (or, up to [maxima], more)
//! wall_timeout = "10s"
//! memory_bytes = 268435456
//!
//! [maxima]            # the most a call or a session may ask for (default: [limits])
//! wall_timeout = "60s"
//!
//! [sessions]
//! max_sessions = 16
//! idle_timeout = 600
//!
//! [runs]
//! max_concurrent = 4
//! queue_timeout = "5s"
//!
//! [suspended]         # runs waiting for approval (`[policy] approve`)
//! ttl = "1h"
//! max_runs = 64
//! max_run_bytes = 4194304
//! max_total_bytes = 67108864
//! max_runs_per_client = 16  # one MCP session's share (streamable HTTP)
//! max_bytes_per_client = 16777216
//!
//! [[upstream]]        # code mode: another MCP server's tools as `fs.*` in the code
//! name = "fs"
//! command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
//! ```
//!
//! Every table and key is optional; an unknown key is an error naming it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pycage::{Limits, LimitsBuilder, SessionConfig};
use serde::{Deserialize, Serialize};

/// The `guest` name of pycage's data guest: the built-in guest with numpy baked in
/// (`pycage-guest-data`'s wheels), which the `pycage` CLI builds once into its cache and puts
/// in the name's place. A file of that name is given as `./data`.
pub const DATA_GUEST: &str = "data";

/// Everything a server is configured with (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The backend, by its name as `pycage backends` lists them (default `wasm`).
    pub backend: pycage::BackendKind,
    /// Accept a backend that provides no isolation (`local`). Off by default.
    pub allow_no_isolation: bool,
    /// Give a bubblewrap or docker sandbox the network, unfiltered (`--allow-network`). Off
    /// by default; `[net]` is the way to reach a list of hosts.
    pub allow_network: bool,
    /// The `net.fetch` tool: the hosts it reaches and the secrets it carries there.
    pub net: pycage_tools::net::NetConfig,
    /// A guest file (`pycage guest build`: packages baked in) for the wasm backend to run
    /// instead of the built-in guest. A relative path is resolved against the config file's
    /// directory, but for [`DATA_GUEST`], which the `pycage` CLI replaces with its data guest.
    pub guest: Option<PathBuf>,
    /// Deterministic runs (wasm backend; the CLI's `--deterministic`/`--seed`): every run and
    /// session starts with virtual clocks from 2000-01-01 and random bytes from this seed, so
    /// the same code, inputs and seed give the same output and fuel. `None` (the default): the
    /// host's clocks and entropy.
    pub seed: Option<u64>,
    /// Tools TOML files whose command tools join the built-ins. Relative paths are resolved
    /// against the directory of the config file they were read from.
    pub tools: Vec<PathBuf>,
    /// Which tools the code may call.
    pub policy: PolicyConfig,
    /// Each call's limits, unless the call asks for others within [`maxima`](Self::maxima).
    pub limits: LimitsBuilder,
    /// The most a call or a session may ask for; `None`: the [`limits`](Self::limits), so a
    /// call can only ask for less.
    pub maxima: Option<LimitsBuilder>,
    /// Sessions: how many may be live, and when they expire.
    pub sessions: SessionConfig,
    /// The bound on runs at once.
    pub runs: RunsConfig,
    /// Runs suspended for approval: how many, how big, how long they wait.
    pub suspended: crate::suspended::SuspendedConfig,
    /// The streamable HTTP listener (`pycage mcp --listen`).
    pub http: HttpConfig,
    /// Code mode: MCP servers whose tools the code may call (`[[upstream]]`).
    pub upstream: Vec<crate::UpstreamConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            backend: pycage::BackendKind::Wasm,
            allow_no_isolation: false,
            allow_network: false,
            net: pycage_tools::net::NetConfig::default(),
            guest: None,
            seed: None,
            tools: Vec::new(),
            policy: PolicyConfig::default(),
            limits: LimitsBuilder::default(),
            maxima: None,
            sessions: SessionConfig::default(),
            runs: RunsConfig::default(),
            suspended: crate::suspended::SuspendedConfig::default(),
            http: HttpConfig::default(),
            upstream: Vec::new(),
        }
    }
}

/// Which tools the code may call: deny by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Tools must be in this namespace.
    pub namespace: Option<String>,
    /// The tools the code may call, by name or `namespace.name`.
    pub allow: Vec<String>,
    /// Allowed tools whose calls wait for a person's approval: the run comes back
    /// `suspended` and is resumed with the decision (`POST /v1/runs/{id}/resume`, MCP
    /// `resume_run`).
    pub approve: Vec<String>,
}

/// How many runs may go at once, and how long a call waits for a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// The most runs at once, sessions' included (default 4).
    pub max_concurrent: usize,
    /// How long a call waits for a free slot before it fails as busy (default 5 s).
    #[serde(with = "pycage_tools::units::duration_text")]
    pub queue_timeout: Duration,
    /// How often a long run reports progress (default 1 s).
    #[serde(with = "pycage_tools::units::duration_text")]
    pub progress_interval: Duration,
    /// How many runs may wait for a slot beyond `max_concurrent` before more are refused
    /// at once as busy (429 over HTTP; default: 16 per core).
    pub max_queued: Option<usize>,
}

impl RunsConfig {
    /// [`max_queued`](Self::max_queued), or its default: 16 per core.
    pub fn max_queued(&self) -> usize {
        self.max_queued.unwrap_or_else(|| {
            16 * std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        })
    }
}

impl Default for RunsConfig {
    fn default() -> Self {
        RunsConfig {
            max_concurrent: 4,
            queue_timeout: Duration::from_secs(5),
            progress_interval: Duration::from_secs(1),
            max_queued: None,
        }
    }
}

/// MCP over streamable HTTP at `/mcp`: where it listens and who may talk to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// The address to listen on (`127.0.0.1:8080`); `None`: serve on stdio.
    pub listen: Option<std::net::SocketAddr>,
    /// A file holding the bearer token every request must carry (`Authorization: Bearer
    /// ...`); required to listen on an address that is not loopback.
    pub token_file: Option<PathBuf>,
    /// `Host` values accepted besides `localhost`, `127.0.0.1` and `::1` (`pycage serve`:
    /// `localhost` and any IP address), any port: `name` or `name:port`. Against DNS
    /// rebinding; others get 403.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides `http://localhost:*`, `http://127.0.0.1:*` and
    /// `http://[::1]:*`; a request without an `Origin` (not from a browser) passes.
    pub allowed_origins: Vec<String>,
    /// The largest request body, in bytes (default 4 MiB); past it, 413.
    pub max_body_bytes: usize,
    /// The longest a request's whole body may take to arrive (default 30 s): past it, 408,
    /// so a slow client cannot hold a connection by trickling bytes.
    #[serde(with = "pycage_tools::units::duration_text")]
    pub body_read_timeout: Duration,
    /// The longest a client may take to send a request's headers, and the longest a
    /// kept-alive connection may sit idle (default 10 s).
    #[serde(with = "pycage_tools::units::duration_text")]
    pub header_read_timeout: Duration,
    /// The most connections open at once (default 512): past them the server accepts no
    /// more until one closes (they wait in the kernel's backlog).
    pub max_connections: usize,
    /// `pycage mcp --listen`: the most MCP sessions live at once (default 64): past them an
    /// `initialize` gets 503 until one closes or idles out.
    pub max_mcp_sessions: usize,
    /// Serve without a token (default off): `pycage serve` needs a token on every address,
    /// `pycage mcp --listen` beyond loopback. Only for a network that only trusted clients
    /// reach, such as a pod behind an authenticating proxy.
    pub insecure_no_auth: bool,
    /// `pycage serve`: after SIGTERM, how long the runs in flight may take to finish before
    /// they are cancelled and the process exits (default 30 s).
    #[serde(with = "pycage_tools::units::duration_text")]
    pub shutdown_grace: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: None,
            token_file: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 4 << 20,
            shutdown_grace: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_connections: 512,
            max_mcp_sessions: 64,
            insecure_no_auth: false,
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not valid TOML for a [`ServerConfig`] (an unknown key, a wrong type); the
    /// message names the key and its line.
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A value is out of range (the message names it).
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, reason } => {
                write!(f, "cannot read {}: {reason}", path.display())
            }
            ConfigError::Parse { path, reason } => {
                write!(f, "{}: {}", path.display(), reason.trim_end())
            }
            ConfigError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ServerConfig {
    /// Reads `path`; relative tool paths in it are resolved against its directory.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] or [`ConfigError::Parse`]; values are checked by
    /// [`validate`](Self::validate), not here.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let mut config = Self::from_toml(&text).map_err(|reason| ConfigError::Parse {
            path: path.to_owned(),
            reason,
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        for tool in &mut config.tools {
            if tool.is_relative() {
                *tool = base.join(&*tool);
            }
        }
        for upstream in &mut config.upstream {
            upstream.resolve_against(base);
        }
        if let Some(token) = &mut config.http.token_file
            && token.is_relative()
        {
            *token = base.join(&*token);
        }
        if let Some(guest) = &mut config.guest
            && guest.is_relative()
            && guest.as_os_str() != DATA_GUEST
        {
            *guest = base.join(&*guest);
        }
        Ok(config)
    }

    /// Parses TOML text; `Err` is the parser's message (naming an unknown key and its line).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The limits and maxima, checked: each valid, and the limits within the maxima.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the table and the field.
    pub fn resolved_limits(&self) -> Result<(Limits, Limits), ConfigError> {
        let limits = self
            .limits
            .clone()
            .build()
            .map_err(|e| ConfigError::Invalid(format!("[limits]: {e}")))?;
        let maxima = match &self.maxima {
            None => limits.clone(),
            Some(m) => m
                .clone()
                .build()
                .map_err(|e| ConfigError::Invalid(format!("[maxima]: {e}")))?,
        };
        if let Some(field) = limits.first_above(&maxima) {
            return Err(ConfigError::Invalid(format!(
                "[limits] {field} is above [maxima] {field}"
            )));
        }
        Ok((limits, maxima))
    }

    /// Checks every value (see [`resolved_limits`](Self::resolved_limits)).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming what is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.resolved_limits()?;
        self.sessions
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("[sessions]: {}", e.message)))?;
        if self.guest.is_some() && self.backend != pycage::BackendKind::Wasm {
            return Err(ConfigError::Invalid(format!(
                "guest needs backend = \"wasm\"; `{}` runs the host's own Python",
                self.backend
            )));
        }
        if self.seed.is_some() && self.backend != pycage::BackendKind::Wasm {
            return Err(ConfigError::Invalid(format!(
                "seed (deterministic runs) needs backend = \"wasm\"; `{}` runs on the host's \
                 clocks and entropy",
                self.backend
            )));
        }
        if self.allow_network && !self.backend.can_have_network() {
            return Err(ConfigError::Invalid(format!(
                "allow_network needs backend = \"bubblewrap\" or \"docker\"; `{}` has no \
                 network to give (list hosts under [net] allow for the net.fetch tool)",
                self.backend
            )));
        }
        if !self.net.allow.is_empty()
            && let Some(ns) = self.policy.namespace.as_deref().filter(|ns| *ns != "net")
        {
            return Err(ConfigError::Invalid(format!(
                "[net] exposes the tool net.fetch, outside [policy] namespace = \"{ns}\": \
                 drop the namespace and list the tools in [policy] allow"
            )));
        }
        if let Some(addr) = self.http.listen
            && !addr.ip().is_loopback()
            && self.http.token_file.is_none()
            && !self.http.insecure_no_auth
        {
            return Err(ConfigError::Invalid(format!(
                "[http] listening on {addr}, which is not loopback, needs a token_file: \
                 without one anyone who reaches the address runs code (insecure_no_auth \
                 serves it anyway, for a network only trusted clients reach)"
            )));
        }
        for (name, timeout) in [
            ("body_read_timeout", self.http.body_read_timeout),
            ("header_read_timeout", self.http.header_read_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "[http] {name} must be above zero"
                )));
            }
        }
        crate::front_door::FrontDoor::new(&self.http.allowed_hosts, &self.http.allowed_origins)
            .map_err(ConfigError::Invalid)?;
        for (name, n) in [
            ("max_body_bytes", self.http.max_body_bytes),
            ("max_connections", self.http.max_connections),
            ("max_mcp_sessions", self.http.max_mcp_sessions),
        ] {
            if n == 0 {
                return Err(ConfigError::Invalid(format!(
                    "[http] {name} must be at least 1"
                )));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for upstream in &self.upstream {
            upstream.validate().map_err(ConfigError::Invalid)?;
            if !names.insert(upstream.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "upstream `{}` is configured twice",
                    upstream.name
                )));
            }
        }
        let suspended = &self.suspended;
        if suspended.ttl.is_zero()
            || suspended.max_runs == 0
            || suspended.max_run_bytes == 0
            || suspended.max_total_bytes < suspended.max_run_bytes
            || suspended.max_runs_per_client == 0
            || suspended.max_bytes_per_client < suspended.max_run_bytes
        {
            return Err(ConfigError::Invalid(
                "[suspended] ttl, max_runs, max_run_bytes and max_runs_per_client must be \
                 above zero, and max_total_bytes and max_bytes_per_client at least \
                 max_run_bytes"
                    .into(),
            ));
        }
        if self.runs.max_concurrent == 0 {
            return Err(ConfigError::Invalid(
                "[runs] max_concurrent must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

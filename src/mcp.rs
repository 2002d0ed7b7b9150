//! `pycage mcp`: the `run_python` tool over MCP on stdio, or streamable HTTP with
//! `--listen`, configured by `--config` and the flags (which override the file). On stdio,
//! stdout carries protocol messages only; every notice and log line goes to stderr.

use std::net::SocketAddr;
use std::sync::Arc;

use pycage_server::mcp::http;
use pycage_server::{PythonTool, ServerConfig, StartError};
use tokio_util::sync::CancellationToken;

use crate::cli::{McpArgs, SandboxArgs};
use crate::exit::Exit;

pub async fn mcp(args: McpArgs) -> Exit {
    let mut config = match config(&args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("pycage: {message}");
            return Exit::Usage;
        }
    };
    if let Err((exit, message)) = crate::sandbox::prepare_server_guest(&mut config).await {
        eprintln!("pycage: {message}");
        return exit;
    }
    let tool = match PythonTool::start(&config).await {
        Ok(tool) => tool,
        Err(e @ (StartError::Config(_) | StartError::Sandbox(_) | StartError::Upstream(_))) => {
            eprintln!("pycage: {e}");
            return Exit::Usage;
        }
        Err(e) => {
            eprintln!("pycage: {e}");
            return Exit::Internal;
        }
    };
    // A client that cannot ask its user about a gated call (no MCP elicitation): the
    // approval code goes to stderr, which the client shows as the server's log and the
    // model does not read; the user gives it to the model to allow the call.
    let tool = Arc::new(tool.with_approval_channel(|notice| {
        eprintln!(
            "pycage: run {} waits for your approval: {} To allow it, give the model this \
             approval code: {}",
            notice.pending.run_id,
            notice.pending.question(),
            notice.code,
        );
    }));
    match config.http.listen {
        None => match pycage_server::mcp::serve_stdio(tool).await {
            Ok(()) => Exit::Ok,
            Err(e) => {
                eprintln!("pycage: the MCP session ended: {e}");
                Exit::Internal
            }
        },
        Some(addr) => serve_http(tool, &config, addr).await,
    }
}

/// Serves streamable HTTP on `addr` until SIGINT or SIGTERM.
async fn serve_http(tool: Arc<PythonTool>, config: &ServerConfig, addr: SocketAddr) -> Exit {
    let token = match token(&config.http) {
        Ok(token) => token,
        Err(exit) => return exit,
    };
    let listener = match listen(addr).await {
        Ok(listener) => listener,
        Err(exit) => return exit,
    };
    let bound = listener.local_addr().unwrap_or(addr);
    eprintln!("pycage: serving MCP at {}", http::endpoint(bound));
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        stop_signal().await;
        on_signal.cancel();
    });
    match http::serve(tool, &config.http, token, listener, shutdown).await {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("pycage: the HTTP server failed: {e}");
            Exit::Internal
        }
    }
}

/// SIGINT or (on Unix) SIGTERM, whichever comes first.
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The config file (or the defaults) with the flags over it.
fn config(args: &McpArgs) -> Result<ServerConfig, String> {
    let mut config = match &args.config {
        Some(path) => ServerConfig::from_file(path).map_err(|e| e.to_string())?,
        None => ServerConfig::default(),
    };
    apply_sandbox_flags(&mut config, &args.sandbox, &args.approve)?;
    if let Some(n) = args.max_concurrent {
        config.runs.max_concurrent = n;
    }
    if let Some(d) = args.queue_timeout {
        config.runs.queue_timeout = d;
    }
    if args.listen.is_some() {
        config.http.listen = args.listen;
    }
    apply_front_door_flags(
        &mut config.http,
        args.token_file.as_ref(),
        &args.allowed_hosts,
        &args.allowed_origins,
    );
    config.upstream.extend(args.upstreams.iter().cloned());
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// `--token-file` (replacing the file's), `--allowed-host` and `--allowed-origin` (adding to
/// the file's) over `http`: both servers' front-door flags.
pub(crate) fn apply_front_door_flags(
    http: &mut pycage_server::HttpConfig,
    token_file: Option<&std::path::PathBuf>,
    allowed_hosts: &[String],
    allowed_origins: &[String],
) {
    if let Some(token_file) = token_file {
        http.token_file = Some(token_file.clone());
    }
    http.allowed_hosts.extend(allowed_hosts.iter().cloned());
    http.allowed_origins.extend(allowed_origins.iter().cloned());
}

/// The sandbox flags (and `--approve`) over `config`: each one given replaces the file's
/// value (`--tools` adds files, `--allow` and `--approve` replace the lists).
pub(crate) fn apply_sandbox_flags(
    config: &mut ServerConfig,
    flags: &SandboxArgs,
    approve: &[String],
) -> Result<(), String> {
    config.tools.extend(flags.tools.iter().cloned());
    config.allow_network |= flags.allow_network;
    config.net.allow.extend(flags.net_allow.iter().cloned());
    config
        .net
        .allow_addresses
        .extend(flags.net_allow_address.iter().cloned());
    for spec in &flags.secrets {
        let secret =
            pycage_tools::net::SecretConfig::parse_flag(spec).map_err(|e| format!("--{e}"))?;
        config.net.secrets.push(secret);
    }
    if flags.namespace.is_some() {
        config.policy.namespace.clone_from(&flags.namespace);
    }
    if !flags.allow.is_empty() {
        config.policy.allow.clone_from(&flags.allow);
    }
    if !approve.is_empty() {
        config.policy.approve = approve.to_vec();
    }
    if let Some(backend) = flags.backend {
        config.backend = backend;
    }
    config.allow_no_isolation |= flags.allow_no_isolation;
    if flags.guest.is_some() {
        config.guest.clone_from(&flags.guest);
    }
    if let Some(seed) = flags.seed() {
        config.seed = Some(seed);
    }
    let limits = &mut config.limits;
    if let Some(d) = flags.timeout {
        limits.wall_timeout = d;
    }
    if let Some(fuel) = flags.fuel {
        limits.fuel = Some(fuel);
    }
    if let Some(bytes) = flags.memory {
        limits.memory_bytes = bytes;
    }
    if let Some(bytes) = flags.max_output {
        limits.max_output_bytes = bytes;
    }
    if let Some(n) = flags.max_tool_calls {
        limits.max_tool_calls = n;
    }
    if let Some(bytes) = flags.max_written {
        limits.max_written_bytes = bytes;
    }
    if let Some(n) = flags.max_files {
        limits.max_files = n;
    }
    Ok(())
}

/// The bearer token of `[http] token_file`, if one is set; a usage error (said on stderr)
/// when the file is unusable.
pub fn token(config: &pycage_server::HttpConfig) -> Result<Option<String>, Exit> {
    let Some(path) = &config.token_file else {
        return Ok(None);
    };
    http::read_token(path).map(Some).map_err(|message| {
        eprintln!("pycage: {message}");
        Exit::Usage
    })
}

/// A listener on `addr`; a usage error (said on stderr) when it cannot be had.
pub async fn listen(addr: SocketAddr) -> Result<tokio::net::TcpListener, Exit> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        eprintln!("pycage: cannot listen on {addr}: {e}");
        Exit::Usage
    })
}

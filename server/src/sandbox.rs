//! The runner a [`ServerConfig`] makes: its backend, the built-in and command tools, and
//! the policy over them.

use pycage::{BackendOptions, BuildError, Limits, Runner, ToolPolicy};
use pycage_tools::ToolRegistry;

use crate::config::ServerConfig;

/// The built-in tools and those of `config`'s tools files. `Err` names the file and why.
pub fn tools(config: &ServerConfig) -> Result<ToolRegistry, String> {
    let mut tools = ToolRegistry::with_builtins();
    for path in &config.tools {
        let loaded = pycage_tools::command::load_file(path).map_err(|e| e.to_string())?;
        tools
            .extend(loaded)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(fetch) = fetch_tool(config)? {
        tools.register(fetch).map_err(|e| e.to_string())?;
    }
    Ok(tools)
}

/// The runner `config` describes over `tools`, with `limits` as each run's defaults. `Err`
/// says what is unusable (a backend, the policy, a backend without isolation not accepted).
pub fn runner(
    config: &ServerConfig,
    tools: ToolRegistry,
    limits: Limits,
) -> Result<Runner, String> {
    let mut policy = ToolPolicy {
        namespace: config.policy.namespace.clone(),
        allow: config.policy.allow.clone(),
        approve: config.policy.approve.clone(),
    };
    // `[net] allow` exposes the tool, as `--net-allow` does.
    if !config.net.allow.is_empty() && !policy.allow.iter().any(|a| a == "net.fetch") {
        policy.allow.push("net.fetch".into());
    }
    let mut options = BackendOptions::new().allow_network(config.allow_network);
    if let Some(wasm) = guest_backend(config)? {
        options = options.wasm(wasm);
    }
    let backend = config
        .backend
        .backend(&options)
        .map_err(|e| e.to_string())?;
    if let pycage::Availability::Unavailable(why) = backend.availability() {
        return Err(format!(
            "backend `{}` cannot run here: {why}",
            backend.name()
        ));
    }
    Runner::builder()
        .backend(backend)
        .tools(tools)
        .policy(policy)
        .limits(limits)
        .allow_no_isolation(config.allow_no_isolation)
        .build()
        .map_err(|e| match e {
            BuildError::NoIsolation(name) => format!(
                "backend `{name}` provides no isolation: the code would run with the host's \
                 files, network and processes; set allow_no_isolation to accept that"
            ),
            other => other.to_string(),
        })
}

/// The wasm backend `config` asks for when it is not the shared default: on its guest file,
/// deterministic with its seed. `None` when it asks for neither (the built-in guest,
/// [`WasmBackend::shared`](pycage::WasmBackend::shared)). `Err` says why the guest file is
/// refused.
pub fn guest_backend(config: &ServerConfig) -> Result<Option<pycage::WasmBackend>, String> {
    if config.guest.is_none() && config.seed.is_none() {
        return Ok(None);
    }
    let mut builder = pycage::WasmBackend::builder();
    if let Some(path) = &config.guest {
        if path.as_os_str() == crate::config::DATA_GUEST {
            return Err(format!(
                "guest = \"{}\" names the data guest, which the `pycage` CLI builds; this \
                 host has not: build one (`pycage guest build --package numpy --preload numpy \
                 -o data.wasm`) and give its path",
                crate::config::DATA_GUEST
            ));
        }
        let guest = pycage::Guest::from_path(path).map_err(|e| format!("guest: {e}"))?;
        builder = builder.guest(guest);
    }
    if let Some(seed) = config.seed {
        builder = builder.deterministic(seed);
    }
    builder.build().map(Some).map_err(|e| e.to_string())
}

/// How often a server's sessions are swept for expiry, so an expired session's guest goes
/// soon rather than at the next session request.
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The session manager of a server over `runner`, with `config`'s sessions and a sweeper;
/// `None` when the backend keeps no sessions.
///
/// # Errors
///
/// [`StartError::Sandbox`](crate::StartError::Sandbox) when `[sessions]` is unusable.
pub fn sessions(
    runner: &Runner,
    config: &ServerConfig,
) -> Result<Option<std::sync::Arc<pycage::SessionManager>>, crate::StartError> {
    if !runner.backend().supports_sessions() {
        return Ok(None);
    }
    let manager = pycage::SessionManager::new(runner.clone(), config.sessions.clone())
        .map_err(|e| crate::StartError::Sandbox(e.message))?;
    let manager = std::sync::Arc::new(manager);
    manager.spawn_sweeper(SWEEP_EVERY);
    Ok(Some(manager))
}

/// Everything a server starts from `config`: checked, its tools loaded, its upstreams
/// connected (each under its own namespace), and the runner over them; with the maxima a
/// call may ask for.
///
/// # Errors
///
/// [`StartError`](crate::StartError) naming what is unusable.
pub async fn start(config: &ServerConfig) -> Result<(Runner, Limits), crate::StartError> {
    use crate::StartError;
    config.validate().map_err(StartError::Config)?;
    let (limits, maxima) = config.resolved_limits().map_err(StartError::Config)?;
    let mut tools = tools(config).map_err(StartError::Sandbox)?;
    for upstream in &config.upstream {
        if tools.iter().any(|t| t.namespace() == upstream.name) {
            return Err(StartError::Sandbox(format!(
                "upstream `{0}`: the namespace `{0}` is taken by other tools",
                upstream.name
            )));
        }
        crate::Upstream::connect(upstream.clone(), &mut tools)
            .await
            .map_err(StartError::Upstream)?;
    }
    let runner = runner(config, tools, limits).map_err(StartError::Sandbox)?;
    Ok((runner, maxima))
}

/// The `net.fetch` of `config`'s `[net]` table (secrets read from this process's
/// environment); `None` without one. `Err` names the unusable entry.
pub(crate) fn fetch_tool(
    config: &ServerConfig,
) -> Result<Option<pycage_tools::net::FetchTool>, String> {
    config
        .net
        .fetch_tool(|var| std::env::var(var).ok())
        .map_err(|e| format!("[net]: {e}"))
}

/// `fetch` narrowed to a run's `net_allow` (an array of some of its host patterns), as the
/// tool that serves that run's calls. `Err` says what is wrong with `net_allow`.
pub(crate) fn narrowed_fetch(
    fetch: Option<&pycage_tools::net::FetchTool>,
    net_allow: &serde_json::Value,
) -> Result<std::sync::Arc<dyn pycage_tools::Tool>, String> {
    let Some(fetch) = fetch else {
        return Err(
            "`net_allow` narrows net.fetch, which this server does not have ([net] allow)".into(),
        );
    };
    let not_patterns = || "`net_allow` must be an array of host patterns".to_owned();
    let patterns = net_allow
        .as_array()
        .ok_or_else(not_patterns)?
        .iter()
        .map(|h| {
            h.as_str()
                .ok_or_else(not_patterns)?
                .parse::<pycage_tools::net::HostPattern>()
                .map_err(|e| format!("`net_allow`: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let narrowed = fetch
        .narrowed(&patterns)
        .map_err(|e| format!("`net_allow`: {e}"))?;
    Ok(std::sync::Arc::new(narrowed))
}

//! The sandbox flags `run` and `describe` share, resolved into tools, limits and a runner.

use pycage::{BuildError, JournalKey, Limits, Runner, ToolPolicy, WasmBackend};
use pycage_tools::ToolRegistry;

use crate::backends;
use crate::cli::SandboxArgs;
use crate::exit::Exit;

/// The built-in tools and those of every `--tools` file, and the policy over them.
pub fn tools(args: &SandboxArgs) -> Result<(ToolRegistry, ToolPolicy), String> {
    let mut tools = ToolRegistry::with_builtins();
    for path in &args.tools {
        let loaded = pycage_tools::command::load_file(path).map_err(|e| e.to_string())?;
        tools
            .extend(loaded)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut policy = ToolPolicy {
        namespace: args.namespace.clone(),
        allow: args.allow.clone(),
        approve: Vec::new(),
    };
    if let Some(fetch) = net_tool(args)? {
        if let Some(ns) = args.namespace.as_deref().filter(|ns| *ns != "net") {
            return Err(format!(
                "--net-allow exposes the tool net.fetch, outside the pinned namespace `{ns}`: \
                 drop --namespace and name the tools with --allow"
            ));
        }
        tools.register(fetch).map_err(|e| e.to_string())?;
        policy.allow.push("net.fetch".into());
    }
    Ok((tools, policy))
}

/// The `net.fetch` tool the `--net-allow`, `--net-allow-address` and `--secret` flags make;
/// `None` without `--net-allow`.
fn net_tool(args: &SandboxArgs) -> Result<Option<pycage_tools::net::FetchTool>, String> {
    use pycage_tools::net::{NetConfig, SecretConfig};
    if args.net_allow.is_empty() {
        if !args.secrets.is_empty() || !args.net_allow_address.is_empty() {
            return Err("--secret and --net-allow-address need --net-allow".into());
        }
        return Ok(None);
    }
    let config = NetConfig {
        allow: args.net_allow.clone(),
        allow_addresses: args.net_allow_address.clone(),
        secrets: args
            .secrets
            .iter()
            .map(|spec| SecretConfig::parse_flag(spec))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--{e}"))?,
    };
    config
        .fetch_tool(|var| std::env::var(var).ok())
        .map_err(|e| format!("net.fetch: {e}"))
}

/// The limits the flags set, the defaults for the rest.
pub fn limits(args: &SandboxArgs) -> Result<Limits, String> {
    let defaults = Limits::default();
    Limits::builder()
        .wall_timeout(args.timeout.unwrap_or(defaults.wall_timeout()))
        .memory_bytes(args.memory.unwrap_or(defaults.memory_bytes()))
        .max_output_bytes(args.max_output.unwrap_or(defaults.max_output_bytes()))
        .max_tool_calls(args.max_tool_calls.unwrap_or(defaults.max_tool_calls()))
        .fuel(args.fuel)
        .max_written_bytes(args.max_written.unwrap_or(defaults.max_written_bytes()))
        .max_files(args.max_files.unwrap_or(defaults.max_files()))
        .build()
        .map_err(|e| e.to_string())
}

/// The runner on the `--backend`, and the wasm backend when it is that one (for the
/// first-run notice).
pub fn runner(
    args: &SandboxArgs,
    tools: ToolRegistry,
    policy: ToolPolicy,
    limits: Limits,
    journal_key: Option<JournalKey>,
) -> Result<(Runner, Option<WasmBackend>), String> {
    let (backend, wasm) = backends::by_name(
        args.backend.unwrap_or_default(),
        args.seed(),
        args.guest.as_deref(),
        args.allow_network,
    )?;
    let mut builder = Runner::builder()
        .backend(backend)
        .tools(tools)
        .policy(policy)
        .limits(limits)
        .allow_no_isolation(args.allow_no_isolation);
    if let Some(key) = journal_key {
        builder = builder.journal_key(key);
    }
    let runner = builder
        .build()
        .map_err(|e| match e {
            BuildError::NoIsolation(name) => format!(
                "backend `{name}` provides no isolation: the code would run with your files, network and processes; pass --allow-no-isolation to accept that"
            ),
            other => other.to_string(),
        })?;
    Ok((runner, wasm))
}

/// The runner the sandbox flags make, ready to run (the first-run notice printed): for
/// `describe`, `repl` and `meter`. `Err` is the exit, its reason already printed.
pub fn ready_runner(args: &SandboxArgs) -> Result<Runner, Exit> {
    let resolved = tools(args).and_then(|(tools, policy)| {
        let limits = limits(args)?;
        runner(args, tools, policy, limits, None)
    });
    let (runner, wasm) = resolved.map_err(|message| {
        eprintln!("pycage: {message}");
        Exit::Usage
    })?;
    check_ready(&runner, wasm.as_ref()).map_err(|message| {
        eprintln!("pycage: {message}");
        Exit::Internal
    })?;
    Ok(runner)
}

/// `Err` with the line to print when the runner's backend cannot run here; prints the
/// first-run notice when the wasm guest is about to be compiled.
pub fn check_ready(runner: &Runner, wasm: Option<&WasmBackend>) -> Result<(), String> {
    if let pycage::Availability::Unavailable(why) = runner.backend().availability() {
        return Err(format!(
            "backend `{}` cannot run here: {why}",
            runner.backend().name()
        ));
    }
    if let Some(wasm) = wasm
        && !wasm.is_cached()
    {
        eprintln!("pycage: compiling the sandbox (first run only; this takes a few seconds)...");
    }
    Ok(())
}

/// What preparing the guest did, for a line on stderr.
pub fn describe_source(source: pycage::ArtifactSource) -> &'static str {
    use pycage::ArtifactSource;
    match source {
        ArtifactSource::Cache => "loaded the prepared artifact",
        ArtifactSource::CacheVerified => "loaded the prepared artifact (its checksum verified)",
        ArtifactSource::Compiled => "compiled the guest and cached the artifact",
        ArtifactSource::CompiledUncached => {
            "compiled the guest (not cached: each new process compiles it again)"
        }
    }
}

/// A server's start: puts the data guest in the place of its name (`guest = "data"`, built
/// first if need be), then, on the wasm backend, loads (or compiles) the guest before the
/// server takes requests, and says on stderr which it was and how long it took, so an
/// operator sees whether a baked artifact was used. Other backends: nothing more to do.
pub async fn prepare_server_guest(
    config: &mut pycage_server::ServerConfig,
) -> Result<(), (crate::exit::Exit, String)> {
    use crate::exit::Exit;
    crate::guest::resolve_data_guest(&mut config.guest)
        .await
        .map_err(|(exit, message)| {
            let name = pycage_server::config::DATA_GUEST;
            (exit, format!("guest = \"{name}\": {message}"))
        })?;
    if config.backend != pycage::BackendKind::Wasm {
        return Ok(());
    }
    let wasm = match pycage_server::guest_backend(config).map_err(|e| (Exit::Usage, e))? {
        Some(wasm) => wasm,
        None => WasmBackend::shared().map_err(|e| (Exit::Internal, e.to_string()))?,
    };
    if !wasm.is_cached() {
        eprintln!("pycage: compiling the sandbox (first run only; this takes a few seconds)...");
    }
    let started = std::time::Instant::now();
    let source = wasm
        .prepare()
        .await
        .map_err(|e| (Exit::Internal, e.to_string()))?;
    eprintln!(
        "pycage: the sandbox: {} in {:.0} ms",
        describe_source(source),
        started.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

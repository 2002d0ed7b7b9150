//! `pycage serve`: the HTTP API (`pycage_server::http`) on one address, configured by
//! `--config` and the flags (which override the file), until SIGINT or SIGTERM: then it
//! stops taking runs (`/readyz` turns 503), lets the runs in flight finish within the
//! shutdown grace (cancelling the rest), and exits 0.

use std::net::SocketAddr;
use std::sync::Arc;

use pycage_server::http::{self, HttpApi};
use pycage_server::{ServerConfig, StartError};

use crate::cli::ServeArgs;
use crate::exit::Exit;

/// What `pycage serve` without a token says.
const NO_TOKEN: &str = "serving needs a bearer token, even on loopback: write one to a \
file and pass it, for example\n  \
head -c 32 /dev/urandom | base64 > token && chmod 600 token\n  \
pycage serve --token-file token\n\
(or `[http] token_file` in the --config file); clients send `Authorization: Bearer <token>`. \
--insecure-no-auth serves without one, for a network only trusted clients reach.";

/// Where `pycage serve` listens unless told.
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

pub async fn serve(args: ServeArgs) -> Exit {
    let (mut config, addr) = match config(&args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("pycage: {message}");
            return Exit::Usage;
        }
    };
    let token = match crate::mcp::token(&config.http) {
        Ok(token) => token,
        Err(exit) => return exit,
    };
    if let Err((exit, message)) = crate::sandbox::prepare_server_guest(&mut config).await {
        eprintln!("pycage: {message}");
        return exit;
    }
    let api = match HttpApi::start(&config).await {
        Ok(api) => Arc::new(api),
        Err(e @ (StartError::Config(_) | StartError::Sandbox(_) | StartError::Upstream(_))) => {
            eprintln!("pycage: {e}");
            return Exit::Usage;
        }
        Err(e) => {
            eprintln!("pycage: {e}");
            return Exit::Internal;
        }
    };
    let listener = match crate::mcp::listen(addr).await {
        Ok(listener) => listener,
        Err(exit) => return exit,
    };
    let bound = listener.local_addr().unwrap_or(addr);
    eprintln!("pycage: serving the HTTP API at http://{bound}/v1/");
    let stop = async {
        crate::mcp::stop_signal().await;
        eprintln!("pycage: draining: no new runs; the runs in flight finish");
    };
    let served = http::serve(api, &config.http, token, listener, stop).await;
    match served {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("pycage: the HTTP server failed: {e}");
            Exit::Internal
        }
    }
}

/// The config file (or the defaults) with the flags over it, and the address to listen on.
fn config(args: &ServeArgs) -> Result<(ServerConfig, SocketAddr), String> {
    let mut config = match &args.config {
        Some(path) => ServerConfig::from_file(path).map_err(|e| e.to_string())?,
        None => ServerConfig::default(),
    };
    crate::mcp::apply_sandbox_flags(&mut config, &args.sandbox, &args.approve)?;
    if let Some(n) = args.max_concurrent_runs {
        config.runs.max_concurrent = n;
    }
    if args.max_queued.is_some() {
        config.runs.max_queued = args.max_queued;
    }
    crate::mcp::apply_front_door_flags(
        &mut config.http,
        args.token_file.as_ref(),
        &args.allowed_hosts,
        &args.allowed_origins,
    );
    config.http.insecure_no_auth |= args.insecure_no_auth;
    if let Some(grace) = args.shutdown_grace {
        config.http.shutdown_grace = grace;
    }
    let default: SocketAddr = DEFAULT_LISTEN
        .parse()
        .map_err(|_| "a bad default address")?;
    let addr = args.listen.or(config.http.listen).unwrap_or(default);
    // Validated with the address it will listen on (beyond loopback a token is required).
    config.http.listen = Some(addr);
    config.validate().map_err(|e| e.to_string())?;
    if config.http.token_file.is_none() {
        if !config.http.insecure_no_auth {
            // On loopback too: every local user and process (a dependency's postinstall
            // script, a container sharing the host's network) could otherwise run code with
            // the server's tools and secrets.
            return Err(NO_TOKEN.into());
        }
        eprintln!(
            "pycage: --insecure-no-auth: serving without a token; anyone who reaches the address runs code"
        );
    }
    Ok((config, addr))
}

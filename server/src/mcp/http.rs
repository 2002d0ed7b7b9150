//! MCP over streamable HTTP at `/mcp`, on axum, with rmcp's transport.
//!
//! What guards the listener, in one place ([`router`]):
//!
//! * `Host` must be `localhost`, `127.0.0.1`, `::1` or one of
//!   [`HttpConfig::allowed_hosts`], and a browser's `Origin` a loopback one or one of
//!   [`HttpConfig::allowed_origins`] (DNS-rebinding protection; rmcp's checks, 403);
//! * a body past [`HttpConfig::max_body_bytes`] is refused (413), and one that takes longer
//!   than [`HttpConfig::body_read_timeout`] in all (408); a client must send its headers
//!   within [`HttpConfig::header_read_timeout`], and at most [`HttpConfig::max_connections`]
//!   connections are open at once;
//! * at most [`HttpConfig::max_mcp_sessions`] MCP sessions live at once: past them an
//!   `initialize` gets 503 with `Retry-After` (a session idle for rmcp's keep-alive, 5
//!   minutes, is closed);
//! * with a token ([`HttpConfig::token_file`]) every request must carry `Authorization:
//!   Bearer <token>`, compared in constant time (401 otherwise). Listening on an address that
//!   is not loopback without a token is refused before anything listens
//!   ([`ServerConfig::validate`](crate::ServerConfig::validate)).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::config::HttpConfig;
use crate::mcp::McpServer;
use crate::python::PythonTool;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// The `Origin`s a browser on this machine sends, any port.
const LOOPBACK_ORIGINS: [&str; 3] = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"];

/// The bearer token in `path`: the file's text without surrounding whitespace.
///
/// # Errors
///
/// When the file cannot be read or holds no token.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    Ok(token.to_owned())
}

/// The app serving `tool` at [`MCP_PATH`] with `config`'s guards; `token` is the bearer
/// token every request must carry, if any. Cancelling `shutdown` ends every MCP session.
pub fn router(
    tool: Arc<PythonTool>,
    config: &HttpConfig,
    token: Option<String>,
    shutdown: CancellationToken,
) -> axum::Router {
    let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(config.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = LOOPBACK_ORIGINS.iter().map(|o| (*o).to_owned()).collect();
    origins.extend(config.allowed_origins.iter().cloned());
    let transport = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .with_max_request_body_bytes(config.max_body_bytes)
        .with_cancellation_token(shutdown);
    let server = McpServer::new(tool);
    let sessions = Arc::new(LocalSessionManager::default());
    let service =
        StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), transport);
    let app = axum::Router::new()
        .nest_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(
            (sessions, config.max_mcp_sessions),
            cap_sessions,
        ))
        .layer(middleware::from_fn_with_state(
            crate::listener::BodyLimits::of(config, crate::listener::plain_refusal),
            crate::listener::body_deadline,
        ));
    match token {
        Some(token) => app.layer(middleware::from_fn_with_state(
            Arc::new(token),
            require_token,
        )),
        None => app,
    }
}

/// Refuses a request that would open an MCP session (one without `Mcp-Session-Id`) while
/// `max` are live.
async fn cap_sessions(
    State((sessions, max)): State<(Arc<LocalSessionManager>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    let opens = request.method() == axum::http::Method::POST
        && !request.headers().contains_key("mcp-session-id");
    if opens && sessions.sessions.read().await.len() >= max {
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("this server holds its most MCP sessions ({max}); retry when one closes"),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    }
    next.run(request).await
}

/// Serves `tool` on `listener` until `shutdown` is cancelled.
///
/// # Errors
///
/// When serving fails.
pub async fn serve(
    tool: Arc<PythonTool>,
    config: &HttpConfig,
    token: Option<String>,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(tool, config, token, shutdown.clone());
    let stop = async move { shutdown.cancelled().await };
    crate::listener::serve(app, listener, config, stop, || {}).await
}

/// The URL of the MCP endpoint on `addr`.
pub fn endpoint(addr: SocketAddr) -> String {
    format!("http://{addr}{MCP_PATH}")
}

/// True when `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub(crate) fn carries_token(headers: &axum::http::HeaderMap, token: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

async fn require_token(State(token): State<Arc<String>>, request: Request, next: Next) -> Response {
    if carries_token(request.headers(), &token) {
        return next.run(request).await;
    }
    let mut response = (StatusCode::UNAUTHORIZED, "a bearer token is required").into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

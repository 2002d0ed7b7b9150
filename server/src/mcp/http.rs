//! MCP over streamable HTTP at `/mcp`, on axum, with rmcp's transport.
//!
//! What guards the listener, in one place ([`router`]):
//!
//! * `Host` and a browser's `Origin` pass the door `pycage serve` has too
//!   (the `front_door` module: `localhost`, an IP address or one of
//!   [`HttpConfig::allowed_hosts`]; a loopback origin or one of
//!   [`HttpConfig::allowed_origins`]; 403 otherwise), before the token is read;
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
use tokio_util::sync::CancellationToken;

use crate::config::HttpConfig;
use crate::front_door;
use crate::mcp::McpServer;
use crate::python::PythonTool;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

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
    // `Host` and `Origin` are checked by the door both servers share (`guard` below), so
    // rmcp's own lists are off.
    let transport = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
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
    let app = match token {
        Some(token) => app.layer(middleware::from_fn_with_state(
            front_door::Token::new(token, crate::listener::plain_refusal),
            front_door::require_token,
        )),
        None => app,
    };
    app.layer(middleware::from_fn_with_state(
        front_door::Guard::of(config, crate::listener::plain_refusal),
        front_door::guard,
    ))
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

//! The streamable HTTP listener's guards, through the router as axum serves it: the bearer
//! token, `Host` and `Origin` (DNS rebinding), and the body cap. (Real clients drive the
//! listener end to end in the CLI's interop test.)

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use pycage_server::mcp::http::{MCP_PATH, router};
use pycage_server::{HttpConfig, PythonTool, ServerConfig};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

async fn app(token: Option<&str>, max_body_bytes: usize) -> axum::Router {
    let tool = Arc::new(PythonTool::start(&ServerConfig::default()).await.unwrap());
    let config = HttpConfig {
        max_body_bytes,
        allowed_origins: vec!["https://app.example:443".into()],
        ..HttpConfig::default()
    };
    router(
        tool,
        &config,
        token.map(str::to_owned),
        CancellationToken::new(),
    )
}

fn post() -> axum::http::request::Builder {
    post_to("127.0.0.1:8080")
}

fn post_to(host: &str) -> axum::http::request::Builder {
    Request::post(MCP_PATH)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
}

async fn status(app: &axum::Router, request: Request<Body>) -> StatusCode {
    app.clone().oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn a_token_is_required_and_compared_whole() {
    let app = app(Some("s3cret"), 4 << 20).await;
    let without = post().body(Body::from(INITIALIZE)).unwrap();
    let response = app.clone().oneshot(without).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    for wrong in [
        "Bearer s3cre",
        "Bearer s3cret2",
        "Basic s3cret",
        "s3cret",
        "Bearer ",
    ] {
        let request = post()
            .header(header::AUTHORIZATION, wrong)
            .body(Body::from(INITIALIZE))
            .unwrap();
        assert_eq!(
            status(&app, request).await,
            StatusCode::UNAUTHORIZED,
            "{wrong}"
        );
    }
    let right = post()
        .header(header::AUTHORIZATION, "Bearer s3cret")
        .body(Body::from(INITIALIZE))
        .unwrap();
    assert_eq!(status(&app, right).await, StatusCode::OK);
}

#[tokio::test]
async fn a_foreign_host_or_origin_is_refused() {
    let app = app(None, 4 << 20).await;
    let evil_host = post_to("evil.example")
        .body(Body::from(INITIALIZE))
        .unwrap();
    assert_eq!(status(&app, evil_host).await, StatusCode::FORBIDDEN);
    let evil_origin = post()
        .header(header::ORIGIN, "http://evil.example")
        .body(Body::from(INITIALIZE))
        .unwrap();
    assert_eq!(status(&app, evil_origin).await, StatusCode::FORBIDDEN);
    for origin in ["http://localhost:3000", "https://app.example:443"] {
        let allowed = post()
            .header(header::ORIGIN, origin)
            .body(Body::from(INITIALIZE))
            .unwrap();
        assert_eq!(status(&app, allowed).await, StatusCode::OK, "{origin}");
    }
    let no_origin = post().body(Body::from(INITIALIZE)).unwrap();
    assert_eq!(status(&app, no_origin).await, StatusCode::OK);
    let localhost = post_to("localhost:9").body(Body::from(INITIALIZE)).unwrap();
    assert_eq!(status(&app, localhost).await, StatusCode::OK);
}

#[tokio::test]
async fn a_body_past_the_cap_is_refused() {
    let app = app(None, 1024).await;
    let padding = " ".repeat(2048);
    let big = format!("{INITIALIZE}{padding}");
    let request = post().body(Body::from(big.clone())).unwrap();
    assert_eq!(status(&app, request).await, StatusCode::PAYLOAD_TOO_LARGE);
    let small = post().body(Body::from(INITIALIZE)).unwrap();
    assert_eq!(status(&app, small).await, StatusCode::OK);
}

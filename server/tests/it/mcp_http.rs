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

/// The listener on a real loopback socket with `config`; its address.
async fn listen(config: HttpConfig) -> String {
    let tool = Arc::new(PythonTool::start(&ServerConfig::default()).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        pycage_server::mcp::http::serve(tool, &config, None, listener, CancellationToken::new())
            .await
            .unwrap()
    });
    addr
}

/// Issue 37, hole 7: a half-sent header is closed (it stayed open 40 s), and a body
/// trickled a byte at a time is ended at the body deadline, counted from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_cut_off() {
    let addr = listen(HttpConfig {
        header_read_timeout: std::time::Duration::from_millis(500),
        body_read_timeout: std::time::Duration::from_secs(1),
        ..HttpConfig::default()
    })
    .await;
    let held = crate::slow_client::stall_headers(&addr).await;
    assert!(held < std::time::Duration::from_secs(20), "{held:?}");
    let head = "POST /mcp HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n\
                accept: application/json, text/event-stream\r\ncontent-length: 1000\r\n\r\n";
    let (held, answer) = crate::slow_client::trickle(&addr, head).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{held:?}: {answer}");
    assert!(held < std::time::Duration::from_secs(20), "{held:?}");
}

/// Issue 37, hole 7: MCP sessions are capped (300 of 300 `initialize` were accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_are_capped() {
    let addr = listen(HttpConfig {
        max_mcp_sessions: 2,
        ..HttpConfig::default()
    })
    .await;
    pycage_tools::net::install_crypto_provider();
    let client = reqwest::Client::new();
    let initialize = || {
        client
            .post(format!("http://{addr}{MCP_PATH}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(INITIALIZE)
            .send()
    };
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let r = initialize().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        sessions.push(r.headers()["mcp-session-id"].to_str().unwrap().to_owned());
    }
    let refused = initialize().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(header::RETRY_AFTER));
    // Closing one makes room.
    let closed = client
        .delete(format!("http://{addr}{MCP_PATH}"))
        .header("mcp-session-id", &sessions[0])
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    assert_eq!(initialize().await.unwrap().status(), StatusCode::OK);
}

/// Issue 37, hole 3: one client (an MCP session) keeps at most its share of the suspended
/// runs, so another client's gated run is still kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mcp_session_keeps_at_most_its_share_of_suspended_runs() {
    use rmcp::ServiceExt as _;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;

    let config = ServerConfig::from_toml(
        "[policy]\nallow = [\"echo\"]\napprove = [\"echo\"]\n\
         [suspended]\nmax_runs = 8\nmax_runs_per_client = 2\n",
    )
    .unwrap();
    let tool = Arc::new(PythonTool::start(&config).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let http = config.http.clone();
    tokio::spawn(async move {
        pycage_server::mcp::http::serve(tool, &http, None, listener, CancellationToken::new())
            .await
            .unwrap()
    });
    pycage_tools::net::install_crypto_provider();
    let connect = || async {
        let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}{MCP_PATH}"));
        ().serve(transport).await.unwrap()
    };
    let gated = || {
        let code = serde_json::json!({"code": "return await echo(text='go')"});
        let serde_json::Value::Object(arguments) = code else {
            unreachable!()
        };
        CallToolRequestParams::new("run_python").with_arguments(arguments)
    };
    let status = |r: &rmcp::model::CallToolResult| {
        let s = r.structured_content.clone().unwrap_or_default();
        (
            s["status"].as_str().unwrap_or("").to_owned(),
            s["error"]["kind"].clone(),
            s,
        )
    };
    let greedy = connect().await;
    for _ in 0..2 {
        let r = greedy.call_tool(gated()).await.unwrap();
        let (state, _, s) = status(&r);
        assert_eq!(state, "suspended", "{s:#}");
    }
    let r = greedy.call_tool(gated()).await.unwrap();
    let (_, kind, s) = status(&r);
    assert_eq!(kind, "busy", "{s:#}");
    assert!(
        s["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this client"),
        "{s:#}"
    );
    let other = connect().await;
    let r = other.call_tool(gated()).await.unwrap();
    let (state, _, s) = status(&r);
    assert_eq!(state, "suspended", "another client is not shut out: {s:#}");
    let _ = greedy.cancel().await;
    let _ = other.cancel().await;
}

//! The `servers` category: the attacks that found issue 37's holes, against both servers'
//! HTTP listeners (`pycage serve`'s API and `pycage mcp --listen`), each on a real loopback
//! socket with a token, started in process as the CLI starts them. Each attack checks that the
//! protection it targets held, and that no canary is in anything the attacker got back.
//!
//! Code goes in through each server's own client path: reqwest for the HTTP API, rmcp's
//! streamable HTTP client for MCP. The listener attacks (foreign `Host`, foreign `Origin`, no
//! token, slow headers, a trickled body, a session flood) speak HTTP directly, as an attacker
//! would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pycage_server::http::{self as api, HttpApi};
use pycage_server::{PythonTool, ServerConfig};
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::canaries::{self, Canaries};
use crate::slow_client;

/// The bearer token both servers are started with.
const TOKEN: &str = "adversarial-servers-token";

/// The attacks, each run against both servers.
pub const ATTACKS: &[&str] = &[
    "dns_rebinding_host",
    "cross_site_origin",
    "no_token",
    "slow_headers",
    "trickled_body",
    "env_secret_via_command_tool",
    "secret_reflected_encoded_or_partial",
    "secret_in_a_redirect",
    "oversized_suspended_state",
    "resume_widens_limits",
    "model_approves_itself",
    "session_flood",
];

/// The two servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Http,
    Mcp,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Http => "servers (http)",
            Server::Mcp => "servers (mcp)",
        }
    }
}

/// A server listening, and what its attacks need.
pub struct Listening {
    server: Server,
    addr: String,
    net: Arc<NetTargets>,
    stop: CancellationToken,
    /// The approval codes the MCP server showed its person (as `pycage mcp` does on stderr).
    codes: Arc<Mutex<Vec<String>>>,
    /// The tools file, the token file: alive as long as the server.
    _dir: tempfile::TempDir,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The hosts `net.fetch` may reach: `bound`, which the secret (the environment canary's
/// value) is bound to and which reflects what it gets, and `other`, allowed but not bound,
/// which notes every request it sees.
pub struct NetTargets {
    bound: u16,
    other: u16,
    seen_by_other: Mutex<Vec<String>>,
}

/// Starts the two loopback hosts `net.fetch` may reach.
pub async fn net_targets() -> Arc<NetTargets> {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (bound, other) = (bind().await, bind().await);
    let targets = Arc::new(NetTargets {
        bound: bound.local_addr().unwrap().port(),
        other: other.local_addr().unwrap().port(),
        seen_by_other: Mutex::new(Vec::new()),
    });
    let other_port = targets.other;
    let auth = |h: &HeaderMap| {
        h.get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let reflect = axum::Router::new()
        .route(
            "/reflect",
            axum::routing::get(move |h: HeaderMap| async move {
                let value = auth(&h);
                let asked = |name| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
                if asked(header::ACCEPT_ENCODING).contains("gzip") {
                    let hidden: String = value.chars().rev().collect();
                    return ([(header::CONTENT_ENCODING, "gzip")], hidden).into_response();
                }
                if !asked(header::RANGE).is_empty() {
                    let half = value[..value.len() / 2].to_owned();
                    return (StatusCode::PARTIAL_CONTENT, half).into_response();
                }
                value.into_response()
            }),
        )
        .route(
            "/encoded",
            axum::routing::get(move |h: HeaderMap| async move {
                let hidden: String = auth(&h).chars().rev().collect();
                ([(header::CONTENT_ENCODING, "gzip")], hidden)
            }),
        )
        .route(
            "/leak",
            axum::routing::get(move |h: HeaderMap| async move {
                let to = format!("http://127.0.0.1:{other_port}/sink?k={}", auth(&h));
                (StatusCode::FOUND, [(header::LOCATION, to)])
            }),
        );
    let noted = targets.clone();
    let sink = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let noted = noted.clone();
        async move {
            let line = format!("{} {:?}", request.uri(), request.headers());
            noted
                .seen_by_other
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line);
            "sink"
        }
    });
    tokio::spawn(async move { axum::serve(bound, reflect).await });
    tokio::spawn(async move { axum::serve(other, sink).await });
    targets
}

/// `server` listening on loopback with the category's configuration.
pub async fn start(server: Server, net: Arc<NetTargets>) -> Result<Listening, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let tools = dir.path().join("tools.toml");
    // A command tool that prints the environment canary if it has it.
    let leak = format!(
        "[[tool]]\nname = \"env\"\nnamespace = \"leak\"\ndescription = \"prints a variable\"\n\
         command = [\"/bin/sh\", \"-c\", \"printf '{{\\\"v\\\": \\\"%s\\\"}}' \\\"${}\\\"\"]\n",
        canaries::ENV_NAME
    );
    std::fs::write(&tools, leak).map_err(|e| e.to_string())?;
    let toml = format!(
        "tools = [{tools:?}]\n\
         [policy]\nallow = [\"echo\", \"add\", \"net.fetch\", \"leak.env\"]\napprove = [\"echo\"]\n\
         [limits]\nmax_tool_calls = 50\n\
         [net]\nallow = [\"127.0.0.1:{bound}\", \"127.0.0.1:{other}\"]\n\
         allow_addresses = [\"127.0.0.1/32\"]\n\
         [[net.secrets]]\nname = \"CANARY\"\nenv = \"{env}\"\nhosts = [\"127.0.0.1:{bound}\"]\n\
         [suspended]\nmax_run_bytes = 100000\n\
         [http]\nheader_read_timeout = \"1s\"\nbody_read_timeout = \"1s\"\nmax_mcp_sessions = 16\n",
        tools = tools.display().to_string(),
        bound = net.bound,
        other = net.other,
        env = canaries::ENV_NAME,
    );
    let config = ServerConfig::from_toml(&toml)?;
    config.validate().map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let stop = CancellationToken::new();
    let token = Some(TOKEN.to_owned());
    let codes = Arc::new(Mutex::new(Vec::new()));
    match server {
        Server::Http => {
            let served = Arc::new(HttpApi::start(&config).await.map_err(|e| e.to_string())?);
            let stopped = stop.clone();
            tokio::spawn(async move {
                let stop = async move { stopped.cancelled().await };
                api::serve(served, &config.http, token, listener, stop).await
            });
        }
        Server::Mcp => {
            let shown = codes.clone();
            let tool = PythonTool::start(&config)
                .await
                .map_err(|e| e.to_string())?
                .with_approval_channel(move |notice| {
                    let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
                    shown.push(notice.code.clone());
                });
            let tool = Arc::new(tool);
            let stopped = stop.clone();
            tokio::spawn(async move {
                pycage_server::mcp::http::serve(tool, &config.http, token, listener, stopped).await
            });
        }
    }
    Ok(Listening {
        server,
        addr,
        net,
        stop,
        codes,
        _dir: dir,
    })
}

/// Runs the attack `name` on `l`.
pub async fn attack(l: &Listening, name: &str) -> Result<(), String> {
    match name {
        "dns_rebinding_host" => refused(l, Some("attacker.example"), None, true, 403).await,
        "cross_site_origin" => {
            refused(l, None, Some("http://attacker.example:8080"), true, 403).await
        }
        "no_token" => refused(l, None, None, false, 401).await,
        "slow_headers" => slow_headers(l).await,
        "trickled_body" => trickled_body(l).await,
        "env_secret_via_command_tool" => {
            let (value, whole) = run(l, json!({"code": "return await leak.env()"})).await?;
            Canaries::check_text(&whole, "the answer")?;
            expect(
                value["value"] == json!({"v": ""}),
                "the tool saw no canary",
                &whole,
            )
        }
        "secret_reflected_encoded_or_partial" => reflected(l).await,
        "secret_in_a_redirect" => redirect(l).await,
        "oversized_suspended_state" => {
            let code = "await echo(text='x' * 150000)";
            let (value, whole) = run(l, json!({"code": code})).await?;
            Canaries::check_text(&whole, "the answer")?;
            expect(
                value["error"]["kind"] == "tool_call_limit" && value["run_id"].is_null(),
                "a state over max_run_bytes is not kept (tool_call_limit)",
                &whole,
            )
        }
        "resume_widens_limits" => resume_widens(l).await,
        "model_approves_itself" => approves_itself(l).await,
        "session_flood" => session_flood(l).await,
        other => Err(format!("no attack `{other}`")),
    }
}

fn expect(held: bool, what: &str, got: &str) -> Result<(), String> {
    if held {
        Ok(())
    } else {
        Err(format!("expected {what}, got {}", clip(got)))
    }
}

fn clip(text: &str) -> String {
    text.chars().take(400).collect()
}

/// The path a request to `l` goes to: a run (HTTP) or an `initialize` (MCP), with its body.
fn front_request(l: &Listening) -> (&'static str, String) {
    match l.server {
        Server::Http => ("/v1/runs", json!({"code": "return 1"}).to_string()),
        Server::Mcp => (
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "attacker", "version": "0"}}})
            .to_string(),
        ),
    }
}

fn client() -> reqwest::Client {
    pycage_tools::net::install_crypto_provider();
    reqwest::Client::new()
}

/// A front-door request with `host`, `origin` and the token or not must get `status`.
async fn refused(
    l: &Listening,
    host: Option<&str>,
    origin: Option<&str>,
    with_token: bool,
    status: u16,
) -> Result<(), String> {
    let (path, body) = front_request(l);
    let mut request = client()
        .post(format!("http://{}{path}", l.addr))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(host) = host {
        request = request.header("host", host);
    }
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    if with_token {
        request = request.bearer_auth(TOKEN);
    }
    let r = request.send().await.map_err(|e| e.to_string())?;
    let got = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    Canaries::check_text(&text, "the refusal")?;
    expect(
        got == status,
        &format!("{status}"),
        &format!("{got} {text}"),
    )
}

/// Half a request line, then nothing: closed within the header timeout (1 s) and a margin.
async fn slow_headers(l: &Listening) -> Result<(), String> {
    let held = slow_client::stall_headers(&l.addr).await;
    expect(
        held < Duration::from_secs(15),
        "the connection closed within 15 s",
        &format!("open for {held:?}"),
    )
}

/// A body promised at 1,000 bytes and trickled a byte every 100 ms: 408 at the body
/// deadline (1 s), not kept alive by the trickle.
async fn trickled_body(l: &Listening) -> Result<(), String> {
    let (path, _) = front_request(l);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         content-length: 1000\r\n\r\n"
    );
    let (held, answer) = slow_client::trickle(&l.addr, &head).await;
    expect(
        answer.starts_with("HTTP/1.1 408") && held < Duration::from_secs(15),
        "408 within 15 s",
        &format!("after {held:?}: {answer}"),
    )
}

/// `arguments` as one run (`POST /v1/runs`, or `run_python`); the result's JSON and the
/// whole answer as text.
async fn run(l: &Listening, arguments: Value) -> Result<(Value, String), String> {
    call(l, "run_python", arguments).await
}

/// A tool call of the MCP server (`run_python`, `resume_run`), or the HTTP route that does
/// the same; the result's JSON and the whole answer as text.
async fn call(l: &Listening, tool: &str, arguments: Value) -> Result<(Value, String), String> {
    match l.server {
        Server::Http => {
            let path = match tool {
                "run_python" => "/v1/runs".to_owned(),
                _ => format!(
                    "/v1/runs/{}/resume",
                    arguments["run_id"].as_str().unwrap_or_default()
                ),
            };
            let mut body = arguments;
            if let Some(o) = body.as_object_mut() {
                o.remove("run_id");
            }
            let r = client()
                .post(format!("http://{}{path}", l.addr))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let text = r.text().await.map_err(|e| e.to_string())?;
            let value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
            Ok((value, text))
        }
        Server::Mcp => {
            let config =
                StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", l.addr))
                    .auth_header(TOKEN);
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = ().serve(transport).await.map_err(|e| e.to_string())?;
            let Value::Object(arguments) = arguments else {
                return Err("arguments must be an object".into());
            };
            let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
            let response = client.call_tool(params).await.map_err(|e| e.to_string());
            let _ = client.cancel().await;
            let response = response?;
            let whole = serde_json::to_string(&response).unwrap_or_default();
            let value = response.structured_content.unwrap_or(Value::Null);
            Ok((value, whole))
        }
    }
}

/// The bound host, asked for gzip, a range, or answering encoded: the code never gets the
/// value back, and the answers it cannot redact fail.
async fn reflected(l: &Listening) -> Result<(), String> {
    let url = |path: &str| format!("http://127.0.0.1:{}{path}", l.net.bound);
    let code = format!(
        "out = []\n\
         for h in [{{'Accept-Encoding': 'gzip'}}, {{'Range': 'bytes=0-9'}}]:\n    \
             h['Authorization'] = 'PYCAGE_SECRET_CANARY'\n    \
             out.append(fetch_sync('{reflect}', headers=h)['body'])\n\
         try:\n    fetch_sync('{encoded}', headers={{'Authorization': 'PYCAGE_SECRET_CANARY'}})\n    \
             out.append('read')\n\
         except ToolError as e:\n    out.append(str(e))\n\
         return out",
        reflect = url("/reflect"),
        encoded = url("/encoded"),
    );
    let (value, whole) = run(l, json!({"code": code})).await?;
    Canaries::check_text(&whole, "the answer")?;
    let reversed: String = canaries::env_value().chars().rev().collect();
    if whole.contains(&reversed) {
        return Err(format!(
            "the encoded canary reached the answer: {}",
            clip(&whole)
        ));
    }
    let out = &value["value"];
    expect(
        out[0] == "PYCAGE_SECRET_CANARY"
            && out[1] == "PYCAGE_SECRET_CANARY"
            && out[2]
                .as_str()
                .is_some_and(|m| m.contains("so the secret can be redacted")),
        "plain, whole answers and a refused encoded one",
        &whole,
    )
}

/// The bound host redirects to the other one with the value it got in the URL: the value
/// does not go there.
async fn redirect(l: &Listening) -> Result<(), String> {
    let code = format!(
        "try:\n    fetch_sync('http://127.0.0.1:{}/leak', headers={{'Authorization': \
         'PYCAGE_SECRET_CANARY'}})\n    return 'followed'\n\
         except ToolError as e:\n    return str(e)",
        l.net.bound
    );
    let (_, whole) = run(l, json!({"code": code})).await?;
    Canaries::check_text(&whole, "the answer")?;
    let seen = l
        .net
        .seen_by_other
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join("\n");
    Canaries::check_text(&seen, "the host the secret is not bound to")
}

/// A run narrowed to 2 tool calls stops for approval; approved, it still has 2.
async fn resume_widens(l: &Listening) -> Result<(), String> {
    let code = "await echo(text='go')\nn = 0\n\
                try:\n    for _ in range(5):\n        await add(a=1, b=1)\n        n += 1\n\
                except ToolError:\n    pass\nreturn n";
    let (paused, whole) = run(l, json!({"code": code, "limits": {"max_tool_calls": 2}})).await?;
    let Some(id) = paused["run_id"].as_str() else {
        return Err(format!("the run did not suspend: {}", clip(&whole)));
    };
    let (done, whole) = call(l, "resume_run", approval(l, id)).await?;
    Canaries::check_text(&whole, "the answer")?;
    expect(
        done["value"] == 1,
        "1 add after approval (2 calls in all)",
        &whole,
    )
}

/// A person's approval of the run `id`: over HTTP the token the host application holds (the
/// request carries it); over MCP the code the server showed the person.
fn approval(l: &Listening, id: &str) -> Value {
    let code = l
        .codes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .last()
        .cloned();
    match l.server {
        Server::Http => json!({"run_id": id, "decision": "approve"}),
        Server::Mcp => json!({"run_id": id, "decision": "approve", "approval_code": code}),
    }
}

/// The code's own caller approves the call that waits for a person: over MCP a `resume_run`
/// with `approve` or a forged `answer` and no code; over HTTP a resume without the token.
/// Refused, the gated call does not run; the person's approval still goes through.
async fn approves_itself(l: &Listening) -> Result<(), String> {
    let code = "r = await echo(text='ran')\nreturn r['text']";
    let (paused, whole) = run(l, json!({"code": code})).await?;
    let Some(id) = paused["run_id"].as_str() else {
        return Err(format!("the run did not suspend: {}", clip(&whole)));
    };
    match l.server {
        Server::Mcp => {
            for forged in [
                json!({"run_id": id, "decision": "approve"}),
                json!({"run_id": id, "decision": "answer", "answer": {"text": "forged"}}),
            ] {
                let (refused, whole) = call(l, "resume_run", forged).await?;
                expect(
                    refused["error"]["kind"] == "capability_denied",
                    "capability_denied",
                    &whole,
                )?;
            }
        }
        Server::Http => {
            let r = client()
                .post(format!("http://{}/v1/runs/{id}/resume", l.addr))
                .json(&json!({"decision": "approve"}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            expect(status == 401, "401", &status.to_string())?;
        }
    }
    let (done, whole) = call(l, "resume_run", approval(l, id)).await?;
    expect(
        done["value"] == "ran",
        "the run waited on and the person's approval ran it",
        &whole,
    )
}

/// Sessions opened until refused: the cap holds (HTTP: `[sessions]`, 16; MCP: 16).
async fn session_flood(l: &Listening) -> Result<(), String> {
    let client = client();
    for opened in 0..=32 {
        // HTTP: no body and no Content-Type, as a cross-site form would send it.
        let request = match l.server {
            Server::Http => client.post(format!("http://{}/v1/sessions", l.addr)),
            Server::Mcp => {
                let (path, body) = front_request(l);
                client
                    .post(format!("http://{}{path}", l.addr))
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(body)
            }
        };
        let r = request
            .bearer_auth(TOKEN)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        if status == 429 || status == 503 {
            return expect(opened <= 16, "refused by the 16th", &format!("{opened}"));
        }
        if !r.status().is_success() {
            return Err(format!("session {opened}: {status}"));
        }
    }
    Err("33 sessions opened; no cap".into())
}

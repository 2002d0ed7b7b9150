//! A small MCP server on stdio, built on rmcp, that pycage's code-mode tests use as an
//! upstream (and a starting point for trying `pycage mcp --upstream`):
//!
//! - `add(a, b)`: structured `{"sum": a + b}`;
//! - `echo(text)`: the text back as a text block;
//! - `get-sum(a, b)`: as `add`, under a name that is not a Python identifier;
//! - `fail(message)`: a tool error (`isError: true`) carrying the message;
//! - `secret()`: a tool a policy should never let the code reach;
//! - `calls()`: how many times this process has run each tool;
//! - `crash()`: the process exits in the middle of the call;
//! - `hang()`: never answers;
//! - `garbage()`: writes a line that is not JSON-RPC to stdout, then never answers.
//!
//! With `--http ADDR` it serves the same tools over streamable HTTP at `http://ADDR/mcp`
//! instead (port 0 picks one), printing `listening URL` on stdout first; `crash()` then ends
//! the whole server.
//!
//! ```sh
//! cargo run -p pycage-server --example upstream_fixture
//! cargo run -p pycage-server --example upstream_fixture -- --http 127.0.0.1:0
//! ```
#![allow(clippy::print_stdout, reason = "garbage() writes to stdout on purpose")]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct Fixture {
    calls: Arc<Mutex<BTreeMap<String, u64>>>,
}

fn schema(properties: Value) -> Arc<JsonObject> {
    let Value::Object(map) = json!({"type": "object", "properties": properties}) else {
        unreachable!("a literal object")
    };
    Arc::new(map)
}

fn tools() -> Vec<Tool> {
    let numbers = json!({"a": {"type": "integer"}, "b": {"type": "integer"}});
    vec![
        Tool::new("add", "Adds two integers", schema(numbers.clone())),
        Tool::new(
            "echo",
            "Echoes the text",
            schema(json!({"text": {"type": "string"}})),
        ),
        Tool::new("get-sum", "Adds two integers", schema(numbers)),
        Tool::new(
            "fail",
            "Fails with the message",
            schema(json!({"message": {"type": "string"}})),
        ),
        Tool::new("secret", "Returns a secret", schema(json!({}))),
        Tool::new(
            "getenv",
            "This process's environment variable `name`, or null",
            schema(json!({"name": {"type": "string"}})),
        ),
        Tool::new("calls", "Counts this process's calls", schema(json!({}))),
        Tool::new("crash", "Exits mid-call", schema(json!({}))),
        Tool::new("hang", "Never answers", schema(json!({}))),
        Tool::new("garbage", "Writes junk to stdout", schema(json!({}))),
    ]
}

fn int(args: &JsonObject, key: &str) -> Result<i64, ErrorData> {
    args.get(key)
        .and_then(Value::as_i64)
        .ok_or_else(|| ErrorData::invalid_params(format!("`{key}` must be an integer"), None))
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("upstream-fixture", "0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let name = request.name.to_string();
        let counts = {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            *calls.entry(name.clone()).or_default() += 1;
            calls.clone()
        };
        let structured = |v: Value| {
            let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
            r.structured_content = Some(v);
            r
        };
        let result = match name.as_str() {
            "add" | "get-sum" => structured(json!({"sum": int(&args, "a")? + int(&args, "b")?})),
            "echo" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
            "fail" => {
                let message = args.get("message").and_then(Value::as_str).unwrap_or("no");
                CallToolResult::error(vec![ContentBlock::text(message)])
            }
            "secret" => structured(json!({"secret": "CANARY-UPSTREAM-SECRET"})),
            "getenv" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
                structured(json!({"value": std::env::var(name).ok()}))
            }
            "calls" => structured(json!(counts)),
            "crash" => std::process::exit(3),
            "garbage" => {
                {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(b"this is not JSON-RPC\n{\"jsonrpc\": 7}\n");
                    let _ = out.flush();
                }
                std::future::pending().await
            }
            "hang" => std::future::pending().await,
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool `{other}`"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            let running = Fixture::default().serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        [flag, addr] if flag == "--http" => serve_http(addr).await?,
        _ => return Err("usage: upstream_fixture [--http ADDR]".into()),
    }
    Ok(())
}

async fn serve_http(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let fixture = Fixture::default();
    let service = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening http://{}/mcp", listener.local_addr()?);
    std::io::stdout().flush()?;
    axum::serve(listener, app).await?;
    Ok(())
}

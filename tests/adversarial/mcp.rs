//! The tool-abuse category again, through `pycage mcp`'s server: each case's code goes in as
//! a `run_python` call from rmcp's client, over an in-process pipe, to the same
//! `pycage_server::McpServer` the CLI serves, on a runner with the case's tools, policy and
//! limits. What the client gets back is checked as the library's result is: the case's
//! expectation, and no canary anywhere in the whole MCP response.

use std::sync::Arc;

use pycage::{Limits, RunResult, Runner};
use pycage_server::{PythonTool, ServerConfig, mcp::McpServer};
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value, json};

/// Runs `code` as one `run_python` call through the MCP server; the result as the library
/// reports it (from `structuredContent`) and the whole response as JSON text.
pub async fn run(
    runner: Runner,
    limits: Limits,
    code: &str,
) -> Result<(RunResult, String), String> {
    let tool = PythonTool::with_runner(runner, &ServerConfig::default(), limits)
        .await
        .map_err(|e| format!("the MCP server's tool did not start: {e}"))?;
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move {
        if let Ok(running) = McpServer::new(Arc::new(tool)).serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    let client = ()
        .serve(client_end)
        .await
        .map_err(|e| format!("the MCP client did not connect: {e}"))?;
    let mut arguments = Map::new();
    arguments.insert("code".into(), json!(code));
    let response = client
        .call_tool(CallToolRequestParams::new("run_python").with_arguments(arguments))
        .await
        .map_err(|e| format!("run_python failed as a protocol call: {e}"))?;
    let _ = client.cancel().await;
    server.abort();
    let whole = serde_json::to_string(&response).unwrap_or_default();
    let Some(Value::Object(mut structured)) = response.structured_content else {
        return Err(format!("no structuredContent in {whole}"));
    };
    // The library's field names; what the server adds (files as listed, the session,
    // clamping, the status) the cases do not use.
    for extra in [
        "files",
        "session_id",
        "clamped",
        "status",
        "run_id",
        "pending",
    ] {
        structured.remove(extra);
    }
    let result: RunResult = serde_json::from_value(Value::Object(structured))
        .map_err(|e| format!("structuredContent is not a run result: {e}: {whole}"))?;
    if response.is_error != Some(!result.ok) {
        return Err(format!(
            "isError is {:?} for a result with ok={}",
            response.is_error, result.ok
        ));
    }
    Ok((result, whole))
}

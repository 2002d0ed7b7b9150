//! The MCP server's rows, each from a real client (rmcp's) to the result: `run_python` of
//! `print('hi')` through `pycage mcp` on stdio against the same run through the library;
//! the same over streamable HTTP with 1 and 16 concurrent clients; and a call from the code
//! to an upstream MCP server's tool against a call to a built-in tool.

use std::process::Stdio;
use std::time::Instant;

use pycage::{RunRequest, Runner};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

use super::cases::{check, idle, us};
use super::{Baseline, Figure, Row, Settings, Summary};

/// `mcp_stdio_print_hi`: the client's round trip through a `pycage mcp` child, interleaved
/// with the library's fresh run of the same code, so the difference is what MCP costs.
pub async fn stdio_row(s: &Settings, fresh: &Runner) -> Result<Row, String> {
    let command = tokio::process::Command::new(&s.pycage_exe).configure(|c| {
        c.arg("mcp");
    });
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start pycage mcp: {e}"))?;
    let client = ().serve(transport).await.map_err(|e| e.to_string())?;
    let Value::Object(arguments) = json!({"code": "print('hi')"}) else {
        unreachable!("a literal object")
    };
    let call = || CallToolRequestParams::new("run_python").with_arguments(arguments.clone());
    let one = async || -> Result<f64, String> {
        let t = Instant::now();
        let r = client.call_tool(call()).await.map_err(|e| e.to_string())?;
        let took = us(t.elapsed());
        if r.is_error != Some(false) {
            return Err(format!("an MCP benchmark call failed: {r:?}"));
        }
        Ok(took)
    };
    for _ in 0..s.iterations.min(20) {
        one().await?; // warm-up
    }
    let (mut over_mcp, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..s.iterations {
        idle(s).await;
        over_mcp.push(one().await?);
        let t = Instant::now();
        check(fresh.run_request(RunRequest::new("print('hi')")).await)?;
        direct.push(us(t.elapsed()));
    }
    let _ = client.cancel().await;
    Ok(Row {
        case: "mcp_stdio_print_hi",
        unit: "us",
        pycage: Figure::Latency(Summary::of(over_mcp)),
        baseline: Some(Baseline {
            name: "the same run through the library (interleaved)".into(),
            figure: Figure::Latency(Summary::of(direct)),
        }),
        target: Some("p50 <= 1 ms"),
    })
}

type Client = RunningService<RoleClient, ()>;

fn code_arguments(code: &str) -> JsonObject {
    let Value::Object(arguments) = json!({ "code": code }) else {
        unreachable!("a literal object")
    };
    arguments
}

/// One `run_python` call of `code`; its round trip in microseconds.
async fn call(client: &Client, code: &str) -> Result<f64, String> {
    let request = CallToolRequestParams::new("run_python").with_arguments(code_arguments(code));
    let t = Instant::now();
    let r = client.call_tool(request).await.map_err(|e| e.to_string())?;
    let took = us(t.elapsed());
    if r.is_error != Some(false) {
        return Err(format!("an MCP benchmark call failed: {r:?}"));
    }
    Ok(took)
}

/// A `pycage mcp` child serving streamable HTTP on a loopback port; killed when dropped.
struct HttpServer {
    _child: tokio::process::Child,
    url: String,
}

async fn http_server(s: &Settings, max_concurrent: usize) -> Result<HttpServer, String> {
    let mut child = tokio::process::Command::new(&s.pycage_exe)
        .args(["mcp", "--listen", "127.0.0.1:0", "--max-concurrent"])
        .arg(max_concurrent.to_string())
        .args(["--queue-timeout", "60s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start pycage mcp --listen: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(url) = line.strip_prefix("pycage: serving MCP at ") {
            let url = url.to_owned();
            // Keep draining stderr so the child never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok(HttpServer { _child: child, url });
        }
    }
    Err("pycage mcp --listen ended before it said where it listens".into())
}

/// `mcp_http_print_hi_cN` and `mcp_http_runs_per_s_cN` for N = 1 and 16: N clients, each its
/// own MCP session over streamable HTTP, calling `run_python` back to back for the
/// benchmark's duration; the latency of every call and the calls completed per second.
pub async fn http_rows(s: &Settings) -> Result<Vec<Row>, String> {
    const CODE: &str = "print('hi')";
    let server = http_server(s, 16).await?;
    let mut rows = Vec::new();
    for (clients, latency_case, rate_case) in [
        (1, "mcp_http_print_hi_c1", "mcp_http_runs_per_s_c1"),
        (16, "mcp_http_print_hi_c16", "mcp_http_runs_per_s_c16"),
    ] {
        let mut connected = Vec::with_capacity(clients);
        for _ in 0..clients {
            let transport = StreamableHttpClientTransport::from_uri(server.url.as_str());
            let client = ().serve(transport).await.map_err(|e| e.to_string())?;
            for _ in 0..5 {
                call(&client, CODE).await?; // warm-up
            }
            connected.push(client);
        }
        let started = Instant::now();
        let deadline = started + s.duration;
        let workers: Vec<_> = connected
            .into_iter()
            .map(|client| {
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while Instant::now() < deadline {
                        samples.push(call(&client, CODE).await?);
                    }
                    let _ = client.cancel().await;
                    Ok::<_, String>(samples)
                })
            })
            .collect();
        let mut samples = Vec::new();
        for worker in workers {
            samples.extend(worker.await.map_err(|e| e.to_string())??);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let rate = samples.len() as f64 / elapsed;
        rows.push(Row {
            case: latency_case,
            unit: "us",
            pycage: Figure::Latency(Summary::of(samples)),
            baseline: None,
            target: None,
        });
        rows.push(Row {
            case: rate_case,
            unit: "runs/s",
            pycage: Figure::Value(rate),
            baseline: None,
            target: None,
        });
    }
    Ok(rows)
}

/// `mcp_upstream_echo`: a `run_python` call whose code calls `up.echo(message=...)` on the
/// upstream `command` (an MCP server with that tool, such as the reference
/// `@modelcontextprotocol/server-everything`), through `pycage mcp` on stdio, interleaved
/// with one whose code calls the built-in `add`: the difference is the upstream round trip.
pub async fn upstream_row(s: &Settings, command: &str) -> Result<Row, String> {
    let upstream = format!("up={command}");
    let command = tokio::process::Command::new(&s.pycage_exe).configure(|c| {
        c.args([
            "mcp",
            "--upstream",
            &upstream,
            "--allow",
            "up.echo",
            "--allow",
            "add",
        ]);
    });
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start pycage mcp: {e}"))?;
    let client = ().serve(transport).await.map_err(|e| e.to_string())?;
    const UPSTREAM: &str = "return await up.echo(message='hi')";
    const BUILT_IN: &str = "return await add(a=1, b=2)";
    for _ in 0..s.iterations.min(20) {
        call(&client, UPSTREAM).await?; // warm-up
        call(&client, BUILT_IN).await?;
    }
    let (mut upstream, mut built_in) = (Vec::new(), Vec::new());
    for _ in 0..s.iterations {
        idle(s).await;
        upstream.push(call(&client, UPSTREAM).await?);
        built_in.push(call(&client, BUILT_IN).await?);
    }
    let _ = client.cancel().await;
    Ok(Row {
        case: "mcp_upstream_echo",
        unit: "us",
        pycage: Figure::Latency(Summary::of(upstream)),
        baseline: Some(Baseline {
            name: "the same call with the built-in `add` instead (interleaved)".into(),
            figure: Figure::Latency(Summary::of(built_in)),
        }),
        target: None,
    })
}

//! The MCP server's rows: `run_python` of `print('hi')` through `pycage mcp` on stdio, from
//! a real client (rmcp's) to the result, against the same run through the library.

use std::process::Stdio;
use std::time::Instant;

use pycage::{RunRequest, Runner};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::{Value, json};

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

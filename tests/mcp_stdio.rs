//! `pycage mcp` as an MCP client starts it: a child process speaking MCP on stdio, driven by
//! rmcp's client and by the official Python SDK's (`tests/interop/mcp_client.py`, in the
//! virtualenv `scripts/setup` makes). Its stdout must carry protocol messages only (a stray
//! line breaks the clients), with the flags and a `--config` file setting the sandbox.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod os_support;

use std::path::Path;
use std::process::Stdio;

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::{Value, json};

const SEED: &str = "total = 0\n\
                    for i in range(1, 6):\n    \
                        r = await add(a=str(total), b=str(i))\n    \
                        total = r['sum']\n\
                    return total";

fn call(code: &str) -> CallToolRequestParams {
    let Value::Object(arguments) = json!({"code": code}) else {
        unreachable!()
    };
    CallToolRequestParams::new("run_python").with_arguments(arguments)
}

#[tokio::test]
async fn pycage_mcp_serves_a_real_client_on_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pycage.toml");
    std::fs::write(&config, "[limits]\nwall_timeout = \"9s\"\n").unwrap();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pycage")).configure(|c| {
        c.arg("mcp")
            .arg("--config")
            .arg(&config)
            .args(["--allow", "add"]);
    });
    let (transport, _stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "pycage");
    let tools = client.list_all_tools().await.unwrap();
    let run = tools.iter().find(|t| t.name == "run_python").unwrap();
    let description = run.description.as_deref().unwrap();
    assert!(description.contains("Wall time: 9s"), "{description}");
    assert!(description.contains("async def add("), "{description}");
    let r = client.call_tool(call(SEED)).await.unwrap();
    let s = r.structured_content.unwrap();
    assert_eq!(
        (s["value"].clone(), s["tool_calls"].clone()),
        (json!(15), json!(5))
    );
    let denied = client
        .call_tool(call("return await call_tool('math.multiply', a=2, b=3)"))
        .await
        .unwrap();
    assert_eq!(denied.is_error, Some(true));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn pycage_mcp_refuses_an_unknown_config_key_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pycage.toml");
    std::fs::write(&config, "[limits]\nwall_timout = \"9s\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pycage"))
        .arg("mcp")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "stdout must stay the protocol's");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `wall_timout`"), "{stderr}");
}

#[test]
fn the_official_python_sdk_drives_pycage_mcp() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = repo.join("target/interop-venv/bin/python");
    if !python.exists() {
        return os_support::skip("target/interop-venv is missing (scripts/setup makes it)");
    }
    // One run slot: the client's cancellation check then shows a cancelled run frees it.
    let out = std::process::Command::new(python)
        .arg(repo.join("tests/interop/mcp_client.py"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_pycage"))
        .args(["mcp", "--allow", "add", "--max-concurrent", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("interop: all"), "{stdout}");
    assert!(!stdout.contains("skip "), "a check was skipped:\n{stdout}");
    eprintln!("{stdout}");
}

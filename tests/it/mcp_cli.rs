//! `pycage mcp` as an MCP client starts it: a child process speaking MCP on stdio, driven by
//! rmcp's client and by the official Python SDK's (`tests/interop/mcp_client.py`, in the
//! virtualenv `scripts/setup` makes), and `pycage mcp --listen` over streamable HTTP, driven
//! by the Python SDK with its token, `Host`, `Origin` and body-cap checks. On stdio, stdout
//! must carry protocol messages only (a stray line breaks the clients).

use crate::os_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
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

/// Issue 37, hole 4: a client that cannot ask its user (no elicitation) gets a suspended
/// run; the approval code goes to stderr, the client's server log for the person, never to
/// stdout, where the model reads; with it the model's `resume_run` allows the call.
#[tokio::test]
async fn pycage_mcp_shows_the_approval_code_on_stderr_only() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pycage.toml");
    let policy = "[policy]\nallow = [\"add\", \"echo\"]\napprove = [\"echo\"]\n";
    std::fs::write(&config, policy).unwrap();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pycage")).configure(|c| {
        c.arg("mcp").arg("--config").arg(&config);
    });
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(stderr.unwrap()).lines();
    let client = ().serve(transport).await.unwrap();
    let paused = client
        .call_tool(call("r = await echo(text='hi')\nreturn r['text']"))
        .await
        .unwrap();
    let paused_json = serde_json::to_string(&paused).unwrap();
    let s = paused.structured_content.unwrap();
    assert_eq!(s["status"], "suspended", "{s:#}");
    let run_id = s["run_id"].as_str().unwrap().to_owned();
    let line = loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(60), stderr.next_line())
            .await
            .expect("a notice on stderr")
            .unwrap()
            .expect("stderr open");
        if line.contains("approval code: ") {
            break line;
        }
    };
    assert!(
        line.contains(&run_id) && line.contains("`text.echo`"),
        "{line}"
    );
    let code = line
        .rsplit("approval code: ")
        .next()
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(code.len(), 11, "{line}");
    assert!(
        !paused_json.contains(&code),
        "the model never sees the code"
    );
    let Value::Object(arguments) =
        json!({"run_id": run_id, "decision": "approve", "approval_code": code})
    else {
        unreachable!()
    };
    let done = client
        .call_tool(CallToolRequestParams::new("resume_run").with_arguments(arguments))
        .await
        .unwrap();
    assert_eq!(done.structured_content.unwrap()["value"], "hi");
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

/// The interop virtualenv's Python, or `None` (the test skips, or fails in CI).
fn interop_python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    os_support::skip("target/interop-venv is missing (scripts/setup makes it)");
    None
}

/// Runs the interop client with `args` and checks it passed every check.
fn interop(python: &Path, args: &[&std::ffi::OsStr]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mcp_client.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
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

#[test]
fn the_official_python_sdk_drives_pycage_mcp() {
    let Some(python) = interop_python() else {
        return;
    };
    // One run slot: the client's cancellation check then shows a cancelled run frees it.
    let args = [
        "--",
        env!("CARGO_BIN_EXE_pycage"),
        "mcp",
        "--allow",
        "add",
        "--max-concurrent",
        "1",
        "--queue-timeout",
        "1s",
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    interop(&python, &args);
}

/// The MCP project's reference server from npm (`scripts/setup` installs it), or `None` (the
/// test skips, or fails in CI).
fn reference_upstream() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/interop-node/node_modules/.bin/mcp-server-everything");
    if bin.exists() {
        return Some(bin);
    }
    os_support::skip("target/interop-node is missing (scripts/setup makes it)");
    None
}

#[test]
fn code_mode_over_the_reference_upstream_server_through_the_official_python_sdk() {
    let (Some(python), Some(upstream)) = (interop_python(), reference_upstream()) else {
        return;
    };
    // Quoted for the flag's shell-style split, in case the checkout's path has a space.
    let upstream = format!("everything='{}' stdio", upstream.display());
    let args = [
        "--code-mode",
        "--",
        env!("CARGO_BIN_EXE_pycage"),
        "mcp",
        "--upstream",
        &upstream,
        "--namespace",
        "everything",
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    interop(&python, &args);
}

/// Kills the server when the test ends, however it ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_official_python_sdk_drives_pycage_mcp_over_http_with_its_guards() {
    let Some(python) = interop_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let config = dir.path().join("pycage.toml");
    std::fs::write(&config, "[http]\nmax_body_bytes = 1048576\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pycage"))
        .arg("mcp")
        .arg("--config")
        .arg(&config)
        .arg("--token-file")
        .arg(&token)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "add",
            "--max-concurrent",
            "1",
            "--queue-timeout",
            "1s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut url = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("pycage: serving MCP at ") {
            url = Some(rest.to_owned());
            break;
        }
    }
    let url = url.expect("the server said where it listens");
    let args = [
        std::ffi::OsStr::new("--http"),
        std::ffi::OsStr::new(&url),
        std::ffi::OsStr::new("--token-file"),
        token.as_os_str(),
    ];
    interop(&python, &args);
    drop(server);
}

#[test]
fn pycage_mcp_will_not_listen_beyond_loopback_without_a_token() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["mcp", "--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs a token_file"), "{stderr}");
}

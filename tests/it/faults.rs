//! Faults around the guest: misbehaving tools and a damaged artifact cache. Each gives a
//! clear, typed error, and the host keeps serving.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use pycage::{ArtifactSource, ErrorKind, Limits, Runner, ToolPolicy, WasmBackend};
use pycage_tools::ToolRegistry;
use serde_json::json;

/// Tools that fail in every way a tool can.
fn faulty_tools() -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register_fn(
        "bad",
        "panics",
        "panics",
        json!({"type": "object"}),
        |_| async { panic!("a bug in a tool, with /host/paths/in/it") },
    )
    .unwrap();
    r.register_fn(
        "bad",
        "hangs",
        "never returns",
        json!({"type": "object"}),
        |_| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(json!(null))
        },
    )
    .unwrap();
    r.register_fn(
        "bad",
        "huge",
        "returns 100 MB",
        json!({"type": "object"}),
        |_| async { Ok(json!("x".repeat(100 << 20))) },
    )
    .unwrap();
    let toml = r#"
[[tool]]
name = "garbage"
namespace = "bad"
description = "prints something that is not JSON"
command = ["/bin/sh", "-c", "echo 'this is not json'"]

[[tool]]
name = "exits"
namespace = "bad"
description = "fails with a message"
command = ["/bin/sh", "-c", "echo 'first line' >&2; echo 'the tool broke' >&2; exit 3"]
expose_stderr = true

[[tool]]
name = "leaks"
namespace = "bad"
description = "fails with a host path on stderr"
command = ["/bin/sh", "-c", "echo '/home/secret/x: permission denied' >&2; exit 3"]
"#;
    r.extend(pycage_tools::command::parse_toml(toml, "faults.toml").unwrap())
        .unwrap();
    r
}

fn runner() -> Runner {
    Runner::builder()
        .tools(faulty_tools())
        .policy(ToolPolicy::new().namespace("bad"))
        .limits(
            Limits::builder()
                .tool_timeout(Duration::from_millis(300))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

async fn tool_error(tool: &str) -> (String, String) {
    let code =
        format!("try:\n    await {tool}()\nexcept ToolError as e:\n    return [e.kind, str(e)]");
    let r = runner().run(&code).await;
    assert!(r.ok, "{tool}: {r:#?}");
    let v: Vec<String> = serde_json::from_value(r.value).unwrap();
    (v[0].clone(), v[1].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_fails_its_call_without_details() {
    let (kind, message) = tool_error("panics").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("failed", "tool crashed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_tool_times_out_and_the_run_goes_on() {
    let started = Instant::now();
    let (kind, message) = tool_error("hangs").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("failed", "tool timed out after 300ms")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_tool_result_is_refused() {
    let (kind, message) = tool_error("huge").await;
    assert_eq!(kind, "limit-exceeded");
    assert!(message.contains("4194304"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_printing_garbage_is_a_failed_call() {
    let (kind, message) = tool_error("garbage").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("failed", "tool returned invalid JSON")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_exiting_non_zero_reports_its_last_stderr_line() {
    let (kind, message) = tool_error("exits").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("failed", "the tool broke")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_exiting_non_zero_keeps_its_stderr_from_the_guest_by_default() {
    let (kind, message) = tool_error("leaks").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("failed", "tool exited with status 3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncaught_tool_failure_is_a_guest_exception_and_the_host_serves_on() {
    let r = runner().run("await panics()").await;
    assert_kind(&r, ErrorKind::GuestException);
    assert_eq!(r.error.unwrap().exception.as_deref(), Some("ToolError"));
    assert_eq!(run("return 'alive'").await.value, json!("alive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_cached_artifact_is_rebuilt_not_loaded() {
    let shared = WasmBackend::shared().unwrap();
    shared.prepare().await.unwrap();
    let original = shared.artifact_path().expect("a cache dir");
    let dir = std::env::temp_dir().join(format!("pycage-faults-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(original.file_name().unwrap());
    std::fs::copy(&original, &copy).unwrap();
    let mut sum = original.clone().into_os_string();
    sum.push(".sum");
    let mut sum_copy = copy.clone().into_os_string();
    sum_copy.push(".sum");
    std::fs::copy(&sum, &sum_copy).unwrap();

    // An intact copy loads from the cache (its checksum is verified: new file identity).
    let intact = WasmBackend::builder()
        .cache_dir(Some(dir.clone()))
        .build()
        .unwrap();
    assert_eq!(
        intact.prepare().await.unwrap(),
        ArtifactSource::CacheVerified
    );

    // One flipped byte in the middle of the machine code: never handed to the engine.
    let mut bytes = std::fs::read(&copy).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&copy, &bytes).unwrap();
    let backend = WasmBackend::builder()
        .cache_dir(Some(dir.clone()))
        .build()
        .unwrap();
    assert_eq!(backend.prepare().await.unwrap(), ArtifactSource::Compiled);
    let r = Runner::builder()
        .backend(Arc::new(backend))
        .build()
        .unwrap()
        .run("return 6 * 7")
        .await;
    assert_eq!(r.value, json!(42), "{r:#?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

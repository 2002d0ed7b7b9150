//! Property checks shared by the fuzz targets (`fuzz/`) and the regression tests that replay
//! what the fuzzers found. Not a stable API.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use pycage_tools::ToolRegistry;
use serde_json::json;

use crate::{Broker, CallError, Limits, ToolPolicy};

const CEILING: u32 = 3;
const MAX_RESULT: u64 = 1024;

/// Feeds hostile calls to a broker and panics if any of its promises breaks.
///
/// `data` is `name 0xFF args [0xFF name 0xFF args ...]`, each pair one call, against the
/// built-in tools with namespace `math` exposed, a registered but hidden `vault.secret`, a
/// ceiling of 3 calls, a 256-byte argument cap and a 1 KiB result cap. Checked: only exact
/// exposed names run; refused calls are not counted; the ceiling holds; results are JSON within
/// the cap; messages stay short; the hidden tool never runs.
pub async fn broker_calls(data: &[u8]) {
    let secret_calls = Arc::new(AtomicU32::new(0));
    let mut registry = ToolRegistry::with_builtins();
    let calls = secret_calls.clone();
    registry
        .register_fn(
            "vault",
            "secret",
            "never exposed",
            json!({"type": "object"}),
            move |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok(json!("secret")) }
            },
        )
        .expect("a valid tool");
    let exposed = ToolPolicy::new()
        .namespace("math")
        .resolve(&registry)
        .expect("math resolves");
    let limits = Limits::builder()
        .max_tool_calls(CEILING)
        .max_tool_args_bytes(256)
        .max_tool_result_bytes(MAX_RESULT)
        .build()
        .expect("valid limits");
    let broker = Broker::new("fuzz", exposed.clone(), &limits);
    let parts: Vec<&[u8]> = data.split(|b| *b == 0xff).collect();
    for pair in parts.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let args = pair
            .get(1)
            .map(|a| String::from_utf8_lossy(a))
            .unwrap_or_default();
        let before = broker.executed();
        let outcome = broker.call(&name, &args).await;
        let executed = broker.executed() - before;
        match &outcome {
            Ok(text) => {
                assert!(
                    exposed.lookup(&name).is_some(),
                    "an unexposed name ran: {name:?}"
                );
                assert!(text.len() as u64 <= MAX_RESULT);
                serde_json::from_str::<serde_json::Value>(text).expect("results are JSON");
                assert_eq!(executed, 1);
            }
            Err(CallError::NotFound(_)) => {
                assert!(exposed.lookup(&name).is_none());
                assert_eq!(executed, 0, "a refused call was counted");
            }
            Err(CallError::InvalidArguments(_) | CallError::LimitExceeded(_)) => {}
            Err(CallError::Failed(_)) => assert_eq!(executed, 1),
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
        if let Err(e) = &outcome {
            assert!(e.message().len() < 512, "a long message: {e:?}");
        }
    }
    assert!(broker.executed() <= CEILING, "the ceiling was exceeded");
    assert_eq!(
        secret_calls.load(Ordering::SeqCst),
        0,
        "the hidden tool ran"
    );
}

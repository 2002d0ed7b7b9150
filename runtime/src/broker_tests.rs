use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pycage_tools::{ToolError, ToolRegistry};
use serde_json::json;

use super::*;
use crate::ToolPolicy;

/// A registry with a counting tool `t.count`, plus tools that fail in each interesting way.
fn registry(count: Arc<AtomicU32>) -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register_fn(
        "t",
        "count",
        "counts",
        json!({"type": "object"}),
        move |args| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"n": args.len()}))
            }
        },
    )
    .unwrap();
    r.register_fn("t", "fail", "fails", json!({"type": "object"}), |_| async {
        Err(ToolError::Failed("it broke".into()))
    })
    .unwrap();
    r.register_fn(
        "t",
        "panic",
        "panics",
        json!({"type": "object"}),
        |_| async { panic!("host secret in a panic message") },
    )
    .unwrap();
    r.register_fn("t", "hang", "hangs", json!({"type": "object"}), |_| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(json!(null))
    })
    .unwrap();
    r.register_fn(
        "t",
        "big",
        "returns a lot",
        json!({"type": "object"}),
        |_| async { Ok(json!("x".repeat(10_000))) },
    )
    .unwrap();
    r
}

fn broker(limits: Limits) -> (Broker, Arc<AtomicU32>) {
    let count = Arc::new(AtomicU32::new(0));
    let exposed = ToolPolicy::new()
        .namespace("t")
        .resolve(&registry(count.clone()))
        .unwrap();
    (Broker::new("test", exposed, &limits), count)
}

#[tokio::test]
async fn a_call_runs_the_tool_and_counts() {
    let (b, count) = broker(Limits::default());
    assert_eq!(b.call("count", r#"{"a": 1}"#).await.unwrap(), r#"{"n":1}"#);
    assert_eq!(b.call("t.count", "{}").await.unwrap(), r#"{"n":0}"#);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(b.executed(), 2);
}

#[tokio::test]
async fn refused_calls_are_not_counted_and_do_not_run() {
    let (b, count) = broker(Limits::default());
    assert!(matches!(
        b.call("nope", "{}").await,
        Err(CallError::NotFound(_))
    ));
    assert!(matches!(
        b.call("count", "[1]").await,
        Err(CallError::InvalidArguments(_))
    ));
    assert!(matches!(
        b.call("count", "{").await,
        Err(CallError::InvalidArguments(_))
    ));
    assert!(matches!(
        b.call("count", "null").await,
        Err(CallError::InvalidArguments(_))
    ));
    assert_eq!(count.load(Ordering::SeqCst), 0);
    assert_eq!(b.executed(), 0);
}

#[tokio::test]
async fn arguments_are_read_exactly_or_refused_before_the_tool_runs() {
    let (b, count) = broker(Limits::default());
    // An echo would show changed numbers; `count` shows the call ran. Exact floats and
    // 64-bit integers run.
    let exact =
        r#"{"x": -7.312715117751976e-237, "i": -9223372036854775808, "u": 18446744073709551615}"#;
    assert_eq!(b.call("count", exact).await.unwrap(), r#"{"n":3}"#);
    let deep = |n: usize| format!("{{\"x\":{}1{}}}", "[".repeat(n), "]".repeat(n));
    assert!(b.call("count", &deep(199)).await.is_ok());
    for (args, needle) in [
        (
            r#"{"n": 18446744073709551616}"#.to_owned(),
            "the integer 18446744073709551616 is",
        ),
        (
            r#"{"n": [-9223372036854775809]}"#.to_owned(),
            "pass such a number as a string",
        ),
        (
            deep(200),
            "in the arguments, arrays and objects nest deeper than 200 levels",
        ),
        (deep(500_000), "nest deeper than 200 levels"),
    ] {
        match b.call("count", &args).await {
            Err(CallError::InvalidArguments(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(b.executed(), 2, "refused arguments are not counted");
}

#[tokio::test]
async fn executed_calls_count_even_when_the_tool_fails() {
    let (b, _) = broker(Limits::default());
    assert_eq!(
        b.call("fail", "{}").await,
        Err(CallError::Failed("it broke".into()))
    );
    assert_eq!(b.executed(), 1);
}

#[tokio::test]
async fn the_ceiling_is_exact_under_concurrency() {
    let limits = Limits::builder().max_tool_calls(100).build().unwrap();
    let (b, count) = broker(limits);
    let b = Arc::new(b);
    let calls = (0..150).map(|_| {
        let b = b.clone();
        tokio::spawn(async move { b.call("count", "{}").await })
    });
    let mut ok = 0;
    let mut limited = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(CallError::LimitExceeded(_)) => limited += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((ok, limited), (100, 50));
    assert_eq!(count.load(Ordering::SeqCst), 100);
    assert_eq!(b.executed(), 100);
    assert!(b.ceiling_hit());
}

#[tokio::test]
async fn argument_size_is_checked_before_parsing() {
    let limits = Limits::builder().max_tool_args_bytes(16).build().unwrap();
    let (b, count) = broker(limits);
    // Not even JSON: the size check must come first.
    let err = b.call("count", &"x".repeat(17)).await.unwrap_err();
    assert!(matches!(err, CallError::LimitExceeded(_)), "{err:?}");
    assert!(b.call("count", r#"{"a": "0123"}"#).await.is_ok());
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn results_over_the_cap_are_refused() {
    let limits = Limits::builder()
        .max_tool_result_bytes(1000)
        .build()
        .unwrap();
    let (b, _) = broker(limits);
    let err = b.call("big", "{}").await.unwrap_err();
    assert_eq!(
        err,
        CallError::LimitExceeded("tool result is larger than the limit of 1000 bytes".into())
    );
    assert_eq!(b.executed(), 1);
}

/// On tokio's paused clock: the broker's deadline, not the tool's hour-long sleep, ends the
/// call, at exactly the per-call timeout.
#[tokio::test(start_paused = true)]
async fn a_hanging_tool_times_out() {
    let limits = Limits::builder()
        .tool_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let (b, _) = broker(limits);
    let started = tokio::time::Instant::now();
    let err = b.call("hang", "{}").await.unwrap_err();
    assert_eq!(err, CallError::Failed("tool timed out after 50ms".into()));
    assert_eq!(started.elapsed(), Duration::from_millis(50));
    assert_eq!(b.executed(), 1, "a call that timed out was executed");
}

#[tokio::test]
async fn a_panicking_tool_fails_its_call_without_leaking_the_panic() {
    let (b, _) = broker(Limits::default());
    let err = b.call("panic", "{}").await.unwrap_err();
    assert_eq!(err, CallError::Failed("tool crashed".into()));
    assert!(!err.message().contains("secret"));
    // The broker still serves.
    assert!(b.call("count", "{}").await.is_ok());
}

#[tokio::test]
async fn no_calls_after_the_run_has_finished() {
    let (b, count) = broker(Limits::default());
    b.finish();
    assert!(matches!(
        b.call("count", "{}").await,
        Err(CallError::Denied(_))
    ));
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn hostile_names_are_escaped_in_messages() {
    let (b, _) = broker(Limits::default());
    let err = b
        .call(&format!("ev\u{0}il\n{}", "x".repeat(100)), "{}")
        .await
        .unwrap_err();
    let msg = err.message();
    assert!(!msg.contains('\0') && !msg.contains('\n'), "{msg:?}");
    assert!(msg.len() < 200, "{msg:?}");
}

#[tokio::test]
async fn fuzz_regressions_replay() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/broker");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the regression corpus exists") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        crate::fuzzing::broker_calls(&data).await;
        replayed += 1;
    }
    assert!(replayed > 0, "no regression inputs in {}", dir.display());
}

/// Records what it is told, as `(tool, outcome)`.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<(Option<String>, &'static str)>>);

impl ToolCallObserver for Recorder {
    fn observe(&self, call: &ToolCallEvent<'_>) {
        assert_eq!(call.run_id, "test");
        self.0
            .lock()
            .unwrap()
            .push((call.tool.map(str::to_owned), call.outcome));
    }
}

#[tokio::test]
async fn observers_see_each_call_by_its_tool_and_outcome_but_never_a_made_up_name() {
    let (b, _) = broker(Limits::builder().max_tool_calls(2).build().unwrap());
    let recorder = Arc::new(Recorder::default());
    let b = b.observed_by(Observers::default().with(recorder.clone()));
    let _ = b.call("count", "{}").await;
    let _ = b.call("t.fail", "{}").await;
    let _ = b.call("count", "[]").await;
    let _ = b.call("made.up\u{7}name", "{}").await;
    let _ = b.call("t.count", "{}").await;
    let seen = recorder.0.lock().unwrap().clone();
    let tool = |t: &str| Some(t.to_owned());
    assert_eq!(
        seen,
        vec![
            (tool("t.count"), "ok"),
            (tool("t.fail"), "failed"),
            (tool("t.count"), "invalid-arguments"),
            (None, "not-found"),
            (tool("t.count"), "limit-exceeded"),
        ]
    );
}

//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pycage::{Limits, RunResult, Runner, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::{Map, Value, json};

/// The seed example from the foundation issue, verbatim.
pub const SEED: &str = r#"total = 0
for i in range(1, 6):
    r = await add(a=str(total), b=str(i))   # 'add' is a brokered host tool
    total = r["sum"]
return total
"#;

/// A runner over the built-in tools with `policy` and `limits`.
pub fn runner(policy: ToolPolicy, limits: Limits) -> Runner {
    Runner::builder()
        .tools(ToolRegistry::with_builtins())
        .policy(policy)
        .limits(limits)
        .build()
        .expect("runner builds")
}

/// A runner on `backend` with the `math` namespace of the built-in tools exposed.
pub fn math_runner_on(backend: &pycage::WasmBackend) -> Runner {
    Runner::builder()
        .backend(Arc::new(backend.clone()))
        .tools(ToolRegistry::with_builtins())
        .policy(ToolPolicy::new().namespace("math"))
        .build()
        .expect("runner builds")
}

/// Runs `code` with the `math` namespace exposed and default limits.
pub async fn run(code: &str) -> RunResult {
    runner(ToolPolicy::new().namespace("math"), Limits::default())
        .run(code)
        .await
}

/// Runs `code` with `limits` and no tools.
pub async fn run_limited(code: &str, limits: Limits) -> RunResult {
    runner(ToolPolicy::new(), limits).run(code).await
}

/// Runs `code` with initial variables.
pub async fn run_vars(code: &str, vars: Value) -> RunResult {
    let Value::Object(vars) = vars else {
        panic!("vars must be an object")
    };
    let r = runner(ToolPolicy::new(), Limits::default());
    r.run_with(code, vars, &Limits::default()).await
}

/// Limits with a wall timeout.
pub fn wall(d: Duration) -> Limits {
    Limits::builder().wall_timeout(d).build().unwrap()
}

/// A registry with the built-ins plus `spy.*` tools that count their invocations.
pub struct Spy {
    pub registry: ToolRegistry,
    pub count: Arc<AtomicU32>,
}

impl Spy {
    pub fn new() -> Self {
        let count = Arc::new(AtomicU32::new(0));
        let mut registry = ToolRegistry::with_builtins();
        for name in ["add", "secret"] {
            let c = count.clone();
            registry
                .register_fn(
                    "spy",
                    name,
                    "counts its calls",
                    json!({"type": "object"}),
                    move |_| {
                        let c = c.clone();
                        async move {
                            c.fetch_add(1, Ordering::SeqCst);
                            Ok(json!({"sum": 0, "secret": "CANARY-SPY-RESULT"}))
                        }
                    },
                )
                .unwrap();
        }
        Spy { registry, count }
    }

    pub fn calls(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }
}

/// Asserts the run failed with `kind`, showing the whole result otherwise.
#[track_caller]
pub fn assert_kind(result: &RunResult, kind: pycage::ErrorKind) {
    assert!(!result.ok, "expected {kind}, got ok: {result:#?}");
    let error = result.error.as_ref().expect("a failed run has an error");
    assert_eq!(error.kind, kind, "{result:#?}");
}

pub fn empty_vars() -> Map<String, Value> {
    Map::new()
}

/// A `gate.wait` tool that holds a run at a known point without timing: a guest's call
/// (`await wait()`) says it has arrived, then returns `1` only once the test opens the
/// gate. A test that waits for a run to be under way this way cannot miss it.
#[derive(Clone, Default)]
pub struct Gate {
    arrived: Arc<tokio::sync::Notify>,
    open: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// Registers `gate.wait` in `registry`.
    pub fn register(&self, registry: &mut ToolRegistry) {
        let gate = self.clone();
        registry
            .register_fn(
                "gate",
                "wait",
                "returns once the test opens the gate",
                json!({"type": "object"}),
                move |_| {
                    let gate = gate.clone();
                    async move {
                        gate.arrived.notify_one();
                        gate.open.notified().await;
                        Ok(json!(1))
                    }
                },
            )
            .unwrap();
    }

    /// Waits until a guest has called `gate.wait`, failing the test after a minute.
    pub async fn arrived(&self) {
        tokio::time::timeout(Duration::from_secs(60), self.arrived.notified())
            .await
            .expect("the run reached the gate within a minute");
    }

    /// Lets the waiting call return.
    pub fn open(&self) {
        self.open.notify_one();
    }
}

/// Holds one run of `session` at `gate` (registered in its runner, `gate.*` allowed) and
/// checks that a second run meanwhile is refused as busy, that the held run ends with its
/// value once the gate opens, and that the session then serves the next run.
pub async fn a_second_run_is_refused_while_one_is_held(session: pycage::Session, gate: &Gate) {
    let session = Arc::new(session);
    let s = session.clone();
    let slow = tokio::spawn(async move { s.run("return await wait()").await });
    gate.arrived().await;
    assert!(session.is_busy());
    let busy = session.run("return 2").await;
    assert_kind(&busy, pycage::ErrorKind::SessionBusy);
    gate.open();
    let slow = tokio::time::timeout(Duration::from_secs(60), slow)
        .await
        .expect("the held run ends once the gate opens")
        .unwrap();
    assert_eq!(slow.value, json!(1), "{slow:#?}");
    assert_eq!(session.run("return 3").await.value, json!(3));
}

/// In `session` (whose runs have a short wall-clock limit), a run that computes past its
/// limit is interrupted: a timeout with `KeyboardInterrupt` and its traceback, after which the
/// session keeps its variables, imports and what the interrupted run did, the next loop runs
/// to its end (the interrupt was not left pending), and a second timeout is interrupted too.
pub async fn a_timeout_interrupts_the_code_and_the_session_keeps_its_state(
    session: &pycage::Session,
) {
    assert!(session.run("import json\nx = 1").await.ok);
    let code =
        "def spin():\n    global x\n    while True:\n        x += 1\nnote = 'before'\nspin()";
    let r = session.run(code).await;
    assert_kind(&r, pycage::ErrorKind::Timeout);
    assert!(r.timed_out && !r.session_ended, "{r:#?}");
    let error = r.error.as_ref().unwrap();
    assert_eq!(
        error.exception.as_deref(),
        Some("KeyboardInterrupt"),
        "{r:#?}"
    );
    assert!(error.message.contains("keeps its state"), "{r:#?}");
    let tb = error.traceback.as_deref().unwrap_or_default();
    assert!(
        tb.contains("in spin"),
        "the traceback shows where the code was: {tb}"
    );
    let after = session.run("return [x > 1, note, json.dumps([1])]").await;
    assert_eq!(after.value, json!([true, "before", "[1]"]), "{after:#?}");
    let next = session
        .run("n = 0\nfor i in range(200_000):\n    n += 1\nreturn n")
        .await;
    assert_eq!(next.value, json!(200_000), "{next:#?}");
    let again = session.run("while True:\n    pass").await;
    assert_kind(&again, pycage::ErrorKind::Timeout);
    assert!(!again.session_ended, "{again:#?}");
    assert_eq!(session.run("return note").await.value, json!("before"));
}

/// In `session` (short wall-clock limit, `gate.wait` exposed and never opened), a tool call
/// still going at the deadline ends there, the run is a timeout, and the session lives: the
/// code sees the failed call ("the run's wall-clock limit was reached during this call") or
/// the interrupt that follows it, where it made the call.
pub async fn a_tool_call_still_going_at_the_deadline_ends_there(session: &pycage::Session) {
    assert!(session.run("x = 1").await.ok);
    let r = session
        .run("note = 'before'\nawait wait()\nnote = 'after'")
        .await;
    assert_kind(&r, pycage::ErrorKind::Timeout);
    assert!(r.timed_out && !r.session_ended, "{r:#?}");
    let exception = r.error.as_ref().and_then(|e| e.exception.as_deref());
    assert!(
        matches!(exception, Some("ToolError" | "KeyboardInterrupt")),
        "{r:#?}"
    );
    let after = session.run("return [x, note]").await;
    assert_eq!(after.value, json!([1, "before"]), "{after:#?}");
}

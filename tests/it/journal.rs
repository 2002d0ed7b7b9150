//! Tool-call journals (record, replay, tampering, divergence) and approval-gated calls that
//! suspend a run and resume it.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::assert_kind;
use pycage::{
    CallError, Decision, ErrorKind, Journal, JournalKey, OnDivergence, RunRequest, RunResult,
    Runner, Suspended, ToolPolicy, WasmBackend,
};
use pycage_tools::{ToolError, ToolRegistry};
use serde_json::{Value, json};

/// `fx.*` tools that count their invocations: `lookup(x)` doubles `x`, `send(to)` "sends"
/// (the kind of call a person approves), `ask(q)` asks to wait for a person itself.
#[derive(Clone, Default)]
struct Fx {
    lookups: Arc<AtomicU32>,
    sends: Arc<AtomicU32>,
    asks: Arc<AtomicU32>,
}

impl Fx {
    fn registry(&self) -> ToolRegistry {
        let mut registry = ToolRegistry::new();
        let lookups = self.lookups.clone();
        registry
            .register_fn(
                "fx",
                "lookup",
                "doubles x",
                json!({"type": "object"}),
                move |args| {
                    let n = lookups.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let x = args.get("x").and_then(Value::as_i64).unwrap_or(0);
                        // The invocation count is in the result: a replayed answer shows the
                        // count of the run that recorded it.
                        Ok(json!({"double": x * 2, "invocation": n}))
                    }
                },
            )
            .unwrap();
        let sends = self.sends.clone();
        registry
            .register_fn(
                "fx",
                "send",
                "sends",
                json!({"type": "object"}),
                move |args| {
                    sends.fetch_add(1, Ordering::SeqCst);
                    async move { Ok(json!({"sent_to": args.get("to").cloned(), "id": 41})) }
                },
            )
            .unwrap();
        let asks = self.asks.clone();
        registry
            .register_fn("fx", "ask", "asks a person", json!({"type": "object"}), move |_| {
                asks.fetch_add(1, Ordering::SeqCst);
                async move { Err::<Value, _>(ToolError::Suspend("a person must answer".into())) }
            })
            .unwrap();
        registry
    }

    fn counts(&self) -> [u32; 3] {
        [&self.lookups, &self.sends, &self.asks].map(|c| c.load(Ordering::SeqCst))
    }
}

fn deterministic(seed: u64) -> WasmBackend {
    WasmBackend::builder()
        .deterministic(seed)
        .max_instances(4)
        .build()
        .unwrap()
}

fn runner(fx: &Fx, backend: &WasmBackend, key: &JournalKey, policy: ToolPolicy) -> Runner {
    Runner::builder()
        .backend(Arc::new(backend.clone()))
        .tools(fx.registry())
        .policy(policy)
        .journal_key(key.clone())
        .build()
        .unwrap()
}

fn fx_policy() -> ToolPolicy {
    ToolPolicy::new().namespace("fx")
}

/// Three lookups, the middle one's argument from a seeded random number.
const LOOKUPS: &str = r#"
import random
out = []
for x in (1, random.randrange(1000), 3):
    r = await lookup(x=x)
    out.append(r["double"])
print("doubled", out)
return out
"#;

#[tokio::test]
async fn replay_answers_every_call_from_the_journal_without_invoking_a_tool() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let runner = runner(&fx, &deterministic(1), &key, fx_policy());
    let first = runner
        .run_request(RunRequest::new(LOOKUPS).record_journal())
        .await;
    assert!(first.ok, "{first:#?}");
    assert_eq!(fx.counts(), [3, 0, 0]);
    let journal = first.journal.clone().expect("a recorded run has a journal");
    assert_eq!(journal.calls.len(), 3);
    assert_eq!(journal.calls[2].tool, "fx.lookup");
    assert_eq!(journal.seed, Some(1));

    // Through its JSON text, as a client would hand it back.
    let text = serde_json::to_string(&journal).unwrap();
    let replayed = runner
        .run_request(RunRequest::new(LOOKUPS).replay(Journal::from_json(&text).unwrap()))
        .await;
    assert!(replayed.ok, "{replayed:#?}");
    assert_eq!(fx.counts(), [3, 0, 0], "no tool ran during the replay");
    assert_eq!(replayed.value, first.value);
    assert_eq!(replayed.stdout, first.stdout);
    assert_eq!(replayed.fuel_consumed, first.fuel_consumed);
    assert_eq!(replayed.tool_calls, 3);
    assert_eq!(replayed.journal.unwrap().calls, journal.calls);
}

#[tokio::test]
async fn a_tampered_journal_or_one_signed_with_another_key_is_refused() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let backend = deterministic(1);
    let runner = runner(&fx, &backend, &key, fx_policy());
    let first = runner
        .run_request(RunRequest::new(LOOKUPS).record_journal())
        .await;
    let journal = first.journal.unwrap();

    let mut text = serde_json::to_string(&journal).unwrap();
    assert!(text.contains(r#""double":2"#), "{text}");
    text = text.replace(r#""double":2"#, r#""double":9000"#);
    let forged = Journal::from_json(&text).unwrap();
    let refused = runner
        .run_request(RunRequest::new(LOOKUPS).replay(forged))
        .await;
    assert_kind(&refused, ErrorKind::InvalidInput);
    assert!(
        refused.error.unwrap().message.contains("signature"),
        "the message says why"
    );

    let stranger = self::runner(&fx, &backend, &JournalKey::generate().unwrap(), fx_policy());
    let refused = stranger
        .run_request(RunRequest::new(LOOKUPS).replay(journal))
        .await;
    assert_kind(&refused, ErrorKind::InvalidInput);
    assert_eq!(fx.counts(), [3, 0, 0], "a refused replay runs nothing");
}

#[tokio::test]
async fn a_call_that_differs_from_the_journal_fails_naming_both_or_goes_live_when_asked() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let runner = runner(&fx, &deterministic(1), &key, fx_policy());
    let journal = runner
        .run_request(RunRequest::new(LOOKUPS).record_journal())
        .await
        .journal
        .unwrap();
    // The edited program's third call differs from the journal's.
    let edited = LOOKUPS.replace(
        "(1, random.randrange(1000), 3)",
        "(1, random.randrange(1000), 4)",
    );

    let diverged = runner
        .run_request(RunRequest::new(edited.clone()).replay(journal.clone()))
        .await;
    assert_kind(&diverged, ErrorKind::ReplayDiverged);
    let message = diverged.error.unwrap().message;
    assert!(
        message.contains(r#"{"x":4}"#),
        "names the code's call: {message}"
    );
    assert!(
        message.contains(r#"{"x":3}"#),
        "names the journal's: {message}"
    );
    assert_eq!(fx.counts(), [3, 0, 0], "the diverging call did not run");

    let live = runner
        .run_request(
            RunRequest::new(edited)
                .replay(journal)
                .on_divergence(OnDivergence::GoLive),
        )
        .await;
    assert!(live.ok, "{live:#?}");
    assert_eq!(fx.counts(), [4, 0, 0], "only the diverging call ran");
    assert_eq!(live.value[2], 8);
}

/// A program that looks something up, sends (a call needing approval), and goes on.
const SEND: &str = r#"
import random, time
r = await lookup(x=random.randrange(100))
print("looked up", r, time.time())
try:
    receipt = await send(to="ada@example.org")
except ToolError as e:
    receipt = {"refused": e.kind, "message": str(e)}
print("receipt", receipt)
return {"lookup": r["double"], "receipt": receipt}
"#;

fn suspended_of(result: &RunResult) -> Suspended {
    assert_kind(result, ErrorKind::Suspended);
    result
        .suspended
        .clone()
        .expect("a suspended run has its state")
}

#[tokio::test]
async fn an_approved_call_resumes_in_a_new_runner_to_the_uninterrupted_runs_value_stdout_and_fuel()
{
    let key = JournalKey::generate().unwrap();
    let backend = deterministic(5);
    let uninterrupted = {
        let fx = Fx::default();
        runner(&fx, &backend, &key, fx_policy()).run(SEND).await
    };
    assert!(uninterrupted.ok, "{uninterrupted:#?}");

    let fx = Fx::default();
    let gated = runner(&fx, &backend, &key, fx_policy().approve("send"));
    let stopped = gated.run(SEND).await;
    let state = suspended_of(&stopped);
    assert_eq!(fx.counts(), [1, 0, 0], "the send waits, unsent");
    assert_eq!(state.pending.tool, "fx.send");
    assert_eq!(
        state.pending.args,
        json!({"to": "ada@example.org"})
            .as_object()
            .cloned()
            .unwrap()
    );
    assert_eq!(state.calls.len(), 1);
    assert_eq!(state.seed, Some(5));
    assert_eq!(state.approve, ["fx.send"]);
    assert!(
        !stopped.stdout.contains("receipt"),
        "the run stopped at the call"
    );

    // Another runner (another process, as far as the state knows) with the same key.
    let text = serde_json::to_string(&stopped).unwrap();
    let elsewhere = runner(&fx, &deterministic(5), &key, fx_policy().approve("send"));
    let resumed = elsewhere
        .resume(Suspended::from_json(&text).unwrap(), Decision::Approve)
        .await;
    assert!(resumed.ok, "{resumed:#?}");
    assert_eq!(
        fx.counts(),
        [1, 1, 0],
        "the lookup was replayed, the send ran once"
    );
    assert_eq!(resumed.value, uninterrupted.value);
    assert_eq!(resumed.stdout, uninterrupted.stdout);
    assert_eq!(resumed.fuel_consumed, uninterrupted.fuel_consumed);
    assert_eq!(resumed.journal.unwrap().calls.len(), 2);
}

#[tokio::test]
async fn a_denied_call_raises_tool_error_of_kind_denied_and_an_answer_is_its_result() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let runner = runner(&fx, &deterministic(2), &key, fx_policy().approve("fx.send"));
    let state = suspended_of(&runner.run(SEND).await);

    let denied = runner.resume(state.clone(), Decision::Deny).await;
    assert!(denied.ok, "{denied:#?}");
    assert_eq!(denied.value["receipt"]["refused"], "denied");
    assert!(
        denied.stdout.contains("'refused': 'denied'"),
        "{}",
        denied.stdout
    );

    let answered = runner
        .resume(state, Decision::Answer(json!({"id": 7, "by": "a person"})))
        .await;
    assert!(answered.ok, "{answered:#?}");
    assert_eq!(
        answered.value["receipt"],
        json!({"id": 7, "by": "a person"})
    );
    assert_eq!(fx.counts(), [1, 0, 0], "neither decision ran a tool");
}

#[tokio::test]
async fn a_tool_that_asks_to_wait_suspends_the_run_and_the_answer_resumes_it() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let runner = runner(&fx, &deterministic(3), &key, fx_policy());
    let code = "r = await ask(q='which colour?')\nprint('got', r)\nreturn r";
    let state = suspended_of(&runner.run(code).await);
    assert_eq!(state.pending.reason, "a person must answer");
    assert!(state.approve.is_empty());
    let resumed = runner.resume(state, Decision::Answer(json!("blue"))).await;
    assert!(resumed.ok, "{resumed:#?}");
    assert_eq!(resumed.value, "blue");
    assert_eq!(
        fx.counts(),
        [0, 0, 1],
        "the answer is given without asking again"
    );

    // A run that keeps no journal cannot wait: the call is refused, saying why.
    let plain = Runner::builder()
        .tools(fx.registry())
        .policy(fx_policy().approve("send"))
        .build()
        .unwrap();
    let session = plain.session().await.unwrap();
    let refused = session
        .run("try:\n    await send(to='x')\nexcept ToolError as e:\n    return [e.kind, str(e)]")
        .await;
    assert!(refused.ok, "{refused:#?}");
    assert_eq!(refused.value[0], "denied");
    assert!(refused.value[1].as_str().unwrap().contains("approval"));
    assert_eq!(fx.counts()[1], 0);
}

#[tokio::test]
async fn a_forged_or_reseeded_suspended_state_is_refused() {
    let fx = Fx::default();
    let key = JournalKey::generate().unwrap();
    let runner = runner(&fx, &deterministic(4), &key, fx_policy().approve("send"));
    let state = suspended_of(&runner.run(SEND).await);

    let mut forged = state.clone();
    forged.code = forged.code.replace("ada@example.org", "eve@example.org");
    let refused = runner.resume(forged, Decision::Approve).await;
    assert_kind(&refused, ErrorKind::InvalidInput);

    let reseeded = self::runner(&fx, &deterministic(9), &key, fx_policy().approve("send"));
    let refused = reseeded.resume(state, Decision::Approve).await;
    assert_kind(&refused, ErrorKind::InvalidInput);
    assert!(
        refused.error.unwrap().message.contains("seed 4"),
        "says which seed it needs"
    );
    let narrower = self::runner(
        &fx,
        &deterministic(4),
        &key,
        ToolPolicy::new().allow("lookup"),
    );
    let refused = narrower
        .resume(suspended_of(&runner.run(SEND).await), Decision::Approve)
        .await;
    assert_kind(&refused, ErrorKind::InvalidInput);
    assert!(
        refused
            .error
            .unwrap()
            .message
            .contains("`fx.ask`, which this runner does not")
    );
    assert_eq!(fx.counts(), [2, 0, 0]);
}

#[tokio::test]
async fn a_session_keeps_no_journal() {
    let fx = Fx::default();
    let runner = runner(
        &fx,
        &deterministic(1),
        &JournalKey::generate().unwrap(),
        fx_policy(),
    );
    let session = runner.session().await.unwrap();
    let refused = session
        .run_request(RunRequest::new("return 1").record_journal())
        .await;
    assert_kind(&refused, ErrorKind::Unsupported);
    // The call error kinds a journal records read back as the same kinds.
    for error in [
        CallError::Denied("d".into()),
        CallError::Failed("f".into()),
        CallError::LimitExceeded("l".into()),
    ] {
        assert_eq!(CallError::from_kind(error.kind(), error.message()), error);
    }
}

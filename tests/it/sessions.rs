//! Sessions on the wasm backend: state that persists across runs, per-run limits, runs that
//! end a session and what every later run says, isolation, and runs that may not overlap.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gate, assert_kind, runner};
use pycage::{
    ErrorKind, InputFile, Limits, RunRequest, Runner, SessionConfig, SessionManager, ToolPolicy,
};
use pycage_tools::ToolRegistry;
use serde_json::json;

fn math() -> Runner {
    runner(ToolPolicy::new().namespace("math"), Limits::default())
}

/// A runner with `limits` whose code may call `gate.wait`, and its gate.
fn gated(limits: Limits) -> (Runner, Gate) {
    let gate = Gate::default();
    let mut tools = ToolRegistry::with_builtins();
    gate.register(&mut tools);
    let runner = Runner::builder()
        .tools(tools)
        .policy(ToolPolicy::new().namespace("gate"))
        .limits(limits)
        .build()
        .unwrap();
    (runner, gate)
}

fn paths(r: &pycage::RunResult) -> Vec<&str> {
    r.files.iter().map(|f| f.path.as_str()).collect()
}

#[tokio::test]
async fn a_variable_an_import_a_function_a_class_and_a_file_persist_across_three_runs() {
    let session = math().session().await.unwrap();
    let first = session
        .run(
            "import statistics\n\
             x = 41\n\
             def double(n):\n    return n * 2\n\
             class Box:\n    def __init__(self, v):\n        self.v = v\n\
             open('notes.txt', 'w').write('kept')",
        )
        .await;
    assert!(first.ok, "{first:#?}");
    assert_eq!(paths(&first), ["notes.txt"]);
    let second = session
        .run("x += 1\nb = Box(double(x))\nreturn [x, b.v]")
        .await;
    assert_eq!(second.value, json!([42, 84]), "{second:#?}");
    assert!(
        second.files.is_empty(),
        "nothing changed in run 2: {second:#?}"
    );
    let third = session
        .run(
            "r = await add(a=x, b=1)\n\
             return [statistics.mean([x, b.v]), open('notes.txt').read(), r['sum'], type(b).__name__]",
        )
        .await;
    assert_eq!(third.value, json!([63, "kept", 43, "Box"]), "{third:#?}");
    assert_eq!(third.tool_calls, 1);
    assert_eq!(session.runs(), 3);
    assert!(session.ended().is_none());
}

#[tokio::test]
async fn input_files_join_the_session_directory_and_each_run_returns_what_it_changed() {
    let session = math().session().await.unwrap();
    let r = session
        .run_request(
            RunRequest::new("open('out.txt', 'w').write(open('a.txt').read().upper())")
                .file(InputFile::new("a.txt", b"abc".to_vec())),
        )
        .await;
    assert_eq!(paths(&r), ["out.txt"], "{r:#?}");
    let r = session
        .run_request(
            RunRequest::new(
                "import os\nopen('a.txt', 'a').write('!')\nreturn sorted(os.listdir())",
            )
            .file(InputFile::new("b.txt", b"b".to_vec())),
        )
        .await;
    assert_eq!(r.value, json!(["a.txt", "b.txt", "out.txt"]), "{r:#?}");
    assert_eq!(paths(&r), ["a.txt"]);
    assert_eq!(r.files[0].bytes.as_deref(), Some(&b"abc!"[..]));
}

#[tokio::test]
async fn a_failing_run_leaves_the_session_as_it_was() {
    let limits = Limits::builder().memory_bytes(256 << 20).build().unwrap();
    let session = math().session_with(limits).await.unwrap();
    assert!(session.run("x = 1").await.ok);
    let raised = session.run("x = 2\nraise ValueError('no')").await;
    assert_kind(&raised, ErrorKind::GuestException);
    let memory = session
        .run("try:\n    b = bytearray(400 << 20)\nexcept MemoryError:\n    pass\nblob = bytearray(300 << 20)")
        .await;
    assert_kind(&memory, ErrorKind::MemoryLimit);
    let tool = session.run("await add(a=[], b=1)").await;
    assert!(!tool.ok, "{tool:#?}");
    let syntax = session.run("def (:").await;
    assert_kind(&syntax, ErrorKind::SyntaxError);
    for r in [&raised, &memory, &tool, &syntax] {
        assert!(!r.session_ended, "{r:#?}");
    }
    let after = session.run("return x").await;
    assert_eq!(
        after.value,
        json!(2),
        "the raise came after x = 2: {after:#?}"
    );
}

#[tokio::test]
async fn each_run_has_its_own_fuel_and_tool_ceiling() {
    let limits = Limits::builder().max_tool_calls(2).build().unwrap();
    let session = runner(ToolPolicy::new().namespace("math"), limits)
        .session()
        .await
        .unwrap();
    for _ in 0..3 {
        let r = session
            .run("await add(a=1, b=1)\nawait add(a=1, b=1)")
            .await;
        assert!(r.ok, "the ceiling is per run: {r:#?}");
        assert_eq!(r.tool_calls, 2);
    }
    // A budget one run fits in and two would not: each run gets the whole budget.
    let code = "sum(range(10**4))";
    let cost = session.run(code).await.fuel_consumed.unwrap();
    let fuel = Limits::builder().fuel(Some(cost * 3 / 2)).build().unwrap();
    for _ in 0..2 {
        let r = session
            .run_request(RunRequest::new(code).limits(fuel.clone()))
            .await;
        assert!(r.ok, "{r:#?}");
    }
}

#[tokio::test]
async fn fuel_exhaustion_ends_the_session_and_every_later_run_says_why() {
    let session = math().session().await.unwrap();
    assert!(session.run("x = 1").await.ok);
    let fuel = Limits::builder().fuel(Some(5_000_000)).build().unwrap();
    let spent = session
        .run_request(RunRequest::new("while True:\n    x += 1").limits(fuel))
        .await;
    assert_kind(&spent, ErrorKind::FuelExhausted);
    assert!(spent.session_ended, "{spent:#?}");
    let why = session.ended().expect("ended");
    assert_eq!(why.kind, ErrorKind::FuelExhausted);
    for _ in 0..2 {
        let later = session.run("return x").await;
        assert_kind(&later, ErrorKind::SessionEnded);
        let message = &later.error.as_ref().unwrap().message;
        assert!(
            message.contains("run 2 ended it") && message.contains("fuel"),
            "{message}"
        );
        assert!(!later.session_ended, "only the ending run carries the flag");
    }
}

#[tokio::test]
async fn a_stack_overflow_trap_ends_the_session() {
    let session = math().session().await.unwrap();
    // Deep enough that the interpreter's own recursion check is not what stops it.
    let r = session
        .run("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)")
        .await;
    assert_kind(&r, ErrorKind::StackOverflow);
    assert!(r.session_ended, "{r:#?}");
    assert_kind(&session.run("1").await, ErrorKind::SessionEnded);
}

#[tokio::test]
async fn a_timeout_in_a_session_interrupts_the_code_and_the_session_keeps_its_state() {
    let limits = common::wall(Duration::from_millis(300));
    let session = runner(ToolPolicy::new(), limits).session().await.unwrap();
    common::a_timeout_interrupts_the_code_and_the_session_keeps_its_state(&session).await;
}

#[tokio::test]
async fn code_waiting_in_short_sleeps_is_interrupted_between_them() {
    let limits = common::wall(Duration::from_millis(300));
    let session = runner(ToolPolicy::new(), limits).session().await.unwrap();
    let r = session
        .run("import time\nticks = 0\nwhile True:\n    time.sleep(0.01)\n    ticks += 1")
        .await;
    assert_kind(&r, ErrorKind::Timeout);
    assert!(!r.session_ended, "{r:#?}");
    assert_eq!(session.run("return ticks > 0").await.value, json!(true));
}

#[tokio::test]
async fn code_that_swallows_the_interrupt_ends_the_session() {
    let limits = common::wall(Duration::from_millis(300));
    let session = runner(ToolPolicy::new(), limits).session().await.unwrap();
    assert!(session.run("x = 1").await.ok);
    let code = "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass";
    let r = session.run(code).await;
    assert_kind(&r, ErrorKind::Timeout);
    assert!(r.timed_out && r.session_ended, "{r:#?}");
    let message = &r.error.as_ref().unwrap().message;
    assert!(message.contains("did not stop"), "{r:#?}");
    assert_kind(&session.run("return x").await, ErrorKind::SessionEnded);
}

#[tokio::test]
async fn a_long_sleep_is_cut_at_the_deadline_and_interrupted() {
    let limits = common::wall(Duration::from_millis(300));
    let session = runner(ToolPolicy::new(), limits).session().await.unwrap();
    assert!(session.run("x = 1").await.ok);
    let started = std::time::Instant::now();
    let r = session.run("import time\ntime.sleep(30)").await;
    assert!(started.elapsed() < Duration::from_secs(10), "{r:#?}");
    assert_kind(&r, ErrorKind::Timeout);
    assert!(!r.session_ended, "{r:#?}");
    let exception = r.error.as_ref().and_then(|e| e.exception.as_deref());
    assert_eq!(exception, Some("KeyboardInterrupt"), "{r:#?}");
    let asyncio = session
        .run("import asyncio\nawait asyncio.gather(*(asyncio.sleep(30) for _ in range(10)))")
        .await;
    assert_kind(&asyncio, ErrorKind::Timeout);
    assert!(!asyncio.session_ended, "{asyncio:#?}");
    assert_eq!(session.run("return x").await.value, json!(1));
}

#[tokio::test]
async fn a_tool_call_still_going_at_the_deadline_is_cut_and_the_session_lives() {
    let (runner, _gate) = gated(common::wall(Duration::from_millis(300)));
    let session = runner.session().await.unwrap();
    common::a_tool_call_still_going_at_the_deadline_ends_there(&session).await;
}

#[tokio::test]
async fn a_one_shot_run_is_still_trapped_at_its_deadline() {
    let limits = common::wall(Duration::from_millis(300));
    let r = runner(ToolPolicy::new(), limits)
        .run("while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass")
        .await;
    assert_kind(&r, ErrorKind::Timeout);
    assert!(r.timed_out, "{r:#?}");
    assert_eq!(r.error.unwrap().exception, None, "a trap, not an interrupt");
}

#[tokio::test]
async fn a_cancelled_run_ends_the_session_rather_than_leave_it_half_run() {
    let session = Arc::new(math().session().await.unwrap());
    assert!(session.run("x = 1").await.ok);
    let s = session.clone();
    let cut = tokio::time::timeout(Duration::from_millis(200), async move {
        s.run("import time\nwhile True:\n    time.sleep(0.01)")
            .await
    })
    .await;
    assert!(cut.is_err(), "the caller gave up");
    let next = session.run("return x").await;
    assert_kind(&next, ErrorKind::SessionEnded);
    assert!(next.session_ended, "{next:#?}");
    assert_kind(&session.run("return x").await, ErrorKind::SessionEnded);
}

#[tokio::test]
async fn sessions_do_not_see_each_other_or_one_shot_runs() {
    let runner = math();
    let a = runner.session().await.unwrap();
    let b = runner.session().await.unwrap();
    assert!(
        a.run("secret = 'a'\nopen('a.txt', 'w').write('a')")
            .await
            .ok
    );
    assert!(runner.run("secret = 'one-shot'").await.ok);
    let seen = b
        .run("import os\nreturn [globals().get('secret'), os.listdir()]")
        .await;
    assert_eq!(seen.value, json!([null, []]), "{seen:#?}");
    let one_shot = runner
        .run("import os\nreturn [globals().get('secret'), os.listdir()]")
        .await;
    assert_eq!(one_shot.value, json!([null, []]), "{one_shot:#?}");
    assert_eq!(a.run("return secret").await.value, json!("a"));
}

#[tokio::test]
async fn a_second_run_while_one_runs_is_refused_as_busy() {
    let (runner, gate) = gated(Limits::default());
    let session = runner.session().await.unwrap();
    common::a_second_run_is_refused_while_one_is_held(session, &gate).await;
}

#[tokio::test]
async fn a_manager_runs_sessions_by_id_and_forgets_closed_ones() {
    let manager = SessionManager::new(math(), SessionConfig::default()).unwrap();
    let id = manager.create().await.unwrap();
    assert!(manager.run(&id, RunRequest::new("n = 5")).await.ok);
    assert_eq!(
        manager
            .run(&id, RunRequest::new("return n * 2"))
            .await
            .value,
        json!(10)
    );
    assert!(manager.close(&id));
    assert_kind(
        &manager.run(&id, RunRequest::new("return n")).await,
        ErrorKind::SessionNotFound,
    );
}

#[tokio::test]
async fn a_backend_without_sessions_says_unsupported() {
    let runner = Runner::builder()
        .backend(Arc::new(pycage::DockerBackend::new()))
        .build()
        .unwrap();
    let err = runner.session().await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    assert!(err.message.contains("docker"), "{err}");
    let err = SessionManager::new(runner, SessionConfig::default()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
}

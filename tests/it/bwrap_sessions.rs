//! Sessions on the bubblewrap backend: one sandboxed native guest process serving run after
//! run. State persists, sessions stay apart, each run has its own limits and output, a run
//! that passes its deadline is interrupted and keeps the session unless it does not stop, a
//! run that loses its guest ends the session, and a dropped session leaves no process or
//! directory behind. Skips (failing in CI) where bubblewrap cannot run.

use crate::common;
use crate::os_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gate, assert_kind};
use pycage::{ErrorKind, InputFile, Limits, RunRequest, Runner, Session, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::json;

/// A runner on bubblewrap with the `math` tools and `limits`, or `None` (a skip) where
/// bubblewrap cannot run.
fn bwrap(limits: Limits) -> Option<Runner> {
    let subject = os_support::subject("bubblewrap")?;
    Some(subject.runner(
        ToolRegistry::with_builtins(),
        ToolPolicy::new().namespace("math"),
        limits,
    ))
}

async fn session(limits: Limits) -> Option<Session> {
    Some(bwrap(limits)?.session().await.expect("the session opens"))
}

/// A session with `limits` whose code may call `gate.wait`, and its gate; `None` where
/// bubblewrap cannot run.
async fn gated_session(limits: Limits) -> Option<(Session, Gate)> {
    let subject = os_support::subject("bubblewrap")?;
    let gate = Gate::default();
    let mut tools = ToolRegistry::with_builtins();
    gate.register(&mut tools);
    let runner = subject.runner(tools, ToolPolicy::new().namespace("gate"), limits);
    let session = runner.session().await.expect("the session opens");
    Some((session, gate))
}

fn wall(d: Duration) -> Limits {
    Limits::builder().wall_timeout(d).build().unwrap()
}

/// True while the host process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// The host pids of the processes whose name (`comm`) is `name`.
fn pids_named(name: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// The run directory bound at `/run/pycage` by the bubblewrap process above `pid`.
fn run_dir_above(mut pid: u32) -> Option<PathBuf> {
    for _ in 0..8 {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if let Some(i) = args.iter().position(|a| *a == b"/run/pycage")
            && i >= 2
            && args[i - 2] == b"--ro-bind"
        {
            return Some(PathBuf::from(String::from_utf8_lossy(args[i - 1]).as_ref()));
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        pid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))?
            .trim()
            .parse()
            .ok()?;
    }
    None
}

/// The name (`run-…`) of the pycage cgroup the host process `pid` is in, if any.
fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .flat_map(|l| l.split('/'))
        .find(|segment| segment.starts_with("run-"))
        .map(str::to_owned)
}

/// The directories of the cgroup called `name` that still exist.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    use pycage::os::cgroup::{self, CgroupSupport};
    let bases: Vec<PathBuf> = match cgroup::support() {
        Ok(CgroupSupport::V2 { base }) => vec![base.clone()],
        Ok(CgroupSupport::V1 {
            pids,
            memory,
            unified,
        }) => [Some(pids), Some(memory), unified.as_ref()]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
        Err(_) => Vec::new(),
    };
    bases
        .iter()
        .map(|b| b.join(name))
        .filter(|d| d.exists())
        .collect()
}

/// Waits (up to a generous backstop) until `pids` are gone.
async fn all_gone(pids: &[u32]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_keeps_sessions() {
    let backend = pycage::BubblewrapBackend::new();
    assert!(pycage::Backend::supports_sessions(&backend));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variable_an_import_and_a_function_persist_across_three_runs() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    let first = session
        .run(
            "import statistics\nx = 41\ndef double(n):\n    return n * 2\n\
             open('notes.txt', 'w').write('kept')",
        )
        .await;
    assert!(first.ok, "{first:#?}");
    let second = session.run("x += 1\nreturn [x, double(x)]").await;
    assert_eq!(second.value, json!([42, 84]), "{second:#?}");
    let third = session
        .run(
            "r = await add(a=x, b=1)\n\
             return [statistics.mean([x, double(x)]), open('notes.txt').read(), r['sum']]",
        )
        .await;
    assert_eq!(third.value, json!([63, "kept", 43]), "{third:#?}");
    assert_eq!(third.tool_calls, 1);
    assert_eq!(third.backend, "bubblewrap");
    assert_eq!(session.runs(), 3);
    assert!(session.ended().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_do_not_see_each_other_or_one_shot_runs() {
    let Some(runner) = bwrap(Limits::default()) else {
        return;
    };
    let a = runner.session().await.unwrap();
    let b = runner.session().await.unwrap();
    let left = a
        .run("import os\nsecret = 'a'\nopen('a.txt', 'w').write('a')\nreturn os.getpid()")
        .await;
    assert!(left.ok, "{left:#?}");
    assert!(runner.run("secret = 'one-shot'").await.ok);
    let look = "import os\nreturn [globals().get('secret'), os.listdir()]";
    let seen = b.run(look).await;
    assert_eq!(seen.value, json!([null, []]), "{seen:#?}");
    let one_shot = runner.run(look).await;
    assert_eq!(one_shot.value, json!([null, []]), "{one_shot:#?}");
    assert_eq!(a.run(look).await.value, json!(["a", ["a.txt"]]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_has_its_own_output_within_its_cap() {
    let limits = Limits::builder().max_output_bytes(1024).build().unwrap();
    let Some(session) = session(limits).await else {
        return;
    };
    let first = session
        .run("import sys\nprint('one')\nsys.stderr.write('err one\\n')")
        .await;
    assert_eq!(first.stdout, "one\n", "{first:#?}");
    assert_eq!(first.stderr, "err one\n", "{first:#?}");
    let flood = session
        .run("import os\nprint('x' * 100000, flush=True)\nos.write(1, b'y' * 100000)")
        .await;
    assert!(flood.ok, "{flood:#?}");
    assert!(flood.stdout_truncated, "{flood:#?}");
    assert!(flood.stdout.len() < 2048, "{}", flood.stdout.len());
    assert!(flood.stdout.starts_with("xxx") && flood.stdout.ends_with("yyy"));
    let third = session.run("print('three')\nraise ValueError('no')").await;
    assert_eq!(
        third.stdout, "three\n",
        "nothing of run 2 leaks in: {third:#?}"
    );
    assert!(third.stderr.is_empty(), "{third:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_interrupts_the_code_and_the_session_keeps_its_state() {
    let Some(session) = session(wall(Duration::from_millis(500))).await else {
        return;
    };
    common::a_timeout_interrupts_the_code_and_the_session_keeps_its_state(&session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_swallows_the_interrupt_ends_the_session_and_later_runs_say_so() {
    let Some(session) = session(wall(Duration::from_millis(500))).await else {
        return;
    };
    assert!(session.run("x = 1").await.ok);
    let code = "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass";
    let started = Instant::now();
    let r = session.run(code).await;
    assert!(started.elapsed() < Duration::from_secs(5), "{r:#?}");
    assert_kind(&r, ErrorKind::Timeout);
    assert!(r.timed_out && r.session_ended, "{r:#?}");
    assert!(
        r.error.as_ref().unwrap().message.contains("did not stop"),
        "{r:#?}"
    );
    for _ in 0..2 {
        let later = session.run("return x").await;
        assert_kind(&later, ErrorKind::SessionEnded);
        assert!(!later.session_ended, "only the ending run carries the flag");
        let message = &later.error.as_ref().unwrap().message;
        assert!(message.contains("run 2 ended it"), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_in_the_code_leave_the_session_usable() {
    let limits = Limits::builder().memory_bytes(512 << 20).build().unwrap();
    let Some(session) = session(limits).await else {
        return;
    };
    assert!(session.run("x = 1").await.ok);
    let raised = session.run("x = 2\nraise ValueError('no')").await;
    assert_kind(&raised, ErrorKind::GuestException);
    assert_eq!(
        raised.error.as_ref().unwrap().exception.as_deref(),
        Some("ValueError")
    );
    let memory = session.run("blob = bytearray(1 << 30)").await;
    assert_kind(&memory, ErrorKind::MemoryLimit);
    let tool = session.run("await add(a=[], b=1)").await;
    assert!(!tool.ok, "{tool:#?}");
    let syntax = session.run("def (:").await;
    assert_kind(&syntax, ErrorKind::SyntaxError);
    let exited = session.run("import sys\nsys.exit(3)").await;
    assert_kind(&exited, ErrorKind::GuestException);
    for r in [&raised, &memory, &tool, &syntax, &exited] {
        assert!(!r.session_ended, "{r:#?}");
    }
    let after = session.run("return x").await;
    assert_eq!(after.value, json!(2), "{after:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_dies_ends_the_session() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    assert!(session.run("x = 1").await.ok);
    let r = session
        .run("import os\nprint('bye', flush=True)\nos._exit(0)")
        .await;
    assert!(!r.ok && r.session_ended, "{r:#?}");
    assert_kind(&r, ErrorKind::GuestException);
    assert_eq!(r.stdout, "bye\n", "{r:#?}");
    assert_kind(&session.run("return x").await, ErrorKind::SessionEnded);

    let Some(runner) = bwrap(Limits::default()) else {
        return;
    };
    let session = runner.session().await.unwrap();
    let crash = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)";
    let r = session.run(crash).await;
    assert!(r.session_ended, "{r:#?}");
    // Classified as the same crash in a one-shot run is.
    let one_shot = runner.run(crash).await;
    assert_kind(&r, one_shot.error.as_ref().unwrap().kind);
    assert_kind(&session.run("1").await, ErrorKind::SessionEnded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_ceiling_is_per_run() {
    let limits = Limits::builder().max_tool_calls(2).build().unwrap();
    let Some(session) = session(limits).await else {
        return;
    };
    for _ in 0..3 {
        let r = session
            .run("await add(a=1, b=1)\nawait add(a=1, b=1)")
            .await;
        assert!(r.ok, "the ceiling is per run: {r:#?}");
        assert_eq!(r.tool_calls, 2);
    }
    let over = session
        .run("for _ in range(3):\n    await add(a=1, b=1)")
        .await;
    assert_kind(&over, ErrorKind::ToolCallLimit);
    assert_eq!(over.tool_calls, 2);
    assert!(!over.session_ended, "{over:#?}");
    let kept = session.run("f = add").await;
    assert!(kept.ok, "{kept:#?}");
    let r = session.run("await f(a=1, b=2)\nreturn 'ok'").await;
    assert_eq!(r.value, json!("ok"), "{r:#?}");
    assert_eq!(r.tool_calls, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_between_runs_reaches_no_run() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    let started = session
        .run(
            "import threading, time, asyncio\n\
             seen = []\n\
             def later():\n    time.sleep(0.3)\n    try:\n        seen.append(repr(asyncio.run(add(a=1, b=2))))\n    except BaseException as e:\n        seen.append(type(e).__name__ + ': ' + str(e))\n\
             threading.Thread(target=later, daemon=True).start()",
        )
        .await;
    assert!(started.ok, "{started:#?}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = session.run("return seen").await;
    assert_eq!(r.tool_calls, 0, "{r:#?}");
    assert_eq!(
        r.value,
        json!(["ToolError: the run has finished"]),
        "a call between runs is refused: {r:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_while_one_runs_is_refused_as_busy() {
    let Some((session, gate)) = gated_session(Limits::default()).await else {
        return;
    };
    common::a_second_run_is_refused_while_one_is_held(session, &gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_still_going_at_the_deadline_ends_there_and_the_session_lives() {
    let Some((session, _gate)) = gated_session(wall(Duration::from_millis(500))).await else {
        return;
    };
    common::a_tool_call_still_going_at_the_deadline_ends_there(&session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_kills_the_guest_and_ends_the_session() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    let name = "pycage-cancel";
    let named = session
        .run(&format!(
            "open('/proc/self/comm', 'w').write('{name}')\nx = 1"
        ))
        .await;
    assert!(named.ok, "{named:#?}");
    let pids = pids_named(name);
    assert_eq!(pids.len(), 1, "{pids:?}");
    let session = Arc::new(session);
    let s = session.clone();
    let cut = tokio::time::timeout(Duration::from_millis(300), async move {
        s.run("import time\nwhile True:\n    time.sleep(0.01)")
            .await
    })
    .await;
    assert!(cut.is_err(), "the caller gave up");
    assert!(
        all_gone(&pids).await,
        "the guest outlived its cancelled run"
    );
    let next = session.run("return x").await;
    assert_kind(&next, ErrorKind::SessionEnded);
    assert!(next.session_ended, "{next:#?}");
    assert_kind(&session.run("return x").await, ErrorKind::SessionEnded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_session_leaves_no_process_and_no_directory() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    // The guest and a child it forks rename themselves, so the host can find them.
    let r = session
        .run(
            "import os, time\n\
             open('/proc/self/comm', 'w').write('pycage-drop-a')\n\
             if os.fork() == 0:\n    open('/proc/self/comm', 'w').write('pycage-drop-b')\n    time.sleep(600)\n    os._exit(0)\n\
             time.sleep(0.2)",
        )
        .await;
    assert!(r.ok, "{r:#?}");
    let mut pids = pids_named("pycage-drop-a");
    assert_eq!(pids.len(), 1, "{pids:?}");
    let dir = run_dir_above(pids[0]).expect("the session's run directory");
    assert!(dir.is_dir(), "{}", dir.display());
    pids.extend(pids_named("pycage-drop-b"));
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|p| alive(*p)));
    let cgroup = cgroup_of(pids[0]);
    if let Some(name) = &cgroup {
        assert!(!cgroup_dirs(name).is_empty(), "{name}");
    }
    drop(session);
    assert!(all_gone(&pids).await, "a session's process outlived it");
    assert!(!dir.exists(), "the run directory outlived the session");
    if let Some(name) = &cgroup {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cgroup_dirs(name).is_empty() {
            assert!(Instant::now() < deadline, "{:?}", cgroup_dirs(name));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_and_bad_input_files_are_refused_without_ending_the_session() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    assert!(session.run("x = 1").await.ok);
    let fuel = Limits::builder().fuel(Some(1_000_000)).build().unwrap();
    let r = session.run_request(RunRequest::new("1").limits(fuel)).await;
    assert_kind(&r, ErrorKind::InvalidInput);
    let r = session
        .run_request(RunRequest::new("1").file(InputFile::new("../a.txt", b"a".to_vec())))
        .await;
    assert_kind(&r, ErrorKind::InvalidInput);
    assert!(
        r.error
            .as_ref()
            .unwrap()
            .message
            .starts_with("input file `"),
        "{r:#?}"
    );
    assert!(!r.session_ended);
    assert_eq!(session.run("return x").await.value, json!(1));
}

fn paths(r: &pycage::RunResult) -> Vec<&str> {
    r.files.iter().map(|f| f.path.as_str()).collect()
}

/// The session's working directory (a tmpfs in its sandbox) persists: each run's inputs join
/// it, and each run returns what it created or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_files_join_the_session_directory_and_each_run_returns_what_it_changed() {
    // The session's rlimits are its own: one file is capped at its max_file_bytes.
    let limits = Limits::builder().max_file_bytes(100).build().unwrap();
    let Some(session) = session(limits).await else {
        return;
    };
    let r = session
        .run_request(
            RunRequest::new(
                "import os\n\
                 open('out.txt', 'w').write(open('a.txt').read().upper())\n\
                 return os.getcwd()",
            )
            .file(InputFile::new("a.txt", b"abc".to_vec())),
        )
        .await;
    assert_eq!(r.value, json!("/work"), "{r:#?}");
    assert_eq!(paths(&r), ["out.txt"], "{r:#?}");
    assert_eq!(r.files[0].bytes.as_deref(), Some(&b"ABC"[..]));
    let r = session
        .run_request(
            RunRequest::new(
                "import os\n\
                 open('a.txt', 'a').write('!')\n\
                 return sorted(os.listdir())",
            )
            .file(InputFile::new("b.txt", b"b".to_vec())),
        )
        .await;
    assert_eq!(r.value, json!(["a.txt", "b.txt", "out.txt"]), "{r:#?}");
    assert_eq!(paths(&r), ["a.txt"]);
    assert_eq!(r.files[0].bytes.as_deref(), Some(&b"abc!"[..]));
    // A run that makes only a link returns nothing: a link is never followed on the way out.
    let r = session
        .run("import os\nos.symlink('/etc/passwd', 'p')")
        .await;
    assert!(r.ok, "{r:#?}");
    assert!(r.files.is_empty(), "{r:#?}");
    // One file past max_file_bytes is EFBIG, and the session goes on.
    let r = session
        .run(
            "import errno\n\
             try:\n    with open('big', 'wb') as f:\n        f.write(b'x' * 200)\n\
             except OSError as e:\n    return errno.errorcode[e.errno]",
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!("EFBIG"), "{r:#?}");
    assert_eq!(paths(&r), ["big"], "the bytes that fit: {r:#?}");
    assert_eq!(r.files[0].size, 100);
    // A FIFO (which would block a host opening it) or a link at an input's name is replaced
    // by the input; a FIFO is never returned.
    let r = session
        .run(
            "import os
os.mkfifo('fifo.txt')
os.symlink('fifo.txt', 'link.txt')",
        )
        .await;
    assert!(r.ok && r.files.is_empty(), "{r:#?}");
    let started = Instant::now();
    let r = session
        .run_request(
            RunRequest::new("return [open('fifo.txt').read(), open('link.txt').read()]")
                .file(InputFile::new("fifo.txt", b"f".to_vec()))
                .file(InputFile::new("link.txt", b"l".to_vec())),
        )
        .await;
    assert_eq!(r.value, json!(["f", "l"]), "{r:#?}");
    assert!(r.files.is_empty(), "{r:#?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_may_ask_for_a_larger_value_than_the_session_opened_with() {
    let Some(session) = session(Limits::default()).await else {
        return;
    };
    let big = Limits::builder().max_value_bytes(8 << 20).build().unwrap();
    let r = session
        .run_request(RunRequest::new("return 'v' * (6 << 20)").limits(big))
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.value.as_str().map(str::len), Some(6 << 20));
}

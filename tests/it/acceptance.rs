//! The foundation's acceptance tests, through the library.

use crate::common;

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use pycage::{ErrorKind, Limits, Runner, ToolPolicy, WasmBackend};
use serde_json::json;

#[tokio::test]
async fn seed_example() {
    let r = run(SEED).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(15));
    assert_eq!(r.tool_calls, 5);
    assert_eq!(r.backend, "wasm");
    assert!(r.fuel_consumed.unwrap() > 0);
    assert!(!r.timed_out);
}

#[tokio::test]
async fn initial_variables() {
    let r = run_vars("return base * 2", json!({"base": 21})).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(42));
}

#[tokio::test]
async fn bad_variable_names_are_invalid_input() {
    let r = run_vars("return 1", json!({"not an identifier": 1})).await;
    assert_kind(&r, ErrorKind::InvalidInput);
    let r = run_vars("return 1", json!({"__builtins__": 1})).await;
    assert_kind(&r, ErrorKind::InvalidInput);
}

#[tokio::test]
async fn guest_exception() {
    let r = run("1/0").await;
    assert_kind(&r, ErrorKind::GuestException);
    let e = r.error.unwrap();
    assert!(e.message.contains("ZeroDivisionError"), "{e:?}");
    assert_eq!(e.exception.as_deref(), Some("ZeroDivisionError"));
    let tb = e.traceback.unwrap();
    assert!(tb.contains("File \"<code>\", line 1, in <module>"), "{tb}");
    assert!(
        !tb.contains("pycage_runner"),
        "the runner's frames are hidden: {tb}"
    );
}

#[tokio::test]
async fn traceback_line_numbers_are_the_users() {
    let r = run("x = 1\n\n\ndef f():\n    return {}['missing']\n\ny = await add(a=1, b=2)\nf()\n")
        .await;
    let tb = r.error.unwrap().traceback.unwrap();
    assert!(tb.contains("line 8, in <module>"), "{tb}");
    assert!(tb.contains("line 5, in f"), "{tb}");
    assert!(tb.contains("KeyError: 'missing'"), "{tb}");
}

#[tokio::test]
async fn syntax_error_names_the_line() {
    let r = run("x = 1\ny = (\n").await;
    assert_kind(&r, ErrorKind::SyntaxError);
    let e = r.error.unwrap();
    assert!(e.message.contains("line 2"), "{e:?}");
}

#[tokio::test]
async fn call_ceiling_stops_the_seed_example() {
    let limits = Limits::builder().max_tool_calls(2).build().unwrap();
    let r = runner(ToolPolicy::new().namespace("math"), limits)
        .run(SEED)
        .await;
    assert_kind(&r, ErrorKind::ToolCallLimit);
    assert_eq!(r.tool_calls, 2);
    assert!(r.error.unwrap().message.contains("tool call limit"));
}

#[tokio::test]
async fn a_failure_after_a_caught_ceiling_is_the_codes_own() {
    let limits = Limits::builder().max_tool_calls(1).build().unwrap();
    let code =
        "await add(a=1, b=1)\ntry:\n    await add(a=1, b=1)\nexcept ToolError:\n    pass\n1 / 0";
    let r = runner(ToolPolicy::new().namespace("math"), limits)
        .run(code)
        .await;
    assert_kind(&r, ErrorKind::GuestException);
    assert_eq!(
        r.error.unwrap().exception.as_deref(),
        Some("ZeroDivisionError")
    );
}

#[tokio::test]
async fn a_caught_ceiling_is_the_guests_business() {
    let limits = Limits::builder().max_tool_calls(1).build().unwrap();
    let code = "await add(a=1, b=1)\ntry:\n    await add(a=1, b=1)\nexcept ToolError as e:\n    return [e.kind, str(e)]";
    let r = runner(ToolPolicy::new().namespace("math"), limits)
        .run(code)
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value,
        json!(["limit-exceeded", "tool call limit reached (1 calls)"])
    );
    assert_eq!(r.tool_calls, 1);
}

#[tokio::test]
async fn allowlist_without_add_never_executes_add() {
    let spy = Spy::new();
    let runner = Runner::builder()
        .tools(spy.registry.clone())
        .policy(ToolPolicy::new().allow("text.echo"))
        .build()
        .unwrap();
    let r = runner
        .run(&SEED.replace("await add", "await spy_add"))
        .await;
    assert_kind(&r, ErrorKind::GuestException);
    assert!(
        r.error.as_ref().unwrap().message.contains("NameError"),
        "{r:#?}"
    );
    // Reaching for it by name does not work either.
    for name in [
        "spy.add",
        "add",
        "spy.secret",
        "SPY.ADD",
        " spy.add",
        "spy.add\0",
    ] {
        let code = format!(
            "try:\n    call_tool({name:?}, a=1, b=2)\nexcept ToolError as e:\n    return e.kind"
        );
        let r = runner.run(&code).await;
        assert_eq!(r.value, json!("not-found"), "{name:?}: {r:#?}");
    }
    assert_eq!(spy.calls(), 0, "a tool outside the allowlist ran");
    assert_eq!(r.tool_calls, 0);
}

#[tokio::test]
async fn tools_are_reachable_through_their_namespace_even_when_bare_names_clash() {
    let spy = Spy::new();
    let runner = Runner::builder()
        .tools(spy.registry.clone())
        .policy(ToolPolicy::new().allow("spy.add").allow("math.add"))
        .build()
        .unwrap();
    // `add` is shared by two namespaces: no bare binding, both reachable as attributes.
    let r = runner
        .run(
            "r = await math.add(a=2, b=3)\n\
             s = await spy.add(a=1, b=1)\n\
             return [r['sum'], s['sum'], 'add' in globals(), repr(math), hasattr(spy, 'secret')]",
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!([5, 0, false, "<tools math: add>", false]));
    assert_eq!((r.tool_calls, spy.calls()), (2, 1));
    // A variable of the namespace's name wins; `call_tool` still reaches the tool.
    let vars = serde_json::Map::from_iter([("math".to_owned(), json!(7))]);
    let r = runner
        .run_with(
            "return [math, call_tool('math.add', a=1, b=2)['sum']]",
            vars,
            &Limits::default(),
        )
        .await;
    assert_eq!(r.value, json!([7, 3]), "{r:#?}");
    // `import math` rebinds the name to the module, as in any script.
    let r = runner.run("import math\nreturn math.floor(2.5)").await;
    assert_eq!(r.value, json!(2), "{r:#?}");
}

#[tokio::test]
async fn tools_are_denied_by_default() {
    let r = runner(ToolPolicy::new(), Limits::default())
        .run("try:\n    call_tool('math.add', a=1, b=2)\nexcept ToolError as e:\n    return [e.kind, str(e)]")
        .await;
    assert_eq!(
        r.value,
        json!(["not-found", "tool `math.add` is not available"])
    );
}

#[tokio::test]
async fn tool_errors_are_catchable_with_the_brokers_message() {
    let r = run(
        "try:\n    await divide(a=1, b=0)\nexcept ToolError as e:\n    return [e.kind, str(e)]",
    )
    .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(["failed", "division by zero"]));
    assert_eq!(r.tool_calls, 1);
    let r = run("return call_tool('add', a=2, b=3)").await;
    assert_eq!(r.value, json!({"sum": 5}));
    let r = run("return await add(a='x', b=1)").await;
    assert_kind(&r, ErrorKind::GuestException);
    assert!(r.error.unwrap().message.starts_with("ToolError: "));
}

#[tokio::test]
async fn busy_loop_hits_the_wall_clock() {
    warm_up().await;
    let started = Instant::now();
    let r = run_limited("while True:\n    pass", wall(Duration::from_secs(1))).await;
    let took = started.elapsed();
    assert_kind(&r, ErrorKind::Timeout);
    assert!(r.timed_out);
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// A metered engine stops a computing guest at a fuel yield, an unmetered one at an epoch
/// check: each must hold the wall clock for a loop and for a sleep, also with every worker of
/// the runtime busy (more guests than workers) and on a current-thread runtime.
async fn both_engines_hold_the_wall_clock(concurrent: usize) {
    for meter_fuel in [true, false] {
        let backend = WasmBackend::builder()
            .meter_fuel(meter_fuel)
            .build()
            .unwrap();
        backend.prepare().await.unwrap();
        let r = Runner::builder()
            .backend(std::sync::Arc::new(backend))
            .limits(wall(Duration::from_secs(1)))
            .build()
            .unwrap();
        for code in ["while True:\n    pass", "import time\ntime.sleep(30)"] {
            let started = Instant::now();
            let mut runs = tokio::task::JoinSet::new();
            for _ in 0..concurrent {
                let r = r.clone();
                runs.spawn(async move { r.run(code).await });
            }
            for r in runs.join_all().await {
                assert_kind(&r, ErrorKind::Timeout);
            }
            let took = started.elapsed();
            let what = format!("{code:?}, metered: {meter_fuel}, {concurrent} at once");
            assert!(
                took >= Duration::from_millis(990),
                "{what}: ended early, {took:?}"
            );
            assert!(took < Duration::from_secs(2), "{what}: took {took:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_hold_the_wall_clock_with_every_worker_busy() {
    both_engines_hold_the_wall_clock(4).await;
}

#[tokio::test]
async fn both_engines_hold_the_wall_clock_on_one_thread() {
    both_engines_hold_the_wall_clock(1).await;
}

/// A short run finishes within one poll of its future. Before runs yielded, a task running
/// them back to back never gave its worker thread back: callers spawned beside it on that
/// worker, or later from outside the runtime, did not start until it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_running_back_to_back_take_turns() {
    warm_up().await;
    let r = runner(ToolPolicy::new(), Limits::default());
    let until = Instant::now() + Duration::from_millis(1500);
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let r = r.clone();
        callers.spawn(async move {
            let mut runs = 0usize;
            while Instant::now() < until {
                let result = r.run("pass").await;
                assert!(result.ok, "{result:#?}");
                runs += 1;
            }
            runs
        });
    }
    let runs = callers.join_all().await;
    let mean = runs.iter().sum::<usize>() / runs.len();
    assert!(
        runs.iter().all(|&n| n >= 2 && n * 4 >= mean),
        "runs per caller: {runs:?}"
    );
}

#[tokio::test]
async fn a_loop_that_swallows_every_exception_still_times_out() {
    let code =
        "while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass";
    warm_up().await;
    let started = Instant::now();
    let r = run_limited(code, wall(Duration::from_secs(1))).await;
    assert_kind(&r, ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn sleeping_hits_the_wall_clock() {
    warm_up().await;
    for code in [
        "import time\ntime.sleep(30)",
        "import asyncio\nawait asyncio.sleep(30)",
    ] {
        let started = Instant::now();
        let r = run_limited(code, wall(Duration::from_secs(1))).await;
        let took = started.elapsed();
        assert_kind(&r, ErrorKind::Timeout);
        assert!(took < Duration::from_secs(2), "{code}: took {took:?}");
    }
}

#[tokio::test]
async fn fuel_budget_stops_a_busy_loop() {
    let limits = Limits::builder().fuel(Some(50_000_000)).build().unwrap();
    let r = run_limited("while True:\n    pass", limits).await;
    assert_kind(&r, ErrorKind::FuelExhausted);
    assert!(!r.timed_out);
    assert!(r.fuel_consumed.unwrap() >= 50_000_000);
}

#[tokio::test]
async fn same_code_same_fuel() {
    let code = "import json\nreturn sum(len(json.dumps({'i': i})) for i in range(2000))";
    let a = run(code).await;
    let b = run(code).await;
    assert!(a.ok && b.ok, "{a:#?}");
    assert_eq!(a.fuel_consumed, b.fuel_consumed);
    let seed_a = run(SEED).await;
    let seed_b = run(SEED).await;
    assert_eq!(seed_a.fuel_consumed, seed_b.fuel_consumed);
}

#[tokio::test]
async fn memory_limit_is_enforced_and_the_host_survives() {
    let r = run("x = bytearray(1 << 30)").await;
    assert_kind(&r, ErrorKind::MemoryLimit);
    let r = run("chunks = []\nwhile True:\n    chunks.append(bytearray(10 << 20))").await;
    assert_kind(&r, ErrorKind::MemoryLimit);
    let after = run("return 'alive'").await;
    assert_eq!(after.value, json!("alive"));
}

#[tokio::test]
async fn memory_within_the_limit_is_usable() {
    let r = run("x = bytearray(100 << 20)\nreturn len(x)").await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(100 << 20));
}

/// The interpreter's snapshot occupies the start of the guest's memory; what the build leaves
/// there (see `_finish_snapshot` in `guest-default/python/pycage_wasm.py`) is taken from every run.
/// Under the smallest memory limit, a run still gets 34 MiB in one piece (34 today; 38
/// before the rest of the standard library was compiled into the snapshot: see
/// `_store_the_rest_of_the_library` in `guest-default/python/pycage_wasm.py` for what it costs and
/// why it lies where it does).
#[tokio::test]
async fn the_smallest_memory_limit_leaves_room_for_a_large_buffer() {
    let limits = Limits::builder().memory_bytes(64 << 20).build().unwrap();
    let r = run_limited("x = bytearray(34 << 20)\nreturn len(x)", limits).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(34 << 20));
}

#[tokio::test]
async fn output_is_capped_with_a_marker() {
    let limits = Limits::builder().max_output_bytes(256).build().unwrap();
    let r = run_limited(
        "print('x' * 10**6)\nimport sys\nsys.stderr.write('e' * 10**6)",
        limits,
    )
    .await;
    assert!(r.ok, "{r:#?}");
    assert!(r.stdout_truncated && r.stderr_truncated);
    let marker = r.stdout.find("\n[...").expect("a cut marker");
    let marker_len = r.stdout[marker..].find("]\n").unwrap() + 2;
    let kept = r.stdout.len() - marker_len;
    assert!(kept <= 256, "kept {kept} bytes");
    assert_eq!(
        r.stdout.matches('x').count(),
        255,
        "head and tail, minus the newline"
    );
    assert!(r.stdout.contains("bytes cut by pycage"));
}

#[tokio::test]
async fn raw_fd_writes_are_captured() {
    let r =
        run("import os\nos.write(1, b'raw-out\\n')\nos.write(2, b'raw-err\\n')\nprint('printed')")
            .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.stdout, "raw-out\nprinted\n");
    assert_eq!(r.stderr, "raw-err\n");
}

#[tokio::test]
async fn host_files_are_not_readable() {
    let dir = std::env::temp_dir().join(format!("pycage-canary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let canary = dir.join("secret.txt");
    std::fs::write(&canary, "CANARY-HOST-FILE").unwrap();
    let path = canary.display().to_string();
    for code in [
        format!("return open({path:?}).read()"),
        format!(
            "import os\nreturn os.listdir({:?})",
            dir.display().to_string()
        ),
        "return open('/etc/passwd').read()".to_owned(),
    ] {
        let r = run(&code).await;
        assert_kind(&r, ErrorKind::GuestException);
        let text = format!("{r:?}");
        assert!(
            !text.contains("CANARY-HOST-FILE") && !text.contains("root:"),
            "{text}"
        );
    }
    // The guest's `/` is its own empty scratch directory, not the host's root.
    let r = run("import os\nreturn os.listdir('/')").await;
    assert_eq!(r.value, json!([]), "{r:#?}");
    let r = run(&format!(
        "open({:?}, 'w').write('x')",
        dir.join("written").display().to_string()
    ))
    .await;
    assert_kind(&r, ErrorKind::GuestException);
    assert!(!dir.join("written").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn sockets_to_loopback_fail_and_nothing_connects() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = run(&format!(
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))"
    ))
    .await;
    assert_kind(&r, ErrorKind::CapabilityDenied);
    assert!(r.error.unwrap().message.contains("PermissionError"));
    let r = run(&format!(
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/')"
    ))
    .await;
    // urllib goes through `net.fetch`, which this runner does not expose: a URLError, as
    // its users expect, that says so.
    let message = &r.error.as_ref().expect("the run failed").message;
    assert!(
        message.contains("URLError") && message.contains("no network"),
        "{r:#?}"
    );
    let r = run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)").await;
    assert_kind(&r, ErrorKind::CapabilityDenied);
    // A denial the code catches is its business; the run goes on.
    let r = run(
        "import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    return 'denied'",
    )
    .await;
    assert_eq!(r.value, json!("denied"));
    let mut accepted = 0;
    while let Ok((mut s, _)) = listener.accept() {
        let _ = s.read(&mut [0; 16]);
        accepted += 1;
    }
    assert_eq!(accepted, 0, "the guest reached the host's loopback");
}

#[tokio::test]
async fn host_environment_is_invisible() {
    // The host has PATH, HOME and more; the guest sees none of it (the CLI test plants a
    // secret in the environment and looks for it, too).
    assert!(std::env::var_os("PATH").is_some());
    let r = run("import os\nreturn [dict(os.environ), os.getcwd()]").await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!([{}, "/"]));
}

#[tokio::test]
async fn deep_nesting_in_source_runs() {
    let code = format!("return {}1{}", "(".repeat(150), ")".repeat(150));
    let r = run(&code).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!(1));
    let code = format!("x = {}1{}\nreturn 'ok'", "[".repeat(150), "]".repeat(150));
    assert_eq!(run(&code).await.value, json!("ok"));
}

#[tokio::test]
async fn too_deep_nesting_in_source_is_a_clean_syntax_error() {
    for code in [
        format!("return {}1{}", "(".repeat(300), ")".repeat(300)),
        format!("return {}1", "-".repeat(100_000)),
    ] {
        let r = run(&code).await;
        assert_kind(&r, ErrorKind::SyntaxError);
    }
}

#[tokio::test]
async fn deep_recursion_is_a_clean_error() {
    let cases = [
        ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
        (
            "import json\njson.loads('[' * 100000 + ']' * 100000)",
            "RecursionError",
        ),
        (
            "class R:\n    def __repr__(self):\n        return repr(self)\nrepr(R())",
            "RecursionError",
        ),
        (
            "l = []\nfor _ in range(100000):\n    l = [l]\nrepr(l)",
            "RecursionError",
        ),
    ];
    for (code, exception) in cases {
        let r = run(code).await;
        assert_kind(&r, ErrorKind::GuestException);
        assert_eq!(
            r.error.unwrap().exception.as_deref(),
            Some(exception),
            "{code}"
        );
    }
    // Valid code within CPython's limits runs.
    let r = run("import json\nreturn len(json.dumps(json.loads('[' * 2000 + ']' * 2000)))").await;
    assert_eq!(r.value, json!(4000));
    let r = run("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nreturn f(900)").await;
    assert_eq!(r.value, json!(900));
}

#[tokio::test]
async fn nothing_leaks_between_runs() {
    let first = run(
        "import json, sys, builtins\njson.leak = 1\nbuiltins.leak = 2\nsys.modules['leak'] = 3\nglobal_leak = 4\nreturn 'set'",
    )
    .await;
    assert_eq!(first.value, json!("set"));
    let second = run(
        "import json, sys, builtins\nreturn [hasattr(json, 'leak'), hasattr(builtins, 'leak'), 'leak' in sys.modules, 'global_leak' in globals()]",
    )
    .await;
    assert_eq!(second.value, json!([false, false, false, false]));
}

#[tokio::test]
async fn exits_are_results_not_crashes() {
    let r = run("import sys\nsys.exit(0)").await;
    assert!(r.ok, "{r:#?}");
    let r = run("import sys\nsys.exit(3)").await;
    assert_kind(&r, ErrorKind::GuestException);
    assert_eq!(r.error.unwrap().exception.as_deref(), Some("SystemExit"));
    let r = run("import os\nos._exit(0)").await;
    assert!(r.ok, "{r:#?}");
    let r = run("import os\nos._exit(7)").await;
    assert_kind(&r, ErrorKind::GuestException);
    assert!(
        r.error
            .unwrap()
            .message
            .contains("exited with a failure status")
    );
    let r = run("raise KeyboardInterrupt").await;
    assert_kind(&r, ErrorKind::GuestException);
    assert_eq!(run("return 'alive'").await.value, json!("alive"));
}

#[tokio::test]
async fn error_texts_carry_no_host_paths() {
    let host_markers = [
        env!("CARGO_MANIFEST_DIR"),
        "/root",
        "/home",
        ".rs:",
        "panicked",
    ];
    let codes = [
        "1/0",
        "import socket\nsocket.socket()",
        "x = bytearray(1 << 30)",
        "open('/etc/passwd')",
        "import os\nos._exit(3)",
        "def f():\n    f()\nf()",
        "raise SystemExit('bye')",
    ];
    for code in codes {
        let r = run(code).await;
        let text = serde_json::to_string(&r.error).unwrap();
        for marker in host_markers {
            assert!(!text.contains(marker), "{code}: {marker} in {text}");
        }
    }
}

#[tokio::test]
async fn oversized_code_is_refused_before_running() {
    let limits = Limits::builder().max_code_bytes(1000).build().unwrap();
    let r = run_limited(&"#".repeat(1001), limits).await;
    assert_kind(&r, ErrorKind::InvalidInput);
}

#[tokio::test]
async fn empty_and_odd_code() {
    assert!(run("").await.ok);
    assert!(run("   \n\n# just a comment\n").await.ok);
    assert_kind(&run("x = 1\0").await, ErrorKind::SyntaxError);
}

#[tokio::test]
async fn runs_in_parallel_do_not_interfere() {
    let runner = runner(ToolPolicy::new().namespace("math"), Limits::default());
    let runs = (0..8).map(|i| {
        let runner = runner.clone();
        tokio::spawn(async move {
            runner
                .run(&format!("r = await add(a={i}, b=1)\nreturn r['sum']"))
                .await
        })
    });
    for (i, run) in runs.enumerate() {
        let r = run.await.unwrap();
        assert_eq!(r.value, json!(i + 1), "{r:#?}");
        assert_eq!(r.tool_calls, 1);
    }
}

/// Loads the guest before a timed test, so the timing is the run's alone.
async fn warm_up() {
    WasmBackend::shared().unwrap().prepare().await.unwrap();
}

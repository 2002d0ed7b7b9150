//! `pycage run` end to end: arguments, output, exit codes.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn pycage(args: &[&str]) -> Output {
    pycage_with(args, None, &[])
}

fn pycage_with(args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pycage"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("pycage starts");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn json_result(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(out)));
    assert_eq!(lines.next(), None, "--json prints exactly one line: {text}");
    serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn write_temp(name: &str, contents: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pycage-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn seed_example_through_the_cli() {
    let file = write_temp("seed.py", common::SEED.as_bytes());
    let out = pycage(&[
        "run",
        file.to_str().unwrap(),
        "--namespace",
        "math",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = json_result(&out);
    assert_eq!(r["ok"], json!(true));
    assert_eq!(r["value"], json!(15));
    assert_eq!(r["tool_calls"], json!(5));
    for field in [
        "ok",
        "value",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "error",
        "tool_calls",
        "fuel_consumed",
        "duration",
        "backend",
        "timed_out",
    ] {
        assert!(r.get(field).is_some(), "missing {field}: {r}");
    }
}

#[test]
fn seed_example_from_stdin_with_human_output() {
    let out = pycage_with(
        &["run", "-", "--namespace", "math"],
        Some(common::SEED.as_bytes()),
        &[],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "15\n");
}

#[test]
fn variables_from_the_command_line() {
    let out = pycage(&["run", "-c", "return base * 2", "--var", "base=21"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    let out = pycage(&[
        "run",
        "-c",
        "return name",
        "--var",
        "name=\"Ada\"",
        "--json",
    ]);
    assert_eq!(json_result(&out)["value"], json!("Ada"));
}

#[test]
fn guest_failure_exits_1_with_a_summary() {
    let out = pycage(&["run", "-c", "print('before')\n1/0"]);
    assert_eq!(code(&out), 1);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");
    let err = stderr(&out);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    assert!(err.contains("pycage: guest_exception:"), "{err}");
    let out = pycage(&["run", "-c", "1/0", "--json"]);
    assert_eq!(code(&out), 1);
    let r = json_result(&out);
    assert_eq!(r["error"]["kind"], json!("guest_exception"));
}

#[test]
fn limits_from_the_command_line() {
    let file = write_temp("seed-limit.py", common::SEED.as_bytes());
    let out = pycage(&[
        "run",
        file.to_str().unwrap(),
        "--namespace",
        "math",
        "--max-tool-calls",
        "2",
        "--json",
    ]);
    assert_eq!(code(&out), 1);
    let r = json_result(&out);
    assert_eq!(
        (r["ok"].clone(), r["tool_calls"].clone()),
        (json!(false), json!(2))
    );
    assert_eq!(r["error"]["kind"], json!("tool_call_limit"));

    let started = Instant::now();
    let out = pycage(&["run", "-c", "while True: pass", "--timeout", "1s", "--json"]);
    let r = json_result(&out);
    assert_eq!(r["error"]["kind"], json!("timeout"));
    assert_eq!(r["timed_out"], json!(true));
    // The process includes loading the guest; the backstop is generous.
    assert!(started.elapsed() < Duration::from_secs(10));

    let out = pycage(&[
        "run",
        "-c",
        "while True: pass",
        "--fuel",
        "10000000",
        "--json",
    ]);
    assert_eq!(json_result(&out)["error"]["kind"], json!("fuel_exhausted"));

    let out = pycage(&[
        "run",
        "-c",
        "x = bytearray(200 << 20)",
        "--memory",
        "128MiB",
        "--json",
    ]);
    assert_eq!(json_result(&out)["error"]["kind"], json!("memory_limit"));

    let out = pycage(&[
        "run",
        "-c",
        "print('x' * 10**6)",
        "--max-output",
        "256",
        "--json",
    ]);
    let r = json_result(&out);
    assert_eq!(r["stdout_truncated"], json!(true));
    assert!(r["stdout"].as_str().unwrap().matches('x').count() <= 256);
}

#[test]
fn raw_writes_never_reach_the_hosts_stdout() {
    let out = pycage(&[
        "run",
        "-c",
        "import os\nos.write(1, b'RAW-CANARY')\nos.write(2, b'RAW-ERR')",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The one line on stdout is the JSON result; the bytes are inside it, not beside it.
    let r = json_result(&out);
    assert_eq!(r["stdout"], json!("RAW-CANARY"));
    assert_eq!(r["stderr"], json!("RAW-ERR"));
    assert!(!stderr(&out).contains("RAW-ERR"));
}

#[test]
fn the_hosts_environment_is_invisible() {
    let out = pycage_with(
        &[
            "run",
            "-c",
            "import os\nreturn [dict(os.environ), str(os.environ.get('PYCAGE_SECRET'))]",
            "--json",
        ],
        None,
        &[("PYCAGE_SECRET", "CANARY-ENV-SECRET")],
    );
    let r = json_result(&out);
    assert_eq!(r["value"], json!([{}, "None"]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("CANARY-ENV-SECRET"));
}

/// The issue's program: 2,000 floats at every scale, printed by the guest and returned.
const FLOATS: &str = "import random\nrandom.seed(1)\nxs = [random.uniform(-1, 1) * 10 ** random.randint(-300, 300) for _ in range(2000)]\nprint(repr(xs))\nreturn xs";

#[test]
fn json_output_carries_every_float_bit_for_bit() {
    let out = pycage(&["run", "--json", "--max-output", "1MiB", "-c", FLOATS]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = json_result(&out);
    // What the guest printed is its own repr of each float: the reference.
    let printed: Vec<f64> = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
    let returned = r["value"].as_array().unwrap();
    assert_eq!(printed.len(), 2000);
    assert_eq!(returned.len(), 2000);
    let changed = printed
        .iter()
        .zip(returned)
        .filter(|(p, v)| v.as_f64().map(f64::to_bits) != Some(p.to_bits()))
        .count();
    assert_eq!(changed, 0, "floats changed between the guest and --json");
}

#[test]
fn usage_errors_exit_2_and_say_why() {
    let cases: &[(&[&str], &str)] = &[
        (&["run"], "FILE"),
        (&["run", "-c", "1", "--timeout", "5"], "unit"),
        (&["run", "-c", "1", "--timeout", "0s"], "wall_timeout"),
        (&["run", "-c", "1", "--timeout=-5s"], "-5s"),
        (&["run", "-c", "1", "--memory", "0"], "memory_bytes"),
        (&["run", "-c", "1", "--memory", "lots"], "lots"),
        (&["run", "-c", "1", "--var", "x"], "NAME=JSON"),
        (&["run", "-c", "1", "--var", "x=hello"], "not JSON"),
        (
            &["run", "-c", "1", "--var", "x=18446744073709551616"],
            "the integer 18446744073709551616 is outside",
        ),
        (&["run", "-c", "1", "--var", "not-an-ident=1"], "identifier"),
        (
            &["run", "-c", "1", "--backend", "nope"],
            "possible values: wasm, bubblewrap",
        ),
        (&["run", "-c", "1", "--namespace", "nope"], "nope"),
        (&["run", "-c", "1", "--allow", "math.nope"], "math.nope"),
        (&["run", "/no/such/file.py"], "/no/such/file.py"),
        (
            &["run", "-c", "1", "--tools", "/no/such/tools.toml"],
            "tools.toml",
        ),
        (&["run", "-c", "1", "--seed", "x"], "--seed"),
        (
            &["run", "-c", "1", "--deterministic", "--backend", "local"],
            "needs the wasm backend",
        ),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, needle) in cases {
        let out = pycage(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn deterministic_runs_repeat_byte_for_byte_and_the_seed_changes_them() {
    let code =
        "import random, time, uuid\nprint(time.time(), uuid.uuid4())\nreturn random.random()";
    let run = |seed: &str| {
        let out = pycage(&[
            "run",
            "--json",
            "--deterministic",
            "--seed",
            seed,
            "-c",
            code,
        ]);
        assert_eq!(self::code(&out), 0, "{}", stderr(&out));
        let r = json_result(&out);
        (
            r["stdout"].clone(),
            r["value"].clone(),
            r["fuel_consumed"].clone(),
        )
    };
    let (a, b, c) = (run("1"), run("1"), run("2"));
    assert_eq!(a, b);
    assert!(a.2.as_u64().unwrap() > 0, "{a:?}");
    assert_ne!(a.1, c.1, "another seed, other random numbers");
    assert!(a.0.as_str().unwrap().starts_with("946684800.0 "), "{a:?}");
}

#[test]
fn meter_scores_programs_by_fuel_and_exits_with_the_worst_status() {
    let ok = write_temp(
        "ok.py",
        b"import random\nprint(sum(random.random() for _ in range(100)))\n",
    );
    let bad = write_temp("bad.py", b"raise ValueError('no')\n");
    let meter = |files: &[&Path]| {
        let mut args = vec!["meter", "--json"];
        args.extend(files.iter().map(|f| f.to_str().unwrap()));
        let out = pycage(&args);
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (code(&out), lines)
    };
    let (first_code, first) = meter(&[&ok]);
    let (again_code, again) = meter(&[&ok]);
    assert_eq!((first_code, again_code), (0, 0), "{first:?}");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["status"], "ok");
    assert!(first[0]["fuel"].as_u64().unwrap() > 0, "{first:?}");
    for key in ["fuel", "stdout_blake3", "stdout_bytes", "seed"] {
        assert_eq!(
            first[0][key], again[0][key],
            "{key}: a second meter differs"
        );
    }
    let (mixed_code, mixed) = meter(&[&ok, &bad]);
    assert_eq!(mixed_code, 1, "a failing program fails the batch");
    assert_eq!(
        mixed[0]["fuel"], first[0]["fuel"],
        "the same program, the same fuel"
    );
    assert_eq!(mixed[1]["status"], "guest_exception");
    // The text form names each file and totals the fuel.
    let out = pycage(&["meter", ok.to_str().unwrap(), ok.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let fuel = first[0]["fuel"].as_u64().unwrap();
    assert!(text.contains(&format!("fuel {fuel}")), "{text}");
    assert!(
        text.contains(&format!("total  fuel {}", 2 * fuel)),
        "{text}"
    );
    // A missing file is refused before anything runs.
    let out = pycage(&["meter", ok.to_str().unwrap(), "/no/such/program.py"]);
    assert_eq!(code(&out), 2);
    assert!(
        out.stdout.is_empty(),
        "nothing ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn invalid_utf8_source_is_a_usage_error() {
    let file = write_temp("bad.py", b"print('ok')\n\xff\xfe\n");
    let out = pycage(&["run", file.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("not valid UTF-8"), "{}", stderr(&out));
}

#[test]
fn unknown_keys_in_a_tools_file_are_named() {
    let file = write_temp(
        "tools.toml",
        b"[[tool]]\nname = \"t\"\nnamespace = \"n\"\ndescription = \"d\"\ncommand = [\"true\"]\ncomand = [\"x\"]\n",
    );
    let out = pycage(&["run", "-c", "1", "--tools", file.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("comand"), "{}", stderr(&out));
}

#[test]
fn the_quickstart_runs_with_its_command_tool() {
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/quickstart.py")
            .exists()
    );
    let out = pycage(&[
        "run",
        "examples/quickstart.py",
        "--tools",
        "examples/tools.toml",
        "--allow",
        "add",
        "--allow",
        "word_count",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = json_result(&out);
    assert_eq!(r["value"], json!({"total": 395, "top_word": ["the", 3]}));
    assert_eq!(r["tool_calls"], json!(6));
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("word_count tool says 11 words")
    );
}

#[test]
fn a_failing_command_tool_is_a_catchable_tool_error() {
    let code_text =
        "try:\n    await word_count(text=5)\nexcept ToolError as e:\n    return [e.kind, str(e)]";
    let out = pycage(&[
        "run",
        "-c",
        code_text,
        "--tools",
        "examples/tools.toml",
        "--namespace",
        "demo",
        "--json",
    ]);
    let r = json_result(&out);
    assert_eq!(
        r["value"],
        json!(["failed", "`text` must be a string"]),
        "{r}"
    );
}

#[test]
fn backends_lists_each_backend_and_how_wasm_slots_are_reset() {
    let out = pycage(&["backends", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = json_result(&out);
    let rows = table.as_array().expect("a list of backends");
    let names: Vec<_> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for kind in pycage::BackendKind::ALL {
        assert!(names.contains(&kind.name()), "{kind} is missing: {names:?}");
    }
    let wasm = rows.iter().find(|r| r["name"] == "wasm").unwrap();
    // No swap here means in place, where the kernel can scan; any swap means release.
    let swaps = std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1);
    let reset = wasm["slot_reset"]
        .as_str()
        .expect("the wasm row says how slots are reset");
    assert!(reset == "in_place" || reset == "release", "{reset}");
    if swaps {
        assert_eq!(
            reset, "release",
            "a host with swap must not reset slots in place"
        );
    }

    let text = pycage(&["backends"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "wasm memory slots after a run: {}",
            if reset == "in_place" {
                "reset in place"
            } else {
                "released"
            }
        )),
        "{text}"
    );
}

#[test]
fn bench_idles_before_each_latency_sample_when_asked() {
    let started = Instant::now();
    let out = pycage(&[
        "bench",
        "--only",
        "fresh_pass",
        "--iterations",
        "5",
        "--idle",
        "50ms",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json_result(&out);
    assert_eq!(report["idle_us"], json!(50_000));
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["case"], json!("fresh_pass"));
    assert_eq!(rows[0]["pycage"]["n"], json!(5));
    // Five samples, each after 50 ms idle (the warm-up runs do not idle).
    assert!(started.elapsed() >= Duration::from_millis(250));

    let bad = pycage(&["bench", "--idle", "soon"]);
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
}

#[test]
fn files_go_in_with_file_and_come_out_with_out_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data.csv");
    std::fs::write(&data, "a,b\n1,2\n").unwrap();
    let out_dir = tmp.path().join("out");
    let named = format!("in/renamed.csv={}", data.display());
    let program = "import csv, os\n\
                rows = list(csv.reader(open('data.csv')))\n\
                open('summary.txt', 'w').write(str(len(rows)))\n\
                os.makedirs('plots', exist_ok=True)\n\
                open('plots/p.bin', 'wb').write(bytes([0, 1, 2]))\n\
                return open('in/renamed.csv').read()";
    let args = [
        "run",
        "--json",
        "--file",
        data.to_str().unwrap(),
        "--file",
        &named,
        "--out-dir",
        out_dir.to_str().unwrap(),
        "-c",
        program,
    ];
    let out = pycage(&args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = json_result(&out);
    assert_eq!(r["value"], json!("a,b\n1,2\n"));
    // --json lists the produced files without their bytes (--json-files adds them).
    assert_eq!(
        r["files"],
        json!([{"path": "plots/p.bin", "size": 3}, {"path": "summary.txt", "size": 1}])
    );
    assert_eq!(
        std::fs::read(out_dir.join("plots/p.bin")).unwrap(),
        [0, 1, 2]
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("summary.txt")).unwrap(),
        "2"
    );
    // The inputs, unchanged, are not produced files.
    assert!(!out_dir.join("data.csv").exists() && !out_dir.join("in").exists());

    // Again into the same directory: refused without --force, replaced with it.
    let out = pycage(&args);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("exists (pass --force"),
        "{}",
        stderr(&out)
    );
    let mut forced = args.to_vec();
    forced.insert(1, "--force");
    let out = pycage(&forced);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let out = pycage(&[
        "run",
        "--json",
        "--json-files",
        "-c",
        "open('a.txt', 'w').write('x')",
    ]);
    assert_eq!(
        json_result(&out)["files"],
        json!([{"path": "a.txt", "size": 1, "bytes": "eA=="}])
    );

    let out = pycage(&[
        "run",
        "--file",
        &format!("../up={}", data.display()),
        "-c",
        "pass",
    ]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("input file `../up`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn describe_shows_the_sandbox_the_flags_make() {
    let out = pycage(&[
        "describe",
        "--namespace",
        "math",
        "--timeout",
        "7s",
        "--max-files",
        "12",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "- Wall time: 7s",
        "at most 12 files and directories",
        "async def add(*, a: float | str, b: float | str)",
        // Asked of the wasm guest, not written down: its CPython.
        "- Python 3.14.",
        "platform `wasi`",
        "nothing persists from one call to the next",
    ] {
        assert!(
            text.contains(expected),
            "`{expected}` missing from:\n{text}"
        );
    }
    let default = pycage(&["describe"]);
    assert_eq!(code(&default), 0, "{}", stderr(&default));
    let default = String::from_utf8_lossy(&default.stdout);
    assert!(default.contains("- Wall time: 30s"), "{default}");
    assert!(default.contains("No tools are exposed"), "{default}");

    let json = json_result(&pycage(&[
        "describe",
        "--json",
        "--timeout",
        "7s",
        "--session",
    ]));
    assert_eq!(json["name"], json!("run_python"));
    assert_eq!(json["limits"]["wall_timeout"], json!("7s"));
    assert_eq!(json["persistence"], json!("session"));
    assert_eq!(json["environment"]["platform"], json!("wasi"));
    assert_eq!(json["input_schema"]["required"], json!(["code"]));
    let description = json["description"].as_str().unwrap();
    assert!(description.contains("- Wall time: 7s"), "{description}");
    assert!(description.contains("persist from one call to the next"));
}

#[test]
fn describe_refuses_what_run_refuses() {
    for (args, says) in [
        (&["describe", "--timeout", "0s"][..], "wall_timeout"),
        (&["describe", "--allow", "nope"][..], "nope"),
        (&["describe", "-c", "pass"][..], "-c"),
    ] {
        let out = pycage(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn repl_keeps_state_echoes_expressions_and_starts_over_when_a_run_ends_the_session() {
    let input = "x = 20\n\
                 x * 2 + 2\n\
                 def f(n):\n    return n + x\n\n\
                 f(1)\n\
                 1/0\n\
                 x\n\
                 while True: pass\n\
                 x\n\
                 while True:\n    try:\n        while True: pass\n    except KeyboardInterrupt: pass\n\n\
                 x\n\
                 exit\n\
                 never = 'run'\n";
    let out = pycage_with(&["repl", "--timeout", "1s"], Some(input.as_bytes()), &[]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let values: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('[')).collect();
    // 42 and 21 echoed, x still 20 after the failed entry and after the interrupted one;
    // after the loop that swallows the interrupt a new session has no x, and nothing after
    // `exit` ran.
    assert_eq!(values[1..], ["42", "21", "20", "20"], "{stdout}");
    assert!(stderr.contains("KeyboardInterrupt"), "{stderr}");
    assert!(
        stdout.contains("[the session ended; a new one starts"),
        "{stdout}"
    );
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    assert!(
        stderr.contains("timeout: the wall-clock limit was reached"),
        "{stderr}"
    );
    assert!(stderr.contains("[limits of each run: wall 1s"), "{stderr}");
    assert!(
        stderr.contains("NameError: name 'x' is not defined"),
        "{stderr}"
    );
}

#[test]
fn bench_measures_the_mcp_server_over_http_with_one_and_sixteen_clients() {
    let out = pycage(&[
        "bench",
        "--only",
        "mcp_",
        "--iterations",
        "3",
        "--duration",
        "200ms",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json_result(&out);
    let rows = report["rows"].as_array().unwrap();
    let case = |name: &str| {
        rows.iter()
            .find(|r| r["case"] == json!(name))
            .unwrap_or_else(|| panic!("no {name} row in {rows:?}"))
    };
    for clients in ["c1", "c16"] {
        let latency = case(&format!("mcp_http_print_hi_{clients}"));
        assert!(latency["pycage"]["n"].as_u64().unwrap() >= 1, "{latency}");
        let rate = case(&format!("mcp_http_runs_per_s_{clients}"));
        assert!(rate["pycage"].as_f64().unwrap() > 0.0, "{rate}");
    }
    case("mcp_stdio_print_hi");
    // The upstream row needs an upstream server, and says so when it has none.
    assert!(rows.iter().all(|r| r["case"] != json!("mcp_upstream_echo")));
    assert!(
        stderr(&out).contains("mcp_upstream left out: it needs --upstream"),
        "{}",
        stderr(&out)
    );
}

/// A program that adds, then sends (a call a person approves), then goes on.
const SEND_PROGRAM: &[u8] = br#"
import random
r = await add(a=random.randrange(100), b=3)
print("added", r)
try:
    sent = await echo(text=f"total {r['sum']}")
except ToolError as e:
    sent = {"refused": e.kind}
print("sent", sent)
return sent
"#;

#[test]
fn an_approved_call_resumes_in_a_new_process_as_if_the_run_had_never_stopped() {
    let program = write_temp("send.py", SEND_PROGRAM);
    let program = program.to_str().unwrap();
    let key = write_temp("journal-send.key", b"");
    std::fs::remove_file(&key).unwrap();
    let key = key.to_str().unwrap();
    let state =
        std::env::temp_dir().join(format!("pycage-cli-{}/send-state.json", std::process::id()));
    let state = state.to_str().unwrap();
    let sandbox = [
        "--seed",
        "3",
        "--allow",
        "add",
        "--allow",
        "echo",
        "--journal-key",
        key,
    ];
    let with = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(sandbox);
        all.push("--json");
        pycage(&all)
    };

    let uninterrupted = with(&["run", program]);
    assert_eq!(code(&uninterrupted), 0, "{}", stderr(&uninterrupted));
    let uninterrupted = json_result(&uninterrupted);

    let stopped = with(&["run", program, "--approve", "echo", "--suspend-out", state]);
    assert_eq!(
        code(&stopped),
        4,
        "a suspended run exits 4: {}",
        stderr(&stopped)
    );
    let stopped = json_result(&stopped);
    assert_eq!(stopped["error"]["kind"], "suspended", "{stopped}");
    assert_eq!(stopped["suspended"]["pending"]["tool"], "text.echo");
    assert!(!stopped["stdout"].as_str().unwrap().contains("sent"));
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    assert_eq!(
        saved, stopped["suspended"],
        "--suspend-out holds the result's state"
    );

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the state holds the calls' arguments");
    }
    let forged = std::fs::read_to_string(state)
        .unwrap()
        .replace("total", "TOTAL");

    let resumed = with(&["resume", state, "--approve"]);
    assert_eq!(code(&resumed), 0, "{}", stderr(&resumed));
    let resumed = json_result(&resumed);
    for key in ["value", "stdout", "fuel_consumed", "tool_calls"] {
        assert_eq!(resumed[key], uninterrupted[key], "{key}: {resumed}");
    }
    // Issue 37, hole 9: a state resumes once; the same file again is refused.
    let again = with(&["resume", state, "--approve"]);
    assert_eq!(code(&again), 2, "{}", stderr(&again));
    assert!(
        stderr(&again).contains("resumed before"),
        "{}",
        stderr(&again)
    );
    // And a fresh state past --max-age is refused.
    let suspend = || {
        let stopped = with(&["run", program, "--approve", "echo", "--suspend-out", state]);
        assert_eq!(code(&stopped), 4, "{}", stderr(&stopped));
    };
    suspend();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let expired = with(&["resume", state, "--approve", "--max-age", "1s"]);
    assert_eq!(code(&expired), 2, "{}", stderr(&expired));
    assert!(
        stderr(&expired).contains("past --max-age 1s"),
        "{}",
        stderr(&expired)
    );

    let denied = json_result(&with(&["resume", state, "--deny"]));
    assert_eq!(denied["value"], json!({"refused": "denied"}), "{denied}");
    suspend();
    let answered = json_result(&with(&["resume", state, "--answer", r#""by hand""#]));
    assert_eq!(answered["value"], "by hand", "{answered}");

    // A state changed by hand is refused before anything runs.
    let forged_path = write_temp("send-forged.json", forged.as_bytes());
    let refused = with(&["resume", forged_path.to_str().unwrap(), "--approve"]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    let refused = json_result(&refused);
    assert_eq!(refused["error"]["kind"], "invalid_input");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("signature")
    );
    // Exactly one decision.
    let out = pycage(&["resume", state, "--approve", "--deny"]);
    assert_eq!(code(&out), 2);
}

#[test]
fn a_journal_replays_without_calling_the_tool_and_a_forged_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("pycage-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let counter = dir.join("replay-counter");
    let _ = std::fs::remove_file(&counter);
    let tools = write_temp(
        "replay-tools.toml",
        format!(
            "[[tool]]\nname = \"note\"\nnamespace = \"log\"\ndescription = \"counts\"\n\
             command = [\"/bin/sh\", \"-c\", \"echo call >> {}; cat\"]\n\
             parameters = {{ type = \"object\" }}\n",
            counter.display()
        )
        .as_bytes(),
    );
    let program = write_temp(
        "replay.py",
        b"a = await note(n=1)\nb = await note(n=2)\nprint(a, b)\nreturn [a, b]\n",
    );
    let journal = dir.join("replay-journal.json");
    let key = dir.join("replay.key");
    let run = |program: &Path, extra: &[&str]| {
        let mut all = vec![
            "run",
            program.to_str().unwrap(),
            "--tools",
            tools.to_str().unwrap(),
            "--allow",
            "note",
            "--journal-key",
            key.to_str().unwrap(),
            "--json",
        ];
        all.extend(extra);
        pycage(&all)
    };
    let args = |extra: &[&str]| run(&program, extra);
    let calls = || {
        std::fs::read_to_string(&counter)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let first = args(&["--journal-out", journal.to_str().unwrap()]);
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let first = json_result(&first);
    assert_eq!(calls(), 2);
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(&journal).unwrap()).unwrap();
    assert_eq!(recorded["calls"].as_array().unwrap().len(), 2, "{recorded}");

    let replayed = args(&["--replay", journal.to_str().unwrap()]);
    assert_eq!(code(&replayed), 0, "{}", stderr(&replayed));
    let replayed = json_result(&replayed);
    assert_eq!(calls(), 2, "the replay called no tool");
    assert_eq!(replayed["value"], first["value"]);
    assert_eq!(replayed["stdout"], first["stdout"]);

    let forged = std::fs::read_to_string(&journal)
        .unwrap()
        .replace("\"n\": 2", "\"n\": 3");
    let forged_path = write_temp("replay-forged.json", forged.as_bytes());
    let refused = args(&["--replay", forged_path.to_str().unwrap()]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert_eq!(json_result(&refused)["error"]["kind"], "invalid_input");

    // The edited program's second call differs: it fails naming both, or goes live.
    let edited = write_temp(
        "replay-edited.py",
        b"a = await note(n=1)\nb = await note(n=5)\nreturn [a, b]\n",
    );
    let replay = journal.to_str().unwrap();
    let run_edited = |extra: &[&str]| {
        let mut all = vec!["--replay", replay];
        all.extend(extra);
        run(&edited, &all)
    };
    let diverged = run_edited(&[]);
    assert_eq!(code(&diverged), 1);
    let diverged = json_result(&diverged);
    assert_eq!(diverged["error"]["kind"], "replay_diverged", "{diverged}");
    assert_eq!(calls(), 2);
    let live = run_edited(&["--on-divergence", "live"]);
    assert_eq!(code(&live), 0, "{}", stderr(&live));
    assert_eq!(json_result(&live)["value"][1], json!({"n": 5}));
    assert_eq!(calls(), 3, "only the diverging call ran");
}

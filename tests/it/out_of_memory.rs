//! Running out of memory under the limit is the guest's doing: whichever way CPython goes down
//! after a `MemoryError` (the exception raised and reported, the interpreter trapping, its
//! glue failing while it builds the failure), the run is `memory_limit` with the exception
//! `MemoryError`, never `backend_error`, and nothing of the host shows in the result.
//!
//! A small generator writes the programs: an allocation shape, a size, the cyclic garbage
//! collector on or off, what the loop does beside allocating, and where the memory goes (the
//! code's own objects, or a tool call's results), run one-shot or in a session. 100 of them run
//! on `wasm` and on `wasm+bubblewrap`. `soak` (ignored; `PYCAGE_OOM_SOAK_SECS`, default 600)
//! adds ballast of random size before random work, so memory runs out at random points, and
//! runs until its time is up.

use std::time::{Duration, Instant};

use pycage::{ErrorKind, Limits, RunResult, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::json;

use crate::os_support::Subject;

/// The memory limit of the generated runs: the smallest the guest starts in, so each one
/// reaches it quickly.
const MEMORY: u64 = 64 << 20;

/// How the programs hold what they allocate. `{S}` is the size of one allocation; each body is
/// the inside of a `while True:` loop, and `keep` a list that outlives it.
const SHAPES: &[(&str, &str)] = &[
    // The program: each list holds a buffer and itself, so with the collector off the
    // garbage is never freed, and with it on `keep` holds it.
    (
        "self-referencing lists",
        "a = [bytes({S})]\na.append(a)\nif HOLD: keep.append(a)",
    ),
    ("a list of buffers", "keep.append(bytearray({S}))"),
    ("a dict of strings", "keep.append({len(keep): 'x' * {S}})"),
    // Nodes of at least 1 KiB: freeing a chain deeper than ~100,000 overflows the guest's
    // stack (the interpreter's deallocation recurses), with or without the memory limit.
    (
        "a linked chain of tuples",
        "node = (bytearray(max({S}, 1024)), node)",
    ),
    ("one growing buffer", "buf.extend(b'z' * {S})"),
    (
        "objects pointing at each other",
        "o = Node()\no.payload = bytes({S})\no.peer = Node()\no.peer.peer = o\nif HOLD: keep.append(o)",
    ),
    (
        "many small lists",
        "keep.append([len(keep)] * ({S} // 8 + 1))",
    ),
];

/// The size of one allocation, from a few bytes (object headers dominate) to a megabyte.
const SIZES: &[usize] = &[16, 512, 4096, 65_536, 1 << 20];

/// What the loop does beside allocating.
const EXTRAS: &[(&str, &str)] = &[
    ("nothing else", ""),
    // With the counter, the program failed inside the glue, not in the code.
    ("a counter", "n += 1"),
    (
        "a message now and then",
        "n += 1\nif n % 1000 == 0: print('at', n)",
    ),
];

/// The tool that hands the guest memory from the host: `blob.make(n)` returns `n` bytes of
/// text.
fn blob_tools() -> ToolRegistry {
    let mut registry = ToolRegistry::with_builtins();
    registry
        .register_fn(
            "blob",
            "make",
            "returns a string of n characters",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            |args| async move {
                let n = args["n"].as_u64().unwrap_or(0).min(1 << 20);
                Ok(json!({"data": "b".repeat(usize::try_from(n).unwrap_or(0))}))
            },
        )
        .expect("the tool registers");
    registry
}

/// A deterministic source of choices: SplitMix64 (Steele, Lea and Flood, 2014). Five lines,
/// the same sequence on every platform and version, which a seed in a failure message needs.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let n = u64::try_from(items.len()).expect("a short list");
        &items[usize::try_from(self.next() % n).expect("an index")]
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
}

/// One generated program: its code, what it is (for a failure message), and whether it runs
/// in a session.
struct Program {
    code: String,
    label: String,
    in_session: bool,
}

/// The program the generator writes from `choices`: memory runs out in the loop.
fn out_of_memory_program(choices: &mut Choices) -> Program {
    let gc_off = choices.chance(2);
    let from_tool = choices.chance(5);
    let in_function = choices.chance(3);
    let in_session = choices.chance(4);
    let (extra_name, extra) = *choices.pick(EXTRAS);
    let (body, label) = if from_tool {
        // A tool's result is at most `max_tool_result_bytes`; from 64 KiB, so the loop makes
        // hundreds of calls, not millions.
        let size = (*choices.pick(SIZES)).max(65_536);
        (
            format!("keep.append((await make(n={size}))['data'])"),
            format!("tool results of {size} bytes"),
        )
    } else {
        let (name, shape) = *choices.pick(SHAPES);
        let size = *choices.pick(SIZES);
        (
            shape.replace("{S}", &size.to_string()),
            format!("{name} of {size} bytes"),
        )
    };
    let mut lines = vec![
        "import gc".to_owned(),
        format!("HOLD = {}", if gc_off { "False" } else { "True" }),
        "class Node: pass".to_owned(),
    ];
    if gc_off {
        lines.push("gc.disable()".to_owned());
    }
    let mut loop_lines = vec!["while True:".to_owned()];
    for line in body.lines().chain(extra.lines()) {
        loop_lines.push(format!("    {line}"));
    }
    let setup = ["keep = []", "buf = bytearray()", "node = None", "n = 0"];
    if in_function {
        // In a function the loop's names are locals; `await` needs an async function.
        lines.push("async def fill():".to_owned());
        lines.extend(setup.iter().map(|l| format!("    {l}")));
        lines.extend(loop_lines.iter().map(|l| format!("    {l}")));
        lines.push("await fill()".to_owned());
    } else {
        lines.extend(setup.iter().map(|l| (*l).to_owned()));
        lines.extend(loop_lines);
    }
    let label = format!(
        "{label}, {extra_name}, the collector {}, {}{}",
        if gc_off { "off" } else { "on" },
        if in_function {
            "in a function"
        } else {
            "at the top level"
        },
        if in_session { ", in a session" } else { "" },
    );
    Program {
        code: lines.join("\n"),
        label,
        in_session,
    }
}

/// Random work after random ballast: memory runs out somewhere in the work, or not at all
/// (then the run may end well). Every step is something a run does with memory: formatting,
/// encoding, a tool call's arguments and result, output, an exception's traceback, the value.
fn random_point_program(choices: &mut Choices) -> Program {
    const STEPS: &[&str] = &[
        "x = [str(i) * 7 for i in range(40000)]",
        "x = json.dumps({str(i): [i] * 20 for i in range(20000)})",
        "x = ''.join(format(i, '08x') for i in range(200000))",
        "x = re.findall(r'a+', 'ab' * 300000)",
        "x = sorted(range(300000), key=lambda i: -i)",
        "print('p' * 500000)",
        "x = (await make(n=1000000))['data']",
        "r = await make(n=16)",
        "x = {i: Node() for i in range(50000)}",
        "try:\n    raise ValueError('v' * 400000)\nexcept ValueError as e:\n    x = traceback.format_exc()",
        "x = bytes(3 << 20)",
        "x = [bytearray(4096) for _ in range(1000)]",
    ];
    const ENDS: &[&str] = &[
        "return 1",
        "return ['r' * 1000] * 2000",
        "raise KeyError('k' * 100000)",
        "return {'n': len(junk)}",
        "",
    ];
    // The guest's snapshot takes about 30 MiB of the 64: 8 to 33 MiB of ballast leave the
    // work anything from nothing to 26 MiB.
    let ballast_mib = 8 + choices.next() % 26;
    let mut lines = vec![
        "import json, re, traceback, gc".to_owned(),
        "class Node: pass".to_owned(),
    ];
    if choices.chance(2) {
        lines.push("gc.disable()".to_owned());
    }
    lines.push(format!("ballast = bytearray({ballast_mib} << 20)"));
    lines.push("junk = []".to_owned());
    let steps = 1 + choices.next() % 4;
    let mut label = format!("{ballast_mib} MiB of ballast");
    for _ in 0..steps {
        let step = *choices.pick(STEPS);
        lines.extend(step.lines().map(str::to_owned));
        lines.push("junk.append(x) if 'x' in dir() else None".to_owned());
        label.push_str(", ");
        label.push_str(step.lines().next().unwrap_or(step));
    }
    lines.push((*choices.pick(ENDS)).to_owned());
    let in_session = choices.chance(4);
    Program {
        code: lines.join("\n"),
        label,
        in_session,
    }
}

fn limits() -> Limits {
    Limits::builder()
        .memory_bytes(MEMORY)
        .max_tool_calls(100_000)
        .wall_timeout(Duration::from_secs(60))
        .build()
        .expect("valid limits")
}

/// Runs `program` on `subject`, in a session where it says so (and the backend keeps them);
/// after a session's run, the session must still answer, or say that it ended.
async fn run(subject: &Subject, program: &Program) -> RunResult {
    let runner = subject.runner(blob_tools(), ToolPolicy::new().namespace("blob"), limits());
    if !(program.in_session && subject.supports_sessions()) {
        return runner.run(&program.code).await;
    }
    let session = runner.session().await.expect("the session opens");
    let before = session.run("earlier = 41").await;
    assert!(before.ok, "{before:#?}");
    let result = session.run(&program.code).await;
    let after = session.run("return 1").await;
    // The session answers, says it ended (its instance trapped), or is still full: what the
    // run kept is the session's state.
    assert_nothing_of_the_host(&after, &program.label);
    if after.ok {
        assert_eq!(after.value, json!(1));
    } else {
        let kind = after.error.as_ref().map(|e| e.kind);
        assert!(
            matches!(kind, Some(ErrorKind::SessionEnded | ErrorKind::MemoryLimit)),
            "after {}: {after:#?}",
            program.label
        );
    }
    result
}

/// What no result may hold, whatever the guest did: the engine's or the host's own words.
fn assert_nothing_of_the_host(result: &RunResult, label: &str) {
    let text = serde_json::to_string(result).expect("a result serializes");
    for word in [
        "panicked",
        "unknown handle",
        "failed internally",
        env!("CARGO_MANIFEST_DIR"),
    ] {
        assert!(!text.contains(word), "{label}: `{word}` in {result:#?}");
    }
}

async fn generated_programs_end_at_the_memory_limit(subject: &Subject) {
    let mut choices = Choices(41);
    for i in 0..100 {
        let program = out_of_memory_program(&mut choices);
        let result = run(subject, &program).await;
        let label = format!("program {i} ({}):\n{}", program.label, program.code);
        assert_nothing_of_the_host(&result, &label);
        let error = result.error.as_ref();
        assert_eq!(
            error.map(|e| e.kind),
            Some(ErrorKind::MemoryLimit),
            "{label}\n{result:#?}"
        );
        assert_eq!(
            error.and_then(|e| e.exception.as_deref()),
            Some("MemoryError"),
            "{label}\n{result:#?}"
        );
    }
}

/// The program, as it was reported: default limits, the collector off, a counter.
async fn the_reported_program_is_a_memory_error(subject: &Subject) {
    let code = "import gc\ngc.disable()\nn = 0\nwhile True:\n    a = [bytes(4096)]\n    a.append(a)\n    n += 1";
    let runner = subject.runner(
        ToolRegistry::with_builtins(),
        ToolPolicy::new(),
        Limits::default(),
    );
    let result = runner.run(code).await;
    assert_nothing_of_the_host(&result, code);
    let error = result.error.as_ref().expect("the run fails");
    assert_eq!(error.kind, ErrorKind::MemoryLimit, "{result:#?}");
    assert_eq!(error.exception.as_deref(), Some("MemoryError"));
}

backend_suite! {
    [generated_programs_end_at_the_memory_limit, the_reported_program_is_a_memory_error]
    wasm => "wasm",
    layered => "wasm+bubblewrap",
}

/// Runs until `PYCAGE_OOM_SOAK_SECS` (default 600) have passed, alternating the two
/// generators and the two backends, from a seed that changes each time (printed, and named in
/// a failure): no run may end as `backend_error` or show the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: minutes long; run with --ignored"]
async fn soak() {
    let secs = std::env::var("PYCAGE_OOM_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let seed = std::env::var("PYCAGE_OOM_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
    eprintln!("out-of-memory soak: {secs} s from seed {seed}");
    let subjects: Vec<Subject> = ["wasm", "wasm+bubblewrap"]
        .into_iter()
        .filter_map(crate::os_support::subject)
        .collect();
    let mut choices = Choices(seed);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut kinds = std::collections::BTreeMap::<String, u32>::new();
    let mut i = 0u64;
    while Instant::now() < end {
        let subject = &subjects[usize::try_from(i).unwrap_or(0) % subjects.len()];
        let program = if i.is_multiple_of(2) {
            random_point_program(&mut choices)
        } else {
            out_of_memory_program(&mut choices)
        };
        let result = run(subject, &program).await;
        let label = format!(
            "seed {seed}, run {i} on {} ({}):\n{}",
            subject.name, program.label, program.code
        );
        assert_nothing_of_the_host(&result, &label);
        let kind = result.error.as_ref().map(|e| e.kind);
        assert!(
            matches!(
                kind,
                None | Some(
                    ErrorKind::MemoryLimit | ErrorKind::GuestException | ErrorKind::ValueTooLarge
                )
            ),
            "{label}\n{result:#?}"
        );
        *kinds
            .entry(kind.map_or("ok".to_owned(), |k| k.to_string()))
            .or_default() += 1;
        i += 1;
    }
    eprintln!("out-of-memory soak: {i} runs from seed {seed}: {kinds:?}");
}

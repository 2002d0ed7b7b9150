//! The benchmark cases and their baselines.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pycage::{Limits, RunResult, Runner, ToolPolicy, WasmBackend};
use pycage_tools::ToolRegistry;

use super::{Baseline, Figure, Row, Settings, Summary};

/// The compute case of the performance issue, timed inside the interpreter.
pub(super) const COMPUTE: &str = "sum(i*i for i in range(10**6))";
pub(super) const JSON_10K: &str = "json.loads(json.dumps([{'id': i, 'name': 'n%d' % i, 'tags': ['a', 'b'], 'score': i / 3} for i in range(10000)]))";
pub(super) const REGEX_1MB: &str =
    "len(re.findall(r'[a-z]+@[a-z]+\\.com', ('x' * 90 + ' ab@cd.com ') * 10000))";

/// Runs every case (or those whose name contains `only`).
pub async fn run_all(s: &Settings, only: Option<&str>) -> Result<Vec<Row>, String> {
    let wanted = |name: &str| only.is_none_or(|o| name.contains(o));
    let fresh = runner(
        WasmBackend::builder().build().map_err(|e| e.to_string())?,
        100,
    )?;
    let backend = WasmBackend::builder().build().map_err(|e| e.to_string())?;
    eprintln!("pycage bench: preparing the guest...");
    backend.prepare().await.map_err(|e| e.to_string())?;
    if !backend.resets_slots_in_place() {
        eprintln!(
            "pycage bench: wasm memory slots after a run: {}",
            crate::backends::slot_reset_note(false)
        );
    }
    let mut rows = Vec::new();

    if wanted("fresh_pass") {
        rows.push(Row {
            case: "fresh_pass",
            unit: "us",
            pycage: Figure::Latency(latency(&fresh, "pass", s).await?),
            baseline: None,
            target: Some("p50 <= 0.8 ms, p99 <= 2 ms"),
        });
    }
    if wanted("fresh_print") {
        rows.push(Row {
            case: "fresh_print",
            unit: "us",
            pycage: Figure::Latency(latency(&fresh, "print('hi')", s).await?),
            baseline: None,
            target: None,
        });
    }
    // Unmetered, the pool primes its instances in the background; metered, it does not (fuel
    // stays the same pooled or not). Both are shown.
    for (case, meter_fuel, target) in [
        ("pool_print", false, Some("p50 <= 0.4 ms")),
        ("pool_print_metered", true, None),
    ] {
        if wanted(case) {
            rows.push(Row {
                case,
                unit: "us",
                pycage: Figure::Latency(pool_latency(meter_fuel, s).await?),
                baseline: None,
                target,
            });
        }
    }
    for (case, work, import) in [
        ("compute_sum_squares", COMPUTE, ""),
        ("json_roundtrip_10k", JSON_10K, "import json"),
        ("regex_1mb", REGEX_1MB, "import re"),
    ] {
        if !wanted(case) {
            continue;
        }
        let inside = in_guest_seconds(&fresh, import, work, 5).await?;
        let native = native_seconds(&s.python, &["-I", "-S"], import, work, 5)?;
        rows.push(Row {
            case,
            unit: "us",
            pycage: Figure::Latency(inside),
            baseline: Some(Baseline {
                name: format!("{} -I -S (in-process time)", s.python),
                figure: Figure::Latency(native),
            }),
            target: (case == "compute_sum_squares").then_some("<= 2x native"),
        });
    }
    // The first import, in a fresh sandbox, of a module of the standard library that is not
    // preloaded (the guest unmarshals and runs it), against one that is.
    for (case, module) in [
        ("import_on_demand_pickle", "pickle"),
        ("import_on_demand_configparser", "configparser"),
    ] {
        if wanted(case) {
            let n = s.iterations.clamp(5, 200);
            let work = format!("import {module}");
            rows.push(Row {
                case,
                unit: "us",
                pycage: Figure::Latency(in_guest_seconds(&fresh, "", &work, n).await?),
                baseline: Some(Baseline {
                    name: "`import json`, preloaded (in-guest time)".into(),
                    figure: Figure::Latency(in_guest_seconds(&fresh, "", "import json", n).await?),
                }),
                target: Some("preloaded: free"),
            });
        }
    }
    if wanted("session_run") {
        // A run in a live session, against a fresh sandbox's `pass` on the same engine,
        // interleaved so both see the same machine.
        let session = fresh.session().await.map_err(|e| e.to_string())?;
        check(session.run("x = 0").await)?;
        let (mut live, mut one_shot) = (Vec::new(), Vec::new());
        for _ in 0..s.iterations.min(20) {
            check(session.run("x += 1").await)?; // warm-up
        }
        for _ in 0..s.iterations {
            idle(s).await;
            let t = Instant::now();
            check(session.run("x += 1").await)?;
            live.push(us(t.elapsed()));
            let t = Instant::now();
            check(fresh.run("pass").await)?;
            one_shot.push(us(t.elapsed()));
        }
        rows.push(Row {
            case: "session_run_x_plus_1",
            unit: "us",
            pycage: Figure::Latency(Summary::of(live)),
            baseline: Some(Baseline {
                name: "a fresh sandbox, `pass` (interleaved)".into(),
                figure: Figure::Latency(Summary::of(one_shot)),
            }),
            target: Some("p50 <= 0.1 ms"),
        });
    }
    if wanted("per_idle_session") {
        let (rss, pss) = memory_per_session(&fresh, 100).await?;
        rows.push(Row {
            case: "rss_per_idle_session_100",
            unit: "bytes",
            pycage: Figure::Value(rss),
            baseline: None,
            target: None,
        });
        rows.push(Row {
            case: "pss_per_idle_session_100",
            unit: "bytes",
            pycage: Figure::Value(pss),
            baseline: None,
            target: None,
        });
    }
    if wanted("mcp_stdio") {
        rows.push(super::mcp::stdio_row(s, &fresh).await?);
    }
    if wanted("mcp_http") {
        rows.extend(super::mcp::http_rows(s).await?);
    }
    if wanted("mcp_upstream") {
        match &s.upstream {
            Some(command) => rows.push(super::mcp::upstream_row(s, command).await?),
            None => eprintln!(
                "pycage bench: mcp_upstream left out: it needs --upstream 'COMMAND' (an MCP \
                 server with an `echo(message)` tool)"
            ),
        }
    }
    if wanted("files_10mib") {
        // 10 MiB in as an input file, read and written back as a produced file, interleaved
        // with an empty run so both see the same machine: the difference is what files cost.
        let input = pycage::InputFile::new("in.bin", vec![7u8; 10 << 20]);
        let code = "data = open('in.bin', 'rb').read()\nopen('out.bin', 'wb').write(data)";
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..s.iterations.clamp(5, 30) {
            idle(s).await;
            let request = pycage::RunRequest::new(code).file(input.clone());
            let t = Instant::now();
            let r = fresh.run_request(request).await;
            let took = us(t.elapsed());
            let out = r.files.first().and_then(|f| f.bytes.as_ref()).map(Vec::len);
            check(r)?;
            if out != Some(10 << 20) {
                return Err("the 10 MiB file did not come back".into());
            }
            with.push(took);
            let t = Instant::now();
            check(fresh.run("pass").await)?;
            without.push(us(t.elapsed()));
        }
        let (with, without) = (Summary::of(with), Summary::of(without));
        let extra_ms = (with.p50 - without.p50) / 1000.0;
        rows.push(Row {
            case: "files_10mib_in_out",
            unit: "us",
            pycage: Figure::Latency(with),
            baseline: Some(Baseline {
                name: "the same engine, `pass`, no files (interleaved)".into(),
                figure: Figure::Latency(without),
            }),
            target: None,
        });
        rows.push(Row {
            case: "files_10mib_extra_ms",
            unit: "ms",
            pycage: Figure::Value(extra_ms),
            baseline: None,
            target: Some("<= 15 ms on top of the run"),
        });
    }
    if wanted("fuel_overhead") {
        let unmetered = WasmBackend::builder()
            .meter_fuel(false)
            .build()
            .map_err(|e| e.to_string())?;
        eprintln!("pycage bench: preparing an unmetered engine (compiles once)...");
        unmetered.prepare().await.map_err(|e| e.to_string())?;
        let off = runner(unmetered, 100)?;
        // Interleaved, so drift in the machine's load hits both sides alike.
        let (mut metered, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..9 {
            metered.push(in_guest_seconds(&fresh, "", COMPUTE, 1).await?.p50);
            plain.push(in_guest_seconds(&off, "", COMPUTE, 1).await?.p50);
        }
        let (metered, plain) = (Summary::of(metered), Summary::of(plain));
        let ratio = metered.p50 / plain.p50;
        // The two sides the ratio is taken of: a shift in either shows here.
        for (case, summary) in [
            ("compute_metered_paired", metered),
            ("compute_unmetered_paired", plain),
        ] {
            rows.push(Row {
                case,
                unit: "us",
                pycage: Figure::Latency(summary),
                baseline: None,
                target: None,
            });
        }
        rows.push(Row {
            case: "fuel_overhead_compute",
            unit: "ratio",
            pycage: Figure::Value(ratio),
            baseline: None,
            target: Some("<= 1.05"),
        });
    }
    if wanted("tool_call") {
        let unmetered = WasmBackend::builder()
            .meter_fuel(false)
            .build()
            .map_err(|e| e.to_string())?;
        unmetered.prepare().await.map_err(|e| e.to_string())?;
        let (metered, unmetered) = (
            runner(backend.clone(), 100_000)?,
            runner(unmetered, 100_000)?,
        );
        let (sync, asyn) = tool_call_micros(&metered).await?;
        let (sync_unmetered, _) = tool_call_micros(&unmetered).await?;
        for (case, samples) in [
            ("tool_call_sync", sync),
            ("tool_call_await", asyn),
            ("tool_call_sync_unmetered", sync_unmetered),
        ] {
            rows.push(Row {
                case,
                unit: "us",
                pycage: Figure::Latency(Summary::of(samples)),
                baseline: None,
                target: Some("<= 8 us"),
            });
        }
    }
    for callers in [1usize, 2, 8] {
        let case = match callers {
            1 => "throughput_1_caller",
            2 => "throughput_2_callers",
            _ => "throughput_8_callers",
        };
        if wanted(case) {
            rows.push(Row {
                case,
                unit: "runs/s",
                pycage: Figure::Value(throughput(&fresh, callers, s.duration).await?),
                baseline: None,
                target: Some(">= 2500/s"),
            });
        }
    }
    if wanted("per_live_sandbox") {
        let (rss, pss) = memory_per_sandbox(&fresh, 100).await?;
        rows.push(Row {
            case: "rss_per_live_sandbox_100",
            unit: "bytes",
            pycage: Figure::Value(rss),
            baseline: None,
            target: Some("<= 8 MiB"),
        });
        // RSS counts a snapshot page once per sandbox that maps it; PSS splits it among them.
        rows.push(Row {
            case: "pss_per_live_sandbox_100",
            unit: "bytes",
            pycage: Figure::Value(pss),
            baseline: None,
            target: None,
        });
    }
    if wanted("process") {
        let n = s.iterations.clamp(5, 50);
        let exe = s.pycage_exe.display().to_string();
        // One sample of each in turn, so that a change in the machine's load reaches all
        // three alike. Two baselines: Python as a user starts it (`site` imported, as the
        // performance issue measured it) and the interpreter alone (`-I -S`).
        let [ours, native, isolated] = process_latencies(
            [
                (exe.as_str(), &["run", "-c", "pass"][..]),
                (s.python.as_str(), &["-c", "pass"][..]),
                (s.python.as_str(), &["-I", "-S", "-c", "pass"][..]),
            ],
            n,
        )?;
        rows.push(Row {
            case: "process_pycage_run_pass",
            unit: "us",
            pycage: Figure::Latency(ours.clone()),
            baseline: Some(Baseline {
                name: format!("{} -c pass", s.python),
                figure: Figure::Latency(native),
            }),
            target: Some("<= 15 ms, <= native"),
        });
        rows.push(Row {
            case: "process_pycage_run_pass_vs_isolated",
            unit: "us",
            pycage: Figure::Latency(ours),
            baseline: Some(Baseline {
                name: format!("{} -I -S -c pass", s.python),
                figure: Figure::Latency(isolated),
            }),
            target: None,
        });
        if let Some(bwrap) = which("bwrap") {
            let python = which(&s.python).unwrap_or_else(|| s.python.clone());
            let args = [
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--unshare-all",
                "--die-with-parent",
                &python,
                "-I",
                "-S",
                "-c",
                "pass",
            ];
            if let Ok(b) = process_latency(&bwrap, &args, n) {
                rows.push(Row {
                    case: "process_bwrap_python_pass",
                    unit: "us",
                    pycage: Figure::Latency(b),
                    baseline: None,
                    target: None,
                });
            }
        }
    }
    if let Some(guest) = &s.guest {
        rows.extend(super::guest::rows(s, guest, &fresh, &wanted).await?);
    }
    if let Some(python) = &s.peers {
        rows.extend(super::peers::rows(s, python, &fresh, &wanted).await?);
    }
    Ok(rows)
}

/// Microseconds per tool call from Python, `call_tool(...)` and `await add(...)`: five runs of
/// 2000 calls each, timed inside the guest.
async fn tool_call_micros(r: &Runner) -> Result<(Vec<f64>, Vec<f64>), String> {
    let code = "import time\nn = 2000\nt = time.perf_counter()\nfor _ in range(n):\n    call_tool('add', a=1, b=2)\nsync = (time.perf_counter() - t) / n\nt = time.perf_counter()\nfor _ in range(n):\n    await add(a=1, b=2)\nreturn [sync * 1e6, (time.perf_counter() - t) / n * 1e6]";
    let (mut sync, mut asyn) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let v = check(r.run(code).await)?;
        sync.push(v[0].as_f64().unwrap_or(f64::NAN));
        asyn.push(v[1].as_f64().unwrap_or(f64::NAN));
    }
    Ok((sync, asyn))
}

/// `print('hi')` in an instance from a warm pool of 4, measured with the pool full (idle).
async fn pool_latency(meter_fuel: bool, s: &Settings) -> Result<Summary, String> {
    let pooled = WasmBackend::builder()
        .meter_fuel(meter_fuel)
        .warm_pool(4)
        .build()
        .map_err(|e| e.to_string())?;
    pooled.prepare().await.map_err(|e| e.to_string())?;
    let r = runner(pooled.clone(), 100)?;
    let mut samples = Vec::with_capacity(s.iterations);
    for _ in 0..s.iterations {
        while pooled.warm_instances() < 4 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        idle(s).await;
        let t = Instant::now();
        check(r.run("print('hi')").await)?;
        samples.push(us(t.elapsed()));
    }
    Ok(Summary::of(samples))
}

pub(super) fn runner(backend: WasmBackend, max_tool_calls: u32) -> Result<Runner, String> {
    let limits = Limits::builder()
        .max_tool_calls(max_tool_calls)
        .build()
        .map_err(|e| e.to_string())?;
    Runner::builder()
        .backend(Arc::new(backend))
        .tools(ToolRegistry::with_builtins())
        .policy(ToolPolicy::new().namespace("math"))
        .limits(limits)
        .build()
        .map_err(|e| e.to_string())
}

pub(super) fn check(r: RunResult) -> Result<serde_json::Value, String> {
    match r.error {
        None => Ok(r.value),
        Some(e) => Err(format!("a benchmark run failed: {e}")),
    }
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn latency(r: &Runner, code: &str, s: &Settings) -> Result<Summary, String> {
    for _ in 0..s.iterations.min(20) {
        check(r.run(code).await)?; // warm-up
    }
    let mut samples = Vec::with_capacity(s.iterations);
    for _ in 0..s.iterations {
        idle(s).await;
        let t = Instant::now();
        check(r.run(code).await)?;
        samples.push(us(t.elapsed()));
    }
    Ok(Summary::of(samples))
}

/// Waits out the idle time the settings ask for before a sample.
pub(super) async fn idle(s: &Settings) {
    if !s.idle.is_zero() {
        tokio::time::sleep(s.idle).await;
    }
}

/// The work's duration measured inside the guest's interpreter (excludes start-up).
pub(super) async fn in_guest_seconds(
    r: &Runner,
    import: &str,
    work: &str,
    n: usize,
) -> Result<Summary, String> {
    let code = format!(
        "{import}\nimport time\nt = time.perf_counter()\n{work}\nreturn time.perf_counter() - t"
    );
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let v = check(r.run(&code).await)?;
        samples.push(v.as_f64().ok_or("the timing is not a number")? * 1e6);
    }
    Ok(Summary::of(samples))
}

/// The same work under native CPython, measured the same way.
/// `work`'s time in a new native `python` process each sample, `import` done first; `flags`
/// go before `-c` (`-I -S` for the standard library alone, `-I` to see site-packages).
pub(super) fn native_seconds(
    python: &str,
    flags: &[&str],
    import: &str,
    work: &str,
    n: usize,
) -> Result<Summary, String> {
    let script = format!(
        "{import}\nimport time\nt = time.perf_counter()\n{work}\nprint(time.perf_counter() - t)"
    );
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let out = Command::new(python)
            .args(flags)
            .args(["-c", &script])
            .output()
            .map_err(|e| format!("running {python}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let secs: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("{python} printed {text:?}"))?;
        samples.push(secs * 1e6);
    }
    Ok(Summary::of(samples))
}

async fn throughput(r: &Runner, callers: usize, duration: Duration) -> Result<f64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let r = r.clone();
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < until {
                    if r.run("pass").await.ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Resident memory added per live sandbox, with `n` runs held at once (each sleeping).
/// Resident and proportional memory per live sandbox: `n` runs held in `time.sleep`, the
/// process's growth divided by `n`.
pub(super) async fn memory_per_sandbox(r: &Runner, n: usize) -> Result<(f64, f64), String> {
    check(r.run("pass").await)?;
    let before = memory_bytes()?;
    let limits = Limits::builder()
        .wall_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let r = r.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                r.run_with("import time\ntime.sleep(3)", Default::default(), &limits)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = memory_bytes()?;
    for t in tasks {
        check(t.await.map_err(|e| e.to_string())?)?;
    }
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    Ok((per(before.0, during.0), per(before.1, during.1)))
}

/// Resident and proportional memory per idle session: `n` sessions opened, each having run
/// a small program that leaves state behind (a list, a dict, an import), then all idle.
async fn memory_per_session(r: &Runner, n: usize) -> Result<(f64, f64), String> {
    check(r.run("pass").await)?;
    let before = memory_bytes()?;
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        let session = r.session().await.map_err(|e| e.to_string())?;
        check(
            session
                .run(&format!(
                    "import json\nrows = [{{'id': j, 'n': {i}}} for j in range(1000)]\ntext = json.dumps(rows)"
                ))
                .await,
        )?;
        sessions.push(session);
    }
    let during = memory_bytes()?;
    drop(sessions);
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n as f64;
    Ok((per(before.0, during.0), per(before.1, during.1)))
}

/// The process's resident and proportional set sizes, from `/proc/self/smaps_rollup`.
fn memory_bytes() -> Result<(u64, u64), String> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup")
        .map_err(|e| format!("smaps_rollup: {e}"))?;
    let field = |name: &str| {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .ok_or_else(|| format!("smaps_rollup has no {name}"))
    };
    Ok((field("Rss:")?, field("Pss:")?))
}

fn process_latency(program: &str, args: &[&str], n: usize) -> Result<Summary, String> {
    let [summary] = process_latencies([(program, args)], n)?;
    Ok(summary)
}

/// Whole-process latency of each command, `n` samples each after two warm-ups, taken one of
/// each in turn.
fn process_latencies<const N: usize>(
    commands: [(&str, &[&str]); N],
    n: usize,
) -> Result<[Summary; N], String> {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(n));
    for i in 0..n + 2 {
        for ((program, args), samples) in commands.iter().zip(&mut samples) {
            let t = Instant::now();
            let status = Command::new(program)
                .args(*args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(|e| format!("running {program}: {e}"))?;
            if !status.success() {
                return Err(format!("{program} {args:?} failed: {status}"));
            }
            if i >= 2 {
                samples.push(us(t.elapsed()));
            }
        }
    }
    Ok(samples.map(Summary::of))
}

fn which(program: &str) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

//! The adversarial suite: hostile code against every available backend, with host canaries the
//! guest must never reach.
//!
//! The corpus lives in `tests/adversarial/corpus/*.toml`, one file per category. Each case runs
//! on each backend; afterwards the harness checks the case's own expectation and the
//! invariants every case shares:
//!
//! * the run returned within its wall limit plus a margin;
//! * the host is alive and a fresh sandbox still runs;
//! * no canary (a host file's content, a host environment variable's value, the secret tool's
//!   result) appears in stdout, stderr, the value or the error;
//! * the registered but never exposed secret tool ran zero times;
//! * no marker file appeared outside the sandbox;
//! * listeners on loopback (TCP on 127.0.0.1 and ::1, UDP, a Unix socket) saw zero connections
//!   or datagrams.
//!
//! `harness = false`: this file owns `main`, so it can plant the environment canary before any
//! thread exists. `cargo test --test adversarial -- FILTER` runs the cases whose
//! `category/name` contains FILTER.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod canaries;
mod case;
mod mcp;
#[path = "../os_support/mod.rs"]
mod os_support;
mod servers;
#[path = "../../server/tests/it/slow_client.rs"]
mod slow_client;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use canaries::Canaries;
use case::{Case, Expect};
use pycage::{ErrorKind, RunResult, Runner, ToolPolicy};
use pycage_tools::ToolRegistry;

/// How much later than its wall limit a run may return.
const MARGIN: Duration = Duration::from_millis(1500);

fn main() -> ExitCode {
    // The environment canary must be in this process's environment from the start; setting
    // it here would race other threads, so the suite re-runs itself with it set.
    if let Some(code) = canaries::reexec_with_env_canary() {
        return code;
    }
    let canaries = Canaries::plant();
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cases = match case::load_corpus() {
        Ok(cases) => cases,
        Err(e) => {
            eprintln!("adversarial: corpus: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let failures = runtime.block_on(run_all(&canaries, &cases, filter.as_deref()));
    canaries.clean_up();
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("\nadversarial: {} failure(s):", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        ExitCode::FAILURE
    }
}

/// Where to write a Markdown report of the run (for `docs/adversarial-results.md`).
const ENV_REPORT: &str = "PYCAGE_ADVERSARIAL_REPORT";

async fn run_all(canaries: &Canaries, cases: &[Case], filter: Option<&str>) -> Vec<String> {
    let mut failures = Vec::new();
    let mut report =
        String::from("| backend | category | case | outcome | time |\n|---|---|---|---|---|\n");
    let mut ran = 0;
    let rss_before = rss_bytes();
    for subject in backends() {
        let backend = subject.name;
        // A backend's first run pays for its preparation (the wasm backends compile the guest,
        // tens of seconds on a cold cache); the cases' time limits are for the runs alone.
        if let Err(why) = warm_up(&subject).await {
            failures.push(format!("[{backend}] the warm-up run failed: {why}"));
            continue;
        }
        for case in cases {
            let id = format!("{}/{}", case.category, case.name);
            if filter.is_some_and(|f| !id.contains(f))
                || !case.runs_on(backend)
                || (case.session && !subject.supports_sessions())
            {
                continue;
            }
            ran += 1;
            let started = Instant::now();
            let outcome = run_case(canaries, &subject, case).await;
            record(&mut report, &mut failures, backend, case, outcome, started);
        }
    }
    // The tool-abuse category once more, through the MCP server (over the wasm backend): the
    // server's own path from a client's call to the broker must refuse exactly the same.
    if let Some(subject) = os_support::subject("wasm") {
        for case in cases.iter().filter(|c| c.category == MCP_CATEGORY) {
            let id = format!("{}/{}", case.category, case.name);
            if filter.is_some_and(|f| !id.contains(f)) || !case.runs_on("wasm") {
                continue;
            }
            ran += 1;
            let started = Instant::now();
            let outcome = run_case_via_mcp(canaries, &subject, case).await;
            record(
                &mut report,
                &mut failures,
                "mcp (wasm)",
                case,
                outcome,
                started,
            );
        }
    }
    // The servers' own attack surface, on both servers (HTTP API and MCP over HTTP).
    let server_ids = servers::ATTACKS.iter().map(|a| format!("servers/{a}"));
    if filter.is_none_or(|f| server_ids.clone().any(|id| id.contains(f))) {
        ran += run_servers(&mut report, &mut failures, filter).await;
    }
    // A custom guest (packages baked in, `pycage guest build`) is the same sandbox: the
    // categories that test its walls run on it too, and on the data guest (numpy's C code
    // linked into the guest).
    if filter.is_none_or(|f| {
        f.contains("custom")
            || CUSTOM_GUEST_CATEGORIES
                .iter()
                .any(|c| c.contains(f) || f.contains(c))
    }) {
        for (label, subject) in [
            (
                "wasm (custom guest)",
                custom_guest_subject(os_support::packaged_guest),
            ),
            (
                "wasm (data guest)",
                custom_guest_subject(os_support::data_guest),
            ),
        ] {
            let Some(subject) = subject else { continue };
            if let Err(why) = warm_up(&subject).await {
                failures.push(format!("[{label}] the warm-up run failed: {why}"));
            }
            for case in cases
                .iter()
                .filter(|c| CUSTOM_GUEST_CATEGORIES.contains(&c.category.as_str()))
            {
                let id = format!("{}/{}", case.category, case.name);
                if filter.is_some_and(|f| !id.contains(f) && !f.contains("custom"))
                    || !case.runs_on("wasm")
                    || case.session
                {
                    continue;
                }
                ran += 1;
                let started = Instant::now();
                let outcome = run_case(canaries, &subject, case).await;
                record(&mut report, &mut failures, label, case, outcome, started);
            }
        }
    }
    let growth = rss_bytes().saturating_sub(rss_before);
    println!(
        "adversarial: {ran} case runs; host RSS grew {} MiB",
        growth >> 20
    );
    // Guest-sized allocations must stay in the guest: the host may cache a few instances'
    // worth of memory, not what the cases asked for (several GiB).
    if growth > 1 << 30 {
        failures.push(format!(
            "host memory grew by {} MiB over the suite",
            growth >> 20
        ));
    }
    if ran == 0 {
        failures.push("no case ran (filter matched nothing?)".into());
    }
    if let Some(path) = std::env::var_os(ENV_REPORT) {
        let summary = format!(
            "{ran} case runs, {} failures; host resident memory grew {} MiB over the suite.\n\n",
            failures.len(),
            growth >> 20
        );
        if let Err(e) = std::fs::write(&path, summary + &report) {
            failures.push(format!("writing the report: {e}"));
        }
    }
    failures
}

/// The category that also runs through the MCP server.
const MCP_CATEGORY: &str = "tools";

/// Runs the `servers` category (see `servers.rs`) on both servers; how many attacks ran.
async fn run_servers(
    report: &mut String,
    failures: &mut Vec<String>,
    filter: Option<&str>,
) -> usize {
    let net = servers::net_targets().await;
    let mut ran = 0;
    for server in [servers::Server::Http, servers::Server::Mcp] {
        let listening = match servers::start(server, net.clone()).await {
            Ok(listening) => listening,
            Err(why) => {
                failures.push(format!("[{}] did not start: {why}", server.name()));
                continue;
            }
        };
        for name in servers::ATTACKS {
            let id = format!("servers/{name}");
            if filter.is_some_and(|f| !id.contains(f)) {
                continue;
            }
            ran += 1;
            let started = Instant::now();
            let outcome = servers::attack(&listening, name).await;
            record_named(
                report,
                failures,
                server.name(),
                ("servers", name),
                outcome,
                started,
            );
        }
    }
    ran
}

/// Adds a case's outcome to the report and the console, and to `failures` when it failed.
fn record(
    report: &mut String,
    failures: &mut Vec<String>,
    backend: &str,
    case: &Case,
    outcome: Result<(), String>,
    started: Instant,
) {
    let id = (case.category.as_str(), case.name.as_str());
    record_named(report, failures, backend, id, outcome, started);
}

/// Adds the outcome of `(category, name)` on `backend` to the report and the console, and to
/// `failures` when it failed.
fn record_named(
    report: &mut String,
    failures: &mut Vec<String>,
    backend: &str,
    (category, name): (&str, &str),
    outcome: Result<(), String>,
    started: Instant,
) {
    let took = started.elapsed();
    let id = format!("{category}/{name}");
    let verdict = match &outcome {
        Ok(()) => "pass".to_owned(),
        Err(why) => format!("**FAIL**: {}", why.replace('|', "\\|")),
    };
    report.push_str(&format!(
        "| {backend} | {category} | {name} | {verdict} | {:.0} ms |\n",
        took.as_secs_f64() * 1000.0
    ));
    match outcome {
        Ok(()) => println!("ok    [{backend}] {id} ({took:.2?})"),
        Err(why) => {
            println!("FAIL  [{backend}] {id}: {why}");
            failures.push(format!("[{backend}] {id}: {why}"));
        }
    }
}

/// Runs a case as one `run_python` call through the MCP server, with the same checks as
/// [`run_case`] plus: no canary anywhere in the MCP response (text blocks included).
async fn run_case_via_mcp(
    canaries: &Canaries,
    subject: &os_support::Subject,
    case: &Case,
) -> Result<(), String> {
    if case.session || !case.then.is_empty() || !case.files.is_empty() {
        return Err(
            "a case through the MCP server is one call: no session, `then` or files".into(),
        );
    }
    let runner = runner(canaries, subject, case)?;
    let code = canaries.substitute(&case.code);
    let started = Instant::now();
    let (result, whole) = mcp::run(runner.clone(), case.limits.clone(), &code).await?;
    let took = started.elapsed();
    let limit = case.limits.wall_timeout() + MARGIN.max(subject.timeout_margin());
    if took > limit {
        return Err(format!("returned after {took:.2?}, over {limit:.2?}"));
    }
    check_expectation(case, subject.native(), &result)?;
    canaries.check(&result)?;
    Canaries::check_text(&whole, "the MCP response")?;
    fresh_sandbox_runs(&runner).await
}

/// Checks that the runner still gives a working sandbox after a case. The probe has the
/// default limits, not the case's: it asks whether the backend still works, not how fast it
/// starts (a container's cold start under load took over a case's 1 s wall limit once).
async fn fresh_sandbox_runs(runner: &Runner) -> Result<(), String> {
    let fresh = runner
        .run_request(pycage::RunRequest::new("return 1 + 1").limits(pycage::Limits::default()))
        .await;
    if fresh.value != serde_json::json!(2) {
        return Err(format!("a fresh sandbox no longer runs: {fresh:?}"));
    }
    Ok(())
}

/// The categories the custom guest runs: escapes, files, memory, tool abuse and network.
const CUSTOM_GUEST_CATEGORIES: &[&str] = &[
    "escapes",
    "files",
    "filesystem",
    "memory",
    "tools",
    "network",
    "processes",
];

/// The wasm backend on a guest built with packages baked in (`os_support::packaged_guest`,
/// or the data guest, `os_support::data_guest`), or `None` with the reason when it cannot be
/// built (failing instead in CI: the build needs PyPI).
fn custom_guest_subject(
    build: fn() -> Result<std::path::PathBuf, String>,
) -> Option<os_support::Subject> {
    let path = match build() {
        Ok(path) => path,
        Err(why) => {
            os_support::skip(&format!("the custom guest did not build: {why}"));
            return None;
        }
    };
    let guest = pycage::Guest::from_path(&path).expect("a guest pycage just built loads");
    let backend = pycage::WasmBackend::builder()
        .cache_dir(Some(os_support::packaged_guest_cache()))
        .guest(guest)
        .build()
        .expect("the wasm engine starts");
    Some(os_support::Subject {
        name: "wasm",
        backend: std::sync::Arc::new(backend),
    })
}

/// One untimed `pass` on `subject`, so that its preparation is not counted against a case.
async fn warm_up(subject: &os_support::Subject) -> Result<(), String> {
    let runner = subject.runner(
        ToolRegistry::with_builtins(),
        ToolPolicy::new().namespace("math"),
        pycage::Limits::default(),
    );
    let result = runner.run("pass").await;
    if result.ok {
        Ok(())
    } else {
        Err(format!("{:?}", result.error))
    }
}

/// The backends this suite runs against: every one available here that isolates (`local`
/// provides no boundary, so the canaries would be reachable by design). In CI an unavailable
/// backend is a failure (see `os_support::required`).
fn backends() -> Vec<os_support::Subject> {
    ["wasm", "bubblewrap", "docker", "wasm+bubblewrap"]
        .into_iter()
        .filter_map(os_support::subject)
        .collect()
}

fn runner(
    canaries: &Canaries,
    subject: &os_support::Subject,
    case: &Case,
) -> Result<Runner, String> {
    let mut tools = ToolRegistry::with_builtins();
    tools
        .extend(canaries.secret_tools())
        .map_err(|e| e.to_string())?;
    tools.register(net_fetch()?).map_err(|e| e.to_string())?;
    let mut policy = ToolPolicy::new();
    if case.allow.is_empty() {
        policy = policy.namespace("math");
    }
    for entry in &case.allow {
        policy = policy.allow(entry.as_str());
    }
    Ok(subject.runner(tools, policy, case.limits.clone()))
}

/// `net.fetch` (exposed to the cases that list it in `allow`) with an operator's careless
/// allowlist: `localhost` and loopback, unspecified and metadata addresses in several
/// spellings are on it, every port, so that only the address check (after resolution, for a
/// name) stands between a case and the canary listeners. No range is let through
/// (`allow_address`), and no secret is bound. `example.com` is the allowed host the URL
/// tricks dress a loopback request up as.
fn net_fetch() -> Result<pycage_tools::net::FetchTool, String> {
    use pycage_tools::net::{FetchLimits, FetchTool, NetPolicy, Secrets};
    let mut policy = NetPolicy::new();
    for host in NET_ALLOW {
        policy = policy.allow(host.parse()?);
    }
    FetchTool::new(policy, Secrets::new(), FetchLimits::default())
}

/// The hosts `net.fetch` allows in this suite (see [`net_fetch`]).
const NET_ALLOW: &[&str] = &[
    "example.com",
    "localhost",
    "127.0.0.1",
    "0.0.0.0",
    "169.254.169.254",
    "[::ffff:169.254.169.254]",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[64:ff9b::127.0.0.1]",
    "[2002:7f00:1::]",
];

async fn run_case(
    canaries: &Canaries,
    subject: &os_support::Subject,
    case: &Case,
) -> Result<(), String> {
    let runner = runner(canaries, subject, case)?;
    let code = canaries.substitute(&case.code);
    let started = Instant::now();
    let request = pycage::RunRequest::new(code).files(case.files.clone());
    let result = if case.session {
        run_in_sessions(canaries, &runner, case, request).await?
    } else {
        let mut result = runner.run_request(request).await;
        for follow_up in &case.then {
            // A later run in a fresh sandbox: what the first run left behind must be gone.
            result = runner.run(&canaries.substitute(follow_up)).await;
        }
        result
    };
    let took = started.elapsed();
    let margin = MARGIN.max(subject.timeout_margin());
    let limit = (case.limits.wall_timeout() + margin) * (1 + case.then.len() as u32);
    if took > limit {
        return Err(format!("returned after {took:.2?}, over {limit:.2?}"));
    }
    check_expectation(case, subject.native(), &result)?;
    canaries.check(&result)?;
    fresh_sandbox_runs(&runner).await
}

/// Runs a session case: `code`, then each follow-up, in one session (or the follow-ups in a
/// second one), checking the canaries after every run; returns the last result.
async fn run_in_sessions(
    canaries: &Canaries,
    runner: &Runner,
    case: &Case,
    first: pycage::RunRequest,
) -> Result<RunResult, String> {
    let opened = |what| move |e: pycage::RunError| format!("the {what} session did not open: {e}");
    let session = runner.session().await.map_err(opened("first"))?;
    let mut result = session.run_request(first).await;
    canaries.check(&result)?;
    let next = if case.next_session {
        Some(runner.session().await.map_err(opened("second"))?)
    } else {
        None
    };
    for follow_up in &case.then {
        result = next
            .as_ref()
            .unwrap_or(&session)
            .run(&canaries.substitute(follow_up))
            .await;
        canaries.check(&result)?;
    }
    Ok(result)
}

fn check_expectation(case: &Case, native: bool, r: &RunResult) -> Result<(), String> {
    let error = r.error.as_ref();
    let (expect, details) = case.expectation(native);
    match expect {
        Expect::Ok if !r.ok => return Err(format!("expected ok, got {:?}", error)),
        Expect::Fail if r.ok => return Err(format!("expected a failure, got ok: {}", r.value)),
        Expect::Kind(kind) => match error {
            Some(e) if e.kind == *kind => {}
            _ => return Err(format!("expected {kind}, got ok={} {:?}", r.ok, error)),
        },
        Expect::OneOf(kinds) => match error {
            Some(e) if kinds.contains(&e.kind) => {}
            _ => {
                return Err(format!(
                    "expected one of {kinds:?}, got ok={} {:?}",
                    r.ok, error
                ));
            }
        },
        _ => {}
    }
    if let Some(exception) = case.exception.as_ref().filter(|_| details)
        && error.and_then(|e| e.exception.as_deref()) != Some(exception.as_str())
    {
        return Err(format!("expected exception {exception}, got {error:?}"));
    }
    if let Some(needle) = case.message_contains.as_ref().filter(|_| details)
        && !error.is_some_and(|e| e.message.contains(needle.as_str()))
    {
        return Err(format!(
            "expected the message to contain {needle:?}, got {error:?}"
        ));
    }
    if let Some(value) = case.value.as_ref().filter(|_| details)
        && &r.value != value
    {
        return Err(format!("expected value {value}, got {}", r.value));
    }
    if let Some(max) = case.output_max {
        for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            if text.len() > max {
                return Err(format!("{name} is {} bytes, over {max}", text.len()));
            }
        }
    }
    if let Some(max) = case.message_max
        && let Some(e) = error
    {
        let total = e.message.len() + e.traceback.as_ref().map_or(0, String::len);
        if total > max {
            return Err(format!("the error text is {total} bytes, over {max}"));
        }
    }
    if let Some(calls) = case.tool_calls
        && r.tool_calls != calls
    {
        return Err(format!("expected {calls} tool calls, got {}", r.tool_calls));
    }
    if *expect == Expect::Kind(ErrorKind::Timeout) && !r.timed_out {
        return Err("a timeout without timed_out set".into());
    }
    Ok(())
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

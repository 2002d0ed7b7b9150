//! `pycage bench`: a fixed suite measured side by side with baselines run in the same process.
//!
//! Every figure comes from this run on this machine: pycage's cases and the native baselines
//! (`python3 -I -S` as a subprocess, and bubblewrap around it where present) are measured one
//! after the other, so the ratios compare like with like. With `--peers PYTHON` the peer
//! sandboxes that Python imports (pydantic-monty) run the same snippets, one sample of each
//! side in turn.

mod cases;
mod guest;
mod mcp;
mod peers;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::cli::BenchArgs;
use crate::exit::Exit;

pub use stats::Summary;

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The case.
    pub case: &'static str,
    /// What the figures measure.
    pub unit: &'static str,
    /// pycage's figure (latency summary, or a single value for throughput/memory).
    pub pycage: Figure,
    /// The baseline it is compared with, if any.
    pub baseline: Option<Baseline>,
    /// A target from the performance issue, for reference.
    pub target: Option<&'static str>,
}

/// A measured figure.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Figure {
    /// Latency percentiles.
    Latency(Summary),
    /// One number (runs per second, bytes, a ratio).
    Value(f64),
}

/// A baseline figure and what it is.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// What ran (for example `python3 -I -S -c pass`).
    pub name: String,
    /// Its figure, in the row's unit.
    pub figure: Figure,
}

/// Settings of a bench run.
pub struct Settings {
    pub iterations: usize,
    pub duration: Duration,
    /// Idle time before each sandbox latency sample.
    pub idle: Duration,
    pub python: String,
    pub pycage_exe: PathBuf,
    /// The upstream MCP server for the `mcp_upstream` row, as `--upstream` gives it.
    pub upstream: Option<String>,
    /// The custom guest of the `guest_*` rows.
    pub guest: Option<pycage::Guest>,
    /// The Python whose peer sandboxes the `peers_*` rows run (`--peers`).
    pub peers: Option<String>,
}

pub async fn bench(args: BenchArgs) -> Exit {
    let guest = match args
        .guest
        .as_deref()
        .map(pycage::Guest::from_path)
        .transpose()
    {
        Ok(guest) => guest,
        Err(e) => {
            eprintln!("pycage bench: {e}");
            return Exit::Usage;
        }
    };
    let settings = Settings {
        iterations: args.iterations,
        duration: args.duration,
        idle: args.idle,
        python: real_python(&args.python),
        pycage_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("pycage")),
        upstream: args.upstream.clone(),
        guest,
        peers: args.peers.clone(),
    };
    let rows = match cases::run_all(&settings, args.only.as_deref()).await {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("pycage bench: {e}");
            return Exit::Internal;
        }
    };
    if args.json {
        let report = serde_json::json!({
            "machine": machine(),
            "iterations": settings.iterations,
            "idle_us": settings.idle.as_micros() as u64,
            "rows": rows,
        });
        println!("{report}");
    } else {
        print_table(&rows, settings.idle);
    }
    Exit::Ok
}

/// The interpreter itself, not a wrapper that finds it: version-manager shims (pyenv) are
/// shell scripts that would add tens of milliseconds to every baseline start.
fn real_python(python: &str) -> String {
    std::process::Command::new(python)
        .args(["-I", "-S", "-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| python.to_owned())
}

fn machine() -> serde_json::Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    serde_json::json!({ "cpus": cpus, "cpu": model, "os": std::env::consts::OS })
}

fn print_table(rows: &[Row], idle: Duration) {
    let m = machine();
    println!(
        "pycage bench — {} CPUs, {}",
        m["cpus"],
        m["cpu"].as_str().unwrap_or("?")
    );
    if !idle.is_zero() {
        println!("sandbox latency samples each after {idle:?} idle");
    }
    println!(
        "{:<34} {:>11} {:>11}  {:<30} {:>11} {:>8}  target",
        "case", "p50", "p99", "baseline", "its p50", "ratio"
    );
    for row in rows {
        let (p50, p99) = cells(&row.pycage, row.unit);
        let (bname, bp50, ratio) = match &row.baseline {
            Some(b) => {
                let (bp50, _) = cells(&b.figure, row.unit);
                let ratio = match (center(&row.pycage), center(&b.figure)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
                    _ => "-".into(),
                };
                (b.name.clone(), bp50, ratio)
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:<34} {:>11} {:>11}  {:<30} {:>11} {:>8}  {}",
            row.case,
            p50,
            p99,
            bname,
            bp50,
            ratio,
            row.target.unwrap_or("")
        );
    }
    println!(
        "ratio = pycage / baseline (for latency and time: lower is better; for rates: higher)"
    );
}

fn center(f: &Figure) -> Option<f64> {
    match f {
        Figure::Latency(s) => Some(s.p50),
        Figure::Value(v) => Some(*v),
    }
}

fn cells(f: &Figure, unit: &str) -> (String, String) {
    match f {
        Figure::Latency(s) => (fmt(s.p50, unit), fmt(s.p99, unit)),
        Figure::Value(v) => (fmt(*v, unit), String::new()),
    }
}

fn fmt(v: f64, unit: &str) -> String {
    match unit {
        "us" if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
        "us" => format!("{v:.1} us"),
        "runs/s" => format!("{v:.0}/s"),
        "bytes" => format!("{:.2} MiB", v / (1024.0 * 1024.0)),
        "ratio" => format!("{v:.3}"),
        other => format!("{v:.2} {other}"),
    }
}

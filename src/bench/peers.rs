//! `pycage bench --peers PYTHON`: the same snippets through pycage and through the peer
//! sandboxes that Python can import (pydantic-monty; see `scripts/peers`), one sample of each
//! in turn, so both sides see the same machine in the same window. Each side's figure is the
//! wall time of one fresh run as its host application sees it, measured in that host's
//! process: pycage's `Runner::run` here, the peer's call in the driver (`peers.py`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use pycage::{Runner, WasmBackend};
use serde_json::{Value, json};

use super::cases::{COMPUTE, JSON_10K, REGEX_1MB, check, runner, us};
use super::{Baseline, Figure, Row, Settings, Summary};

/// The driver, run by the peers' Python.
const DRIVER: &str = include_str!("peers.py");

/// The cases: name, code (the same for both sides), samples (`None`: the bench's
/// iterations), target. `peers_pool_*` runs pycage's side in its warm pool (see [`Ours`]).
fn cases() -> [(&'static str, String, Option<usize>, &'static str); 6] {
    [
        (
            "peers_fresh_pass",
            "pass".into(),
            None,
            "p50 <= 0.15 ms and >= 1.5x faster than Monty",
        ),
        ("peers_fresh_print", "print('hi')".into(), None, ""),
        ("peers_pool_pass", "pass".into(), None, ""),
        (
            "peers_compute_sum_squares",
            format!("x = {COMPUTE}"),
            Some(9),
            "<= 1.0x Monty",
        ),
        (
            "peers_json_roundtrip_10k",
            format!("import json\nx = {JSON_10K}"),
            Some(9),
            "<= 1.0x Monty",
        ),
        (
            "peers_regex_1mb",
            format!("import re\nx = {REGEX_1MB}"),
            Some(9),
            "<= 1.0x Monty",
        ),
    ]
}

/// The driver process and what it could import.
struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    versions: BTreeMap<String, String>,
}

impl Driver {
    fn start(python: &str) -> Result<Self, String> {
        let mut child = Command::new(python)
            .args(["-I", "-c", DRIVER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("--peers: cannot run {python}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .map(BufReader::new)
            .ok_or("--peers: the driver has no stdout")?;
        let mut driver = Driver {
            child,
            stdin,
            stdout,
            versions: BTreeMap::new(),
        };
        let hello = driver.read()?;
        for (peer, why) in hello["missing"].as_object().into_iter().flatten() {
            eprintln!(
                "pycage bench: peer {peer} not measured: {}",
                why.as_str().unwrap_or("?")
            );
        }
        driver.versions = serde_json::from_value(hello["peers"].clone())
            .map_err(|e| format!("--peers: the driver's greeting: {e}"))?;
        Ok(driver)
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("--peers: reading the driver: {e}"))?;
        if line.is_empty() {
            return Err("--peers: the driver exited (its stderr says why)".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("--peers: the driver said {line:?}: {e}"))
    }

    /// One fresh run of `code` in `peer`, in microseconds.
    fn time(&mut self, peer: &str, code: &str) -> Result<f64, String> {
        let stdin = self.stdin.as_mut().ok_or("--peers: the driver is closed")?;
        writeln!(stdin, "{}", json!({"peer": peer, "code": code}))
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("--peers: writing to the driver: {e}"))?;
        let answer = self.read()?;
        match answer["seconds"].as_f64() {
            Some(seconds) => Ok(seconds * 1e6),
            None => Err(format!(
                "--peers: {peer} failed on {code:?}: {}",
                answer["error"]
            )),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // End of input: the driver closes its pool and exits.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// How pycage's side of a case runs.
enum Ours<'a> {
    /// A fresh sandbox: instantiated for the run, dropped after it.
    Fresh(&'a Runner),
    /// The warm pool's next instance, as a host that asks for the lowest latency runs
    /// (`warm_pool(POOL).meter_fuel(false)`: instantiated and primed in the background, never
    /// used before, dropped after the run), the way Monty's side takes a warm worker. The
    /// pool is full before each sample, as Monty's workers are idle.
    Pool(&'a Runner, &'a WasmBackend),
}

/// The warm pool's size for the `peers_pool_*` rows.
const POOL: usize = 4;

/// One sample of pycage's run of `code`, in microseconds.
async fn pycage_sample(ours: &Ours<'_>, code: &str) -> Result<f64, String> {
    let runner = match ours {
        Ours::Fresh(runner) => runner,
        Ours::Pool(runner, backend) => {
            while backend.warm_instances() < POOL {
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
            runner
        }
    };
    let t = Instant::now();
    check(runner.run(code).await)?;
    Ok(us(t.elapsed()))
}

/// The peer rows the `wanted` filter keeps, for every peer `python` can import.
pub(super) async fn rows(
    s: &Settings,
    python: &str,
    fresh: &Runner,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<Row>, String> {
    let mut driver = Driver::start(python)?;
    let peers: Vec<(String, String)> = driver
        .versions
        .iter()
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect();
    let pooled = if cases()
        .iter()
        .any(|c| c.0.starts_with("peers_pool") && wanted(c.0))
    {
        let backend = WasmBackend::builder()
            .warm_pool(POOL)
            .meter_fuel(false)
            .build()
            .map_err(|e| e.to_string())?;
        backend.prepare().await.map_err(|e| e.to_string())?;
        Some((runner(backend.clone(), 100)?, backend))
    } else {
        None
    };
    let mut rows = Vec::new();
    for (case, code, samples, target) in cases() {
        if !wanted(case) {
            continue;
        }
        let side = match &pooled {
            Some((runner, backend)) if case.starts_with("peers_pool") => {
                Ours::Pool(runner, backend)
            }
            _ => Ours::Fresh(fresh),
        };
        let n = samples.unwrap_or(s.iterations);
        for (peer, version) in &peers {
            let warm_up = if samples.is_some() { 1 } else { n.min(20) };
            for _ in 0..warm_up {
                pycage_sample(&side, &code).await?; // warm-up
                driver.time(peer, &code)?;
            }
            let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for i in 0..n {
                super::cases::idle(s).await;
                // Each side goes first in turn, so neither always finds the caches the
                // other left.
                if i % 2 == 0 {
                    ours.push(pycage_sample(&side, &code).await?);
                    theirs.push(driver.time(peer, &code)?);
                } else {
                    theirs.push(driver.time(peer, &code)?);
                    ours.push(pycage_sample(&side, &code).await?);
                }
            }
            rows.push(Row {
                case,
                unit: "us",
                pycage: Figure::Latency(Summary::of(ours)),
                baseline: Some(Baseline {
                    name: peer_name(peer, version),
                    figure: Figure::Latency(Summary::of(theirs)),
                }),
                target: (!target.is_empty()).then_some(target),
            });
        }
    }
    Ok(rows)
}

fn peer_name(peer: &str, version: &str) -> String {
    match peer {
        "monty" => format!("pydantic-monty {version}, pooled"),
        other => format!("{other} {version}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver greets with what it could import and answers a peer it lacks with an
    /// error, not a hang; the system Python has no peers installed (or some: either way the
    /// greeting names each peer once).
    #[test]
    fn the_driver_greets_and_refuses_an_unknown_peer() {
        let mut driver = Driver::start("python3").unwrap();
        assert!(
            !driver.versions.contains_key("nope"),
            "{:?}",
            driver.versions
        );
        let refused = driver.time("nope", "pass").unwrap_err();
        assert!(refused.contains("nope failed"), "{refused}");
        assert!(refused.contains("KeyError"), "{refused}");
    }
}

//! Deterministic mode: virtual clocks, seeded random bytes, the same output and fuel every time.

use crate::common;

use std::time::{Duration, Instant};

use common::math_runner_on;
use pycage::{RunResult, WasmBackend};
use serde_json::Value;

/// Everything a run can read that differs between runs on the host's clocks and entropy.
const PROGRAM: &str = r#"
import datetime, os, random, secrets, time, uuid
r = [random.random() for _ in range(3)]
print(r, uuid.uuid4(), secrets.token_hex(8), os.urandom(4).hex())
print(time.time(), datetime.datetime.now().isoformat(), time.monotonic(), time.perf_counter())
print(sorted({str(i): i for i in range(50)}.items())[:3], id(object()) % 997)
total = await add(a=2, b=3)
return {"random": r, "uuid": str(uuid.uuid4()), "time": time.time(), "total": total}
"#;

fn deterministic(seed: u64, warm_pool: usize) -> WasmBackend {
    WasmBackend::builder()
        .deterministic(seed)
        .warm_pool(warm_pool)
        .max_instances(32)
        .build()
        .unwrap()
}

/// What must be identical, byte for byte, between two runs of the same program and seed.
fn observed(r: &RunResult) -> (String, String, Value, Option<u64>) {
    assert!(r.ok, "{r:#?}");
    (
        r.stdout.clone(),
        r.stderr.clone(),
        r.value.clone(),
        r.fuel_consumed,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_output_and_fuel_pooled_fresh_and_concurrent() {
    let fresh = deterministic(7, 0);
    let pooled = deterministic(7, 2);
    fresh.prepare().await.unwrap();
    pooled.prepare().await.unwrap();
    let first = observed(&math_runner_on(&fresh).run(PROGRAM).await);
    assert!(first.3.unwrap() > 0, "deterministic runs meter fuel");
    for i in 0..20 {
        for (how, backend) in [("fresh", &fresh), ("pooled", &pooled)] {
            let again = observed(&math_runner_on(backend).run(PROGRAM).await);
            assert_eq!(again, first, "{how} repeat {i}");
        }
    }
    let r = math_runner_on(&pooled);
    let runs = (0..16).map(|_| {
        let r = r.clone();
        tokio::spawn(async move { r.run(PROGRAM).await })
    });
    for run in runs {
        assert_eq!(
            observed(&run.await.unwrap()),
            first,
            "one of 16 concurrent runs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_seed_changes_the_random_bytes_and_not_the_clocks() {
    let code = "import random, time, uuid, datetime\n\
        return [random.random(), str(uuid.uuid4()), time.time(), \
        datetime.datetime.now().isoformat(), time.monotonic()]";
    let a = math_runner_on(&deterministic(1, 0)).run(code).await;
    let b = math_runner_on(&deterministic(1, 0)).run(code).await;
    let c = math_runner_on(&deterministic(2, 0)).run(code).await;
    assert!(a.ok && b.ok && c.ok, "{a:#?} {b:#?} {c:#?}");
    assert_eq!(a.value, b.value);
    let (a, c) = (a.value.as_array().unwrap(), c.value.as_array().unwrap());
    assert_ne!(a[0], c[0], "random");
    assert_ne!(a[1], c[1], "uuid4");
    assert_eq!(a[2..], c[2..], "the clocks do not depend on the seed");
    let wall = a[2].as_f64().unwrap();
    assert!(
        (946_684_800.0..946_684_801.0).contains(&wall),
        "the virtual wall clock starts at 2000-01-01: {wall}"
    );
    assert!(a[3].as_str().unwrap().starts_with("2000-01-01T00:00:00"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_returns_at_once_and_moves_both_clocks_by_what_it_asked() {
    let code = "import time\nt, m = time.time(), time.monotonic()\ntime.sleep(5)\n\
        return [time.time() - t, time.monotonic() - m]";
    // A first run loads (or compiles) the guest, which on a loaded machine can take seconds
    // of its own: only the second run is timed.
    let runner = math_runner_on(&deterministic(0, 0));
    assert!(runner.run("pass").await.ok);
    let started = Instant::now();
    let r = runner.run(code).await;
    let took = started.elapsed();
    assert!(r.ok, "{r:#?}");
    for elapsed in r.value.as_array().unwrap() {
        let elapsed = elapsed.as_f64().unwrap();
        assert!((5.0..5.001).contains(&elapsed), "{elapsed}");
    }
    // A real sleep would take 5 s; the run itself takes milliseconds.
    assert!(took < Duration::from_secs(5), "the sleep waited: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_it_the_guest_reads_the_hosts_clocks_and_really_sleeps() {
    let code = "import time\nt, m = time.time(), time.monotonic()\ntime.sleep(0.05)\n\
        return [t, time.monotonic() - m]";
    let r = math_runner_on(&WasmBackend::builder().build().unwrap())
        .run(code)
        .await;
    assert!(r.ok, "{r:#?}");
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (t, slept) = (r.value[0].as_f64().unwrap(), r.value[1].as_f64().unwrap());
    assert!((host - t).abs() < 60.0, "guest {t}, host {host}");
    assert!(slept >= 0.05, "slept {slept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_clock_limit_still_applies_in_real_time() {
    let r = math_runner_on(&deterministic(0, 0))
        .run_request(
            pycage::RunRequest::new("while True:\n    pass").limits(
                pycage::Limits::builder()
                    .wall_timeout(Duration::from_millis(300))
                    .build()
                    .unwrap(),
            ),
        )
        .await;
    assert!(!r.ok);
    assert_eq!(
        r.error.unwrap().kind,
        pycage::ErrorKind::Timeout,
        "{:?}",
        r.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nans_are_canonical_whatever_the_cpu() {
    // x86 computes inf - inf as the negative NaN fff8...; wasm's canonical NaN is 7ff8... on
    // every CPU (on x86 the test fails without canonicalization).
    let code = "import struct\nx = float('inf')\n\
        return [struct.pack('>d', x - x).hex(), struct.pack('>d', x * 0.0).hex()]";
    let r = math_runner_on(&deterministic(0, 0)).run(code).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value,
        serde_json::json!(["7ff8000000000000", "7ff8000000000000"])
    );
}

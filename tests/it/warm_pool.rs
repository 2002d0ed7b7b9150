//! The warm pool: pre-instantiated guests, never reused.

use crate::common;

use std::time::{Duration, Instant};

use common::{SEED, math_runner_on};
use pycage::WasmBackend;
use serde_json::json;

async fn wait_for(backend: &WasmBackend, n: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while backend.warm_instances() < n {
        assert!(Instant::now() < until, "the pool did not fill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_runs_match_fresh_runs_and_the_pool_refills() {
    let pooled = WasmBackend::builder().warm_pool(2).build().unwrap();
    pooled.prepare().await.unwrap();
    wait_for(&pooled, 2).await;
    let fresh = WasmBackend::builder().build().unwrap();

    let a = math_runner_on(&pooled).run(SEED).await;
    let b = math_runner_on(&fresh).run(SEED).await;
    assert!(a.ok && b.ok, "{a:#?} {b:#?}");
    assert_eq!(a.value, json!(15));
    assert_eq!(
        a.fuel_consumed, b.fuel_consumed,
        "fuel counts from the run, pooled or not"
    );
    assert!(a.fuel_consumed.unwrap() > 0);
    wait_for(&pooled, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_instances_are_never_reused() {
    let pooled = WasmBackend::builder().warm_pool(1).build().unwrap();
    pooled.prepare().await.unwrap();
    let r = math_runner_on(&pooled);
    for _ in 0..5 {
        wait_for(&pooled, 1).await;
        let v = r
            .run(
                "import builtins\nseen = hasattr(builtins, 'mark')\nbuiltins.mark = 1\nreturn seen",
            )
            .await;
        assert_eq!(v.value, json!(false), "{v:#?}");
    }
}

#[tokio::test]
async fn unmetered_backends_report_no_fuel_and_refuse_budgets() {
    // A different engine configuration: compiled (and cached) once, beside the metered one.
    let plain = WasmBackend::builder().meter_fuel(false).build().unwrap();
    plain.prepare().await.unwrap();
    let r = math_runner_on(&plain);
    let ok = r.run("return 1").await;
    assert_eq!(ok.value, json!(1));
    assert_eq!(ok.fuel_consumed, None);
    let limits = pycage::Limits::builder().fuel(Some(1000)).build().unwrap();
    let refused = r.run_with("return 1", Default::default(), &limits).await;
    assert_eq!(refused.error.unwrap().kind, pycage::ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_capability_works_at_full_instance_capacity() {
    let one = WasmBackend::builder().max_instances(1).build().unwrap();
    let r = math_runner_on(&one)
        .run("import socket\ntry:\n    socket.getaddrinfo('localhost', 80)\nexcept PermissionError:\n    return 'denied'")
        .await;
    assert_eq!(r.value, json!("denied"), "{r:#?}");
}

/// Without fuel metering the pool primes its instances (runs a constant snippet once). A run
/// in a primed instance must look exactly like one in a fresh instance. With two in the pool,
/// each run also checks the refill that waits for the run to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primed_instances_look_fresh_to_the_code() {
    let pooled = WasmBackend::builder()
        .meter_fuel(false)
        .warm_pool(2)
        .build()
        .unwrap();
    pooled.prepare().await.unwrap();
    let fresh = WasmBackend::builder().meter_fuel(false).build().unwrap();
    let cases = [
        SEED,
        "print('hi')\nimport sys\nprint('err', file=sys.stderr)\nreturn __name__",
        "x = 1\n\ndef f():\n    return 1 / 0\n\nf()",
        "return sorted(k for k in globals() if k != '__builtins__')",
        "import linecache\nreturn [k for k in linecache.cache if 'sandbox' in k or 'pycage' in k]",
        "def f(:\n    pass",
        "import os, sys\nreturn [sys.argv, dict(os.environ)]",
    ];
    for code in cases {
        wait_for(&pooled, 2).await;
        let a = math_runner_on(&pooled).run(code).await;
        let b = math_runner_on(&fresh).run(code).await;
        assert_eq!(
            (&a.value, &a.stdout, &a.stderr, &a.error),
            (&b.value, &b.stdout, &b.stderr, &b.error),
            "{code}"
        );
    }
    // Each primed instance draws its own random state.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        wait_for(&pooled, 2).await;
        let r = math_runner_on(&pooled)
            .run("import random\nreturn random.random()")
            .await;
        assert!(seen.insert(r.value.to_string()), "{r:#?}");
    }
}

/// A used instance's slot is freed on a background thread; a backend with a single slot
/// still runs one run after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_runs_fit_in_one_slot() {
    let one = WasmBackend::builder().max_instances(1).build().unwrap();
    let r = math_runner_on(&one);
    for i in 0..20 {
        let v = r.run(&format!("return {i}")).await;
        assert_eq!(v.value, json!(i), "{v:#?}");
    }
}

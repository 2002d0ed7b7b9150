//! Criterion benches for pycage's hot paths, so regressions show in review.
//!
//! `cargo bench --bench hot_paths`. The side-by-side comparison with native baselines is
//! `pycage bench`; these track pycage against itself over time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use pycage::{Broker, Limits, Runner, ToolPolicy, WasmBackend};
use pycage_tools::ToolRegistry;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn runner(backend: WasmBackend) -> Runner {
    Runner::builder()
        .backend(Arc::new(backend))
        .tools(ToolRegistry::with_builtins())
        .policy(ToolPolicy::new().namespace("math"))
        .limits(Limits::builder().max_tool_calls(1_000_000).build().unwrap())
        .build()
        .unwrap()
}

fn fresh_sandbox(c: &mut Criterion) {
    let rt = runtime();
    let backend = WasmBackend::builder().build().unwrap();
    rt.block_on(backend.prepare()).unwrap();
    let r = runner(backend);
    c.bench_function("fresh_sandbox_pass", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(r.run("pass").await.ok) })
    });
    c.bench_function("fresh_sandbox_print", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(r.run("print('hi')").await.ok) })
    });
}

fn warm_pool(c: &mut Criterion) {
    let rt = runtime();
    // Unmetered, so the pool primes its instances (see `WasmBackendBuilder::warm_pool`).
    let backend = WasmBackend::builder()
        .meter_fuel(false)
        .warm_pool(4)
        .build()
        .unwrap();
    rt.block_on(backend.prepare()).unwrap();
    let r = runner(backend.clone());
    c.bench_function("warm_pool_print", |b| {
        // Only the runs are timed, each with the pool full (as between bursts).
        let (r, backend) = (&r, &backend);
        b.to_async(&rt).iter_custom(move |iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                while backend.warm_instances() < 4 {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                let started = Instant::now();
                assert!(r.run("print('hi')").await.ok);
                total += started.elapsed();
            }
            total
        })
    });
}

fn tool_calls(c: &mut Criterion) {
    let rt = runtime();
    let backend = WasmBackend::builder().build().unwrap();
    rt.block_on(backend.prepare()).unwrap();
    let r = runner(backend);
    // 1000 calls per run: the run's fixed cost is amortised away.
    let code = "for _ in range(1000):\n    call_tool('add', a=1, b=2)";
    c.bench_function("tool_call_x1000", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(r.run(code).await.ok) })
    });
    // The same calls in a session, whose runs keep no journal: beside the one-shot run (which
    // records every call, in case one waits for approval) it shows what the journal costs.
    let session = rt.block_on(r.session()).unwrap();
    c.bench_function("tool_call_x1000_session_unjournaled", |b| {
        b.to_async(&rt)
            .iter(|| async { assert!(session.run(code).await.ok) })
    });
}

fn broker_only(c: &mut Criterion) {
    let rt = runtime();
    let exposed = ToolPolicy::new()
        .namespace("math")
        .resolve(&ToolRegistry::with_builtins())
        .unwrap();
    let limits = Limits::builder().max_tool_calls(u32::MAX).build().unwrap();
    let broker = Broker::new("bench", exposed, &limits);
    c.bench_function("broker_call_add", |b| {
        b.to_async(&rt)
            .iter(|| async { broker.call("add", r#"{"a": 1, "b": 2}"#).await.unwrap() })
    });
}

criterion_group!(benches, fresh_sandbox, warm_pool, tool_calls, broker_only);
criterion_main!(benches);

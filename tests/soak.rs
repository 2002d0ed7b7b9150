//! Load and soak: 10,000 sequential runs and 1,000 runs at 16-way concurrency, mixing good,
//! failing and limit-hitting code. Good runs never fail, and the host returns to its baseline:
//! no leaked instances, memory, file descriptors or processes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pycage::{ErrorKind, Limits, RunResult, Runner, ToolPolicy};
use serde_json::{Map, json};

/// What run `i` of the mix is, and the limits it runs under.
fn case(i: usize) -> (&'static str, Limits, Option<ErrorKind>) {
    let b = || Limits::builder();
    if i % 200 == 199 {
        let limits = b().wall_timeout(Duration::from_millis(30)).build().unwrap();
        ("while True: pass", limits, Some(ErrorKind::Timeout))
    } else if i % 100 == 99 {
        (
            "b = bytearray(1 << 30)",
            Limits::default(),
            Some(ErrorKind::MemoryLimit),
        )
    } else if i % 25 == 24 {
        let limits = b().fuel(Some(5_000_000)).build().unwrap();
        ("while True: pass", limits, Some(ErrorKind::FuelExhausted))
    } else if i % 10 == 9 {
        ("1 / 0", Limits::default(), Some(ErrorKind::GuestException))
    } else {
        (GOOD, Limits::default(), None)
    }
}

const GOOD: &str = "print('hi')\nr = await add(a=n, b=1)\nreturn r['sum']";

fn check(i: usize, r: &RunResult, expected: Option<ErrorKind>) {
    match expected {
        None => {
            assert!(r.ok, "good run {i} failed: {r:#?}");
            assert_eq!(r.value, json!(i + 1), "run {i}");
            assert_eq!(r.stdout, "hi\n");
            assert_eq!(r.tool_calls, 1);
        }
        Some(kind) => assert_kind(r, kind),
    }
}

async fn run_one(runner: &Runner, i: usize) {
    let (code, limits, expected) = case(i);
    let mut vars = Map::new();
    vars.insert("n".into(), json!(i));
    let r = runner.run_with(code, vars, &limits).await;
    check(i, &r, expected);
}

async fn concurrent(runner: &Runner, total: usize, width: usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..width)
        .map(|_| {
            let runner = runner.clone();
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    run_one(&runner, i).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("a worker panicked: a run failed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sequential_and_a_thousand_concurrent_runs() {
    let runner = runner(ToolPolicy::new().namespace("math"), Limits::default());
    // Warm up with the same shapes as the load, so the baseline holds what a steady state
    // legitimately keeps (compiled guest, warm pooling slots, the runtime's threads).
    concurrent(&runner, 400, 16).await;
    for i in 0..200 {
        run_one(&runner, i).await;
    }
    let baseline = Snapshot::take();

    for i in 0..10_000 {
        run_one(&runner, i).await;
    }
    concurrent(&runner, 1_000, 16).await;

    // Give deferred cleanup (pooling decommits, tokio tasks) a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = Snapshot::take();
    println!("baseline {baseline:?}\nafter    {after:?}");
    assert!(
        after.rss <= baseline.rss + (32 << 20),
        "private resident memory grew from {} MiB to {} MiB (shared: {} MiB to {} MiB)",
        baseline.rss >> 20,
        after.rss >> 20,
        baseline.shared >> 20,
        after.shared >> 20
    );
    assert!(
        after.fds <= baseline.fds + 2,
        "file descriptors leaked: {baseline:?} -> {after:?}"
    );
    assert_eq!(after.children, 0, "child processes left behind");
    assert!(
        after.threads <= baseline.threads + 2,
        "threads leaked: {baseline:?} -> {after:?}"
    );
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    rss: u64,
    shared: u64,
    fds: usize,
    threads: usize,
    children: usize,
}

impl Snapshot {
    /// Resident memory is counted as `RssAnon`: the process's private pages, where a leaked
    /// instance, buffer or task would stay. Two things that are not leaks are left out.
    /// Each pooling slot maps the guest's memory image (a memfd), and its pages count in the
    /// total resident size once per slot that ever ran: measured here, the total grew 15-80 MiB
    /// over this load as more slots were used, ~3.3 MiB per slot, all of it one shared copy
    /// (`RssShmem`). And freed memory that glibc keeps in its per-thread arenas counts as
    /// resident until trimmed (a process that compiled the guest itself grew 62 MiB with the
    /// default arenas, 10 MiB with one), so it is handed back to the system first.
    fn take() -> Snapshot {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `malloc_trim` only returns free memory to the system; it is thread-safe.
        unsafe {
            libc::malloc_trim(0);
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kib = |field: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(field)).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        let rss = kib("RssAnon:");
        let shared = kib("RssShmem:");
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
        let tasks: Vec<_> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .collect();
        let children = tasks
            .iter()
            .map(|t| std::fs::read_to_string(t.path().join("children")).unwrap_or_default())
            .map(|c| c.split_whitespace().count())
            .sum();
        Snapshot {
            rss,
            shared,
            fds,
            threads: tasks.len(),
            children,
        }
    }
}

//! Faults of the OS sandboxes themselves: a missing interpreter, a missing image, and the
//! Docker daemon stopping in the middle of a run. Each is a clear, typed error, nothing is left
//! behind, and the host keeps serving.
//!
//! This file is its own test binary: stopping the Docker daemon must not overlap other Docker
//! tests, and cargo runs test binaries one at a time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

#[path = "os_support/mod.rs"]
mod os_support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pycage::{Availability, Backend, BubblewrapBackend, DockerBackend, ErrorKind, Limits, Runner};
use serde_json::json;

fn runner(backend: Arc<dyn Backend>) -> Runner {
    Runner::builder()
        .backend(backend)
        .build()
        .expect("runner builds")
}

#[tokio::test]
async fn a_missing_interpreter_is_unavailable_and_a_run_fails_cleanly() {
    if os_support::subject("bubblewrap").is_none() {
        return;
    }
    let backend = BubblewrapBackend::with_interpreter("/nonexistent/python3");
    let why = match backend.availability() {
        Availability::Unavailable(why) => why,
        Availability::Available => {
            panic!("a missing interpreter must make the backend unavailable")
        }
    };
    assert!(why.reason().contains("missing"), "{why}");
    assert_eq!(why.kind(), pycage::UnavailableKind::Missing);
    let r = runner(Arc::new(backend)).run("return 1").await;
    assert!(!r.ok);
    assert_eq!(
        r.error.as_ref().unwrap().kind,
        ErrorKind::BackendError,
        "{r:#?}"
    );
    let good = runner(Arc::new(BubblewrapBackend::new()))
        .run("return 1")
        .await;
    assert_eq!(good.value, json!(1), "{good:#?}");
}

#[tokio::test]
async fn a_missing_image_is_unavailable_and_a_run_fails_cleanly() {
    if os_support::subject("docker").is_none() {
        return;
    }
    let backend = DockerBackend::with_image("pycage-no-such-image:never");
    match backend.availability() {
        Availability::Unavailable(why) => {
            assert!(why.reason().contains("image absent"), "{why}");
            assert_eq!(why.kind(), pycage::UnavailableKind::Missing);
        }
        Availability::Available => panic!("a missing image must make the backend unavailable"),
    }
    let r = runner(Arc::new(backend)).run("return 1").await;
    assert!(!r.ok);
    assert_eq!(
        r.error.as_ref().unwrap().kind,
        ErrorKind::BackendError,
        "{r:#?}"
    );
}

/// Stops the Docker daemon while a run sleeps in its container, then brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_daemon_stopping_mid_run() {
    if os_support::subject("docker").is_none() {
        return;
    }
    if !is_root() {
        os_support::skip("only root may stop and restart the Docker daemon here");
        return;
    }
    let limits = Limits::builder()
        .wall_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let runner = runner(Arc::new(DockerBackend::new()));
    let run = {
        let runner = runner.clone();
        tokio::spawn(async move {
            runner
                .run_with(
                    "import time\ntime.sleep(15)\nreturn 'finished'",
                    Default::default(),
                    &limits,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let stopped = Command::new("/usr/bin/pkill")
        .args(["-TERM", "-x", "dockerd"])
        .status()
        .unwrap();
    assert!(stopped.success(), "no dockerd to stop");
    let r = run.await.unwrap();
    let took = started.elapsed();
    println!("with the daemon gone: {r:?} after {took:?}");
    restart_dockerd();
    assert!(!r.ok, "a run cannot finish without its daemon: {r:#?}");
    assert!(took < Duration::from_secs(25), "returned after {took:?}");
    let kind = r.error.as_ref().unwrap().kind;
    assert_eq!(kind, ErrorKind::BackendError, "{r:#?}");
    // The host serves on, with the daemon back.
    let good = runner.run("return 2").await;
    assert_eq!(good.value, json!(2), "{good:#?}");
}

fn restart_dockerd() {
    // The stopped daemon shuts down its containers first; a new one cannot start until it has
    // gone and taken its pid file with it.
    let until = Instant::now() + Duration::from_secs(60);
    while Command::new("/usr/bin/pgrep")
        .args(["-x", "dockerd"])
        .status()
        .is_ok_and(|s| s.success())
        || std::path::Path::new("/var/run/docker.pid").exists()
    {
        assert!(
            Instant::now() < until,
            "the stopped Docker daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/dockerd");
    let started = Command::new(script).status().is_ok_and(|s| s.success());
    assert!(started, "the Docker daemon did not come back");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
}

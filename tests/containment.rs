//! Hostile resource use against each OS backend available here: fork bombs, CPU loops,
//! memory bombs, output floods and escaping daemons are contained by the backend's limits,
//! the run returns within its wall limit plus a margin, and nothing is left behind: no
//! process, no cgroup, no container.
//!
//! The backends run one at a time (a lock), so the leftover checks see only their own run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod common;
mod os_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::assert_kind;
use os_support::{Subject, subject};
use pycage::os::cgroup::{self, CgroupSupport};
use pycage::os::rlimits::MAX_PROCESSES;
use pycage::{ErrorKind, Limits, RunResult, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::json;

/// What the sandboxed processes' command lines contain (the guest script, the layered worker).
const MARKERS: &[&str] = &["pycage_socket.py", "/run/pycage-bin/pycage"];

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The command lines of live processes that belong to a sandboxed run.
fn sandboxed_processes() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            MARKERS
                .iter()
                .any(|m| cmdline.contains(m))
                .then(|| format!("{}: {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Run cgroups that still exist.
fn leftover_cgroups() -> Vec<PathBuf> {
    let bases: Vec<PathBuf> = match cgroup::support() {
        Ok(CgroupSupport::V2 { base }) => vec![base.clone()],
        Ok(CgroupSupport::V1 {
            pids,
            memory,
            unified,
        }) => [Some(pids), Some(memory), unified.as_ref()]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
        Err(_) => Vec::new(),
    };
    bases
        .iter()
        .filter_map(|b| std::fs::read_dir(b).ok())
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("run-"))
        .map(|e| e.path())
        .collect()
}

/// Containers of pycage runs, running or not.
fn leftover_containers() -> Vec<String> {
    let Ok(out) = std::process::Command::new(pycage::os::docker::DOCKER)
        .args([
            "ps",
            "-a",
            "--filter",
            "name=pycage-",
            "--format",
            "{{.Names}}",
        ])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Nothing of a run is left: processes and cgroups are gone when the run returns; the check
/// allows a short moment for the kernel to tear down killed namespaces.
async fn assert_nothing_left(s: &Subject, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let procs = sandboxed_processes();
        let cgroups = leftover_cgroups();
        let containers = if s.name == "docker" {
            leftover_containers()
        } else {
            Vec::new()
        };
        if procs.is_empty() && cgroups.is_empty() && containers.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {what} left behind processes {procs:?}, cgroups {cgroups:?}, containers {containers:?}",
            s.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// True when the whole process tree's process count is capped here (a cgroup, or Docker's
/// `--pids-limit`); without one, a fork bomb run by root is not contained by rlimits.
fn tree_is_capped(s: &Subject) -> bool {
    s.name == "docker" || cgroup::support().is_ok()
}

fn running_as_root() -> bool {
    #[cfg(unix)]
    return std::fs::metadata("/proc/self")
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    #[cfg(not(unix))]
    return false;
}

/// Runs `code` with `limits`, checks the time it took, then that nothing is left.
async fn contained(s: &Subject, what: &str, code: &str, limits: Limits) -> RunResult {
    let wall = limits.wall_timeout();
    let runner = s.runner(ToolRegistry::with_builtins(), ToolPolicy::new(), limits);
    let started = Instant::now();
    let r = runner.run(code).await;
    let took = started.elapsed();
    assert!(
        took < wall + s.timeout_margin(),
        "{}: {what} took {took:?} with a wall limit of {wall:?}",
        s.name
    );
    assert_nothing_left(s, what).await;
    r
}

fn wall(secs: u64) -> Limits {
    Limits::builder()
        .wall_timeout(Duration::from_secs(secs))
        .build()
        .unwrap()
}

/// Counts, on a thread of its own, the interpreter processes that appeared after it started,
/// and keeps the peak. It reads `/proc/<pid>/stat` only: reading a forking process's
/// `cmdline` waits for its memory map and would stall the sampler (and the test) for seconds.
struct PeakSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl PeakSampler {
    fn start() -> PeakSampler {
        let before: std::collections::HashSet<u32> = interpreters().into_iter().collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let now = interpreters()
                    .into_iter()
                    .filter(|p| !before.contains(p))
                    .count();
                peak = peak.max(now);
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        PeakSampler { stop, thread }
    }

    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The pids of live Python interpreters (by their `comm`).
fn interpreters() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains("(python3") && !stat.contains(") Z "))
        })
        .collect()
}

const FORK_BOMB: &str =
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";

async fn fork_bomb(s: &Subject) {
    if s.native() && !tree_is_capped(s) && running_as_root() {
        os_support::skip(&format!(
            "{}: no cgroup here and running as root: a fork bomb would not be contained",
            s.name
        ));
        return;
    }
    let sampler = PeakSampler::start();
    let r = contained(s, "a fork bomb", FORK_BOMB, wall(3)).await;
    let peak = sampler.stop();
    eprintln!(
        "{}: the fork bomb peaked at {peak} new interpreter processes",
        s.name
    );
    if s.native() {
        assert_kind(&r, ErrorKind::Timeout);
        assert!(
            peak <= MAX_PROCESSES as usize,
            "{}: the fork bomb reached {peak} processes",
            s.name
        );
    } else {
        // The wasm guest has no fork at all.
        assert_kind(&r, ErrorKind::GuestException);
        assert!(r.error.unwrap().message.contains("fork"));
    }
}

async fn cpu_loop(s: &Subject) {
    let r = contained(s, "a CPU loop", "while True:\n    pass", wall(2)).await;
    assert_kind(&r, ErrorKind::Timeout);
    assert!(r.timed_out);
}

async fn memory_bombs(s: &Subject) {
    // 8 GiB for a 64-bit interpreter; the wasm guest's 32-bit index tops out below 2 GiB.
    let huge = if s.native() {
        "b = bytearray(8 << 30)"
    } else {
        "b = bytearray(1 << 30)"
    };
    let r = contained(s, "one huge allocation", huge, wall(10)).await;
    assert_kind(&r, ErrorKind::MemoryLimit);
    let r = contained(
        s,
        "a growing allocation",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 << 20))",
        wall(10),
    )
    .await;
    assert_kind(&r, ErrorKind::MemoryLimit);
    // Many small objects: describing the failure needs memory too; it is still reported.
    let r = contained(
        s,
        "many small objects",
        "objs = []\nwhile True:\n    objs.append({'i': len(objs), 's': str(len(objs))})",
        wall(20),
    )
    .await;
    assert_kind(&r, ErrorKind::MemoryLimit);
    // Still usable afterwards, within the limit.
    let r = contained(
        s,
        "a fair allocation",
        "return len(bytearray(100 << 20))",
        wall(10),
    )
    .await;
    assert_eq!(r.value, json!(100 << 20), "{r:#?}");
}

/// Children that each stay under the per-process address-space limit but together exceed
/// the memory limit: only a cap on the whole tree stops them.
async fn memory_bomb_across_processes(s: &Subject) {
    if !s.native() || !tree_is_capped(s) {
        eprintln!("{}: no tree-wide memory cap to test", s.name);
        return;
    }
    let code = "import os, time\npids = []\nfor _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n        try:\n            b = bytearray(180 << 20)\n            for i in range(0, len(b), 4096):\n                b[i] = 1\n            time.sleep(0.5)\n        finally:\n            os._exit(0)\n    pids.append(pid)\nreturn [os.waitpid(p, 0)[1] for p in pids]";
    let r = contained(s, "a memory bomb across processes", code, wall(20)).await;
    assert!(r.ok, "{r:#?}");
    let statuses: Vec<i64> = serde_json::from_value(r.value).unwrap();
    // A child killed by SIGKILL (the out-of-memory killer) has status 9.
    assert!(
        statuses.contains(&9),
        "{}: 6 x 180 MiB ran under a 256 MiB cap: {statuses:?}",
        s.name
    );
}

async fn output_flood(s: &Subject) {
    let limits = Limits::builder()
        .wall_timeout(Duration::from_secs(2))
        .max_output_bytes(1024)
        .build()
        .unwrap();
    for code in [
        "while True:\n    print('x' * 1000)",
        "import os\nwhile True:\n    os.write(1, b'y' * 65536)\n    os.write(2, b'z' * 65536)",
    ] {
        let r = contained(s, "an output flood", code, limits.clone()).await;
        assert_kind(&r, ErrorKind::Timeout);
        assert!(r.stdout_truncated, "{}: {code}", s.name);
        let marker = r.stdout.find("\n[...").expect("a cut marker");
        let marker_len = r.stdout[marker..].find("]\n").unwrap() + 2;
        assert!(r.stdout.len() - marker_len <= 1024);
        assert!(r.stderr.len() <= 1024 + 64);
    }
}

async fn escaping_daemon(s: &Subject) {
    if !s.native() {
        return;
    }
    // A grandchild in a session of its own, outliving its parents.
    let code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\ntime.sleep(0.3)\nreturn 'parent done'";
    if s.name == "local" && cgroup::support().is_err() {
        os_support::skip("local: no cgroup here: a daemon escapes the process group");
        return;
    }
    let r = contained(s, "an escaping daemon", code, wall(5)).await;
    assert_eq!(r.value, json!("parent done"), "{r:#?}");
}

macro_rules! containment {
    ($($module:ident => $name:literal),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $module() {
            let Some(s) = subject($name) else { return };
            let _one = ONE_AT_A_TIME.lock().await;
            assert_nothing_left(&s, "an earlier test").await;
            fork_bomb(&s).await;
            cpu_loop(&s).await;
            memory_bombs(&s).await;
            memory_bomb_across_processes(&s).await;
            output_flood(&s).await;
            escaping_daemon(&s).await;
        }
    )*};
}

containment! {
    bubblewrap => "bubblewrap",
    docker => "docker",
    local => "local",
    layered => "wasm+bubblewrap",
}

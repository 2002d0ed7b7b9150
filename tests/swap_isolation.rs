//! A run never sees what an earlier run wrote, even when the host swaps that memory out.
//!
//! wasmtime 48's in-place slot reset skips written pages that are in swap, so the next guest
//! in the slot read them back (before the fix: a trap, then 11 of 288 changed module
//! dictionaries visible to a later run). These tests make the hazard happen on purpose: a
//! swap file, and a tool that pushes the process's memory out to it (`MADV_PAGEOUT`) while
//! the guest waits on the call. They need root (swapon); elsewhere they say so and pass,
//! except where a skip must fail (`PYCAGE_REQUIRE_BACKENDS` or `CI` set, as `.ci/run` does).
#![cfg(all(target_os = "linux", target_env = "gnu"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod os_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use pycage::{Runner, ToolPolicy, WasmBackend};
use pycage_tools::ToolRegistry;
use serde_json::json;

/// Changes every module's `__doc__` in place (the dictionaries live in the guest's heap
/// snapshot).
const MARK: &str = r#"
import sys
marked = 0
for m in list(sys.modules.values()):
    d = getattr(m, '__dict__', None)
    if isinstance(d, dict) and '__doc__' in d:
        d['__doc__'] = 200
        marked += 1
"#;

/// Run A is [`MARK`] and then this: the host pages everything out while the run waits.
const PAGE_OUT: &str = r#"
swapped = (await pageout())["swapped_kib"]
return [marked, swapped]
"#;

/// A later run: how many modules still carry run A's change.
const CHECK: &str = r#"
import sys
return sum(1 for m in list(sys.modules.values())
           if isinstance(getattr(m, '__dict__', None), dict) and m.__dict__.get('__doc__') == 200)
"#;

/// A swap file switched on for the test's lifetime.
struct SwapFile(PathBuf);

impl SwapFile {
    /// `None` (with the reason printed) where this host will not let the test add swap.
    fn on() -> Option<SwapFile> {
        if !is_root() {
            skip("adding swap needs root");
            return None;
        }
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pycage-test.swap");
        let _ = Command::new("swapoff").arg(&path).output();
        // Written, not `fallocate`d: swapon refuses files with holes on some filesystems.
        std::fs::write(&path, vec![0u8; 256 << 20]).expect("writing the swap file");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let made = Command::new("mkswap").arg(&path).output();
        let on = Command::new("swapon").arg(&path).output();
        match (made, on) {
            (Ok(m), Ok(o)) if m.status.success() && o.status.success() => Some(SwapFile(path)),
            (m, o) => {
                let _ = std::fs::remove_file(&path);
                skip(&format!("this host refused a swap file: {m:?} {o:?}"));
                None
            }
        }
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let off = Command::new("swapoff").arg(&self.0).status();
        assert!(
            off.is_ok_and(|s| s.success()),
            "swapoff {} failed",
            self.0.display()
        );
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Says why the hazard could not be staged; a failure where skips are not allowed.
fn skip(why: &str) {
    assert!(
        !os_support::required(),
        "swap isolation could not be tested here: {why}"
    );
    eprintln!("SKIPPED: {why}");
}

fn is_root() -> bool {
    // SAFETY: `geteuid` has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// Pushes every writable page of this process out to swap; returns the process's swapped
/// KiB afterwards.
fn page_out_everything() -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let a = usize::from_str_radix(a, 16).unwrap();
        let b = usize::from_str_radix(b, 16).unwrap();
        // SAFETY: advice only; MADV_PAGEOUT never changes what the memory reads as.
        unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_PAGEOUT);
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmSwap:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn runner(backend: &WasmBackend) -> Runner {
    let mut tools = ToolRegistry::new();
    tools
        .register_fn(
            "t",
            "pageout",
            "Pages the host process out to swap",
            json!({"type": "object"}),
            |_| async { Ok(json!({"swapped_kib": page_out_everything()})) },
        )
        .unwrap();
    Runner::builder()
        .backend(Arc::new(backend.clone()))
        .tools(tools)
        .policy(ToolPolicy::new().namespace("t"))
        .build()
        .unwrap()
}

/// Run A marks and is paged out; the next runs (one slot, so the same one while it is
/// recycled) must start from the snapshot.
async fn mark_page_out_and_check(runner: &Runner) {
    let a = runner.run(&format!("{MARK}{PAGE_OUT}")).await;
    assert!(a.ok, "{a:#?}");
    let (marked, swapped) = (a.value[0].as_u64().unwrap(), a.value[1].as_u64().unwrap());
    assert!(marked > 100, "run A marked only {marked} modules");
    assert!(swapped > 0, "nothing went to swap: this test saw no hazard");
    for _ in 0..3 {
        let b = runner.run(CHECK).await;
        assert!(b.ok, "a run after a paged-out run failed: {b:#?}");
        assert_eq!(b.value, json!(0), "a run saw an earlier run's writes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_never_read_an_earlier_runs_swapped_out_pages() {
    // Swap turned on after the engine started: the engine that reset its slots in place
    // must not recycle them any more.
    if host_has_swap() {
        eprintln!("SKIPPED (swap turned on later): this host already swaps");
    } else {
        let backend = WasmBackend::builder().max_instances(1).build().unwrap();
        let runner = runner(&backend);
        let warm = runner.run("return 1").await;
        assert!(warm.ok, "{warm:#?}");
        let Some(_swap) = SwapFile::on() else { return };
        mark_page_out_and_check(&runner).await;
        assert!(!backend.resets_slots_in_place());
    }

    // Swap on before the engine starts.
    let _swap = if host_has_swap() {
        None
    } else {
        SwapFile::on()
    };
    if !host_has_swap() {
        return;
    }
    let backend = WasmBackend::builder().max_instances(1).build().unwrap();
    assert!(!backend.resets_slots_in_place());
    mark_page_out_and_check(&runner(&backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_told_to_release_its_slots_releases_them() {
    let backend = WasmBackend::builder()
        .max_instances(1)
        .reset_slots_in_place(false)
        .build()
        .unwrap();
    assert!(!backend.resets_slots_in_place());
    let runner = runner(&backend);
    let a = runner.run(&format!("{MARK}\nreturn marked")).await;
    assert!(a.ok && a.value.as_u64().unwrap() > 100, "{a:#?}");
    for _ in 0..2 {
        let b = runner.run(CHECK).await;
        assert!(b.ok, "{b:#?}");
        assert_eq!(b.value, json!(0), "a run saw an earlier run's writes");
    }
}

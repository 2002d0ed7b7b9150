//! A guest other than the built-in one: a guest file (a component and its manifest) runs
//! through the library and the CLI, its artifact cached under its own digest, and a file that
//! is corrupted, foreign or built by another pycage is refused with a message that says so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use pycage::wasm::guest::{GuestManifest, Package, seal};
use pycage::{Guest, Runner, WasmBackend};
use serde_json::json;

/// The built-in guest's component, sealed as a guest file with a manifest of this pycage.
fn sealed_builtin(pycage_version: Option<&str>) -> Vec<u8> {
    let component = Guest::builtin().bytes().to_vec();
    let mut manifest = GuestManifest::new(
        &component,
        "3.14.0",
        vec![Package::new("example", "1.0", "00".repeat(32))],
        vec![],
    );
    if let Some(v) = pycage_version {
        manifest.pycage = v.into();
    }
    seal(&component, &manifest).unwrap()
}

fn pycage(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(args)
        .env("PYCAGE_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_guest_file_runs_and_is_cached_under_its_own_digest() {
    let dir = tempfile::tempdir().unwrap();
    let guest = Guest::from_bytes(sealed_builtin(None)).unwrap();
    assert_eq!(guest.manifest().unwrap().packages[0].name, "example");
    let backend = WasmBackend::builder()
        .cache_dir(Some(dir.path().to_owned()))
        .guest(guest.clone())
        .build()
        .unwrap();
    let builtin = WasmBackend::builder()
        .cache_dir(Some(dir.path().to_owned()))
        .build()
        .unwrap();
    assert_ne!(backend.artifact_path(), builtin.artifact_path());
    assert!(
        backend
            .artifact_path()
            .unwrap()
            .to_string_lossy()
            .contains(&guest.digest()[..16]),
        "{:?}",
        backend.artifact_path()
    );
    let runner = Runner::builder()
        .backend(Arc::new(backend.clone()))
        .build()
        .unwrap();
    let r = runner.run("import json\nreturn json.loads('[1, 2]')").await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!([1, 2]));
    assert!(backend.is_cached());
    assert!(backend.artifact_path().unwrap().exists());
    assert_eq!(backend.guest().digest(), guest.digest());
}

#[test]
fn the_cli_runs_a_guest_file_and_refuses_a_bad_one_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.wasm");
    std::fs::write(&good, sealed_builtin(None)).unwrap();
    let out = pycage(
        &[
            "run",
            "--guest",
            good.to_str().unwrap(),
            "-c",
            "return 6 * 7",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");

    let mut bytes = sealed_builtin(None);
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    let corrupted = dir.path().join("corrupted.wasm");
    std::fs::write(&corrupted, bytes).unwrap();
    let old = dir.path().join("old.wasm");
    std::fs::write(&old, sealed_builtin(Some("0.0.1"))).unwrap();
    let foreign = dir.path().join("foreign.wasm");
    std::fs::write(&foreign, b"\0asm\x01\x00\x00\x00").unwrap();
    for (file, says) in [
        (&corrupted, "the guest is corrupted"),
        (&old, "built by pycage 0.0.1"),
        (&foreign, "not a pycage guest"),
    ] {
        let out = pycage(
            &["run", "--guest", file.to_str().unwrap(), "-c", "return 1"],
            dir.path(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(out.stdout.is_empty(), "{says}: nothing ran");
    }
    // A guest needs the wasm backend.
    let out = pycage(
        &[
            "run",
            "--guest",
            good.to_str().unwrap(),
            "--backend",
            "bubblewrap",
            "-c",
            "return 1",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--guest needs the wasm backend"));
}

//! `pycage prepare`: it writes the compiled guest where a later process finds it, keeps an
//! artifact that checks out, compiles a corrupt one again, and a server started on the
//! prepared directory says it loaded the artifact instead of compiling.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn prepare(dir: &Path) -> (PathBuf, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["prepare", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(path.parent(), Some(dir), "{stderr}");
    (path, stderr)
}

#[test]
fn prepare_writes_the_artifact_keeps_a_good_one_and_rebuilds_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let (path, said) = prepare(dir.path());
    assert!(
        said.contains("compiled the guest and cached the artifact"),
        "{said}"
    );
    let compiled = std::fs::read(&path).unwrap();
    assert!(compiled.len() > 1 << 20, "{} bytes", compiled.len());

    let (again, said) = prepare(dir.path());
    assert_eq!(again, path);
    assert!(said.contains("loaded the prepared artifact"), "{said}");

    // One byte changed (same size): the checksum no longer matches, so it is compiled again
    // instead of being handed to the engine.
    let mut corrupt = compiled.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    std::fs::write(&path, &corrupt).unwrap();
    let (_, said) = prepare(dir.path());
    assert!(
        said.contains("compiled the guest and cached the artifact"),
        "{said}"
    );
    assert_eq!(std::fs::read(&path).unwrap().len(), compiled.len());
    assert_ne!(std::fs::read(&path).unwrap()[middle], corrupt[middle]);

    // A server on the prepared directory loads it before it serves (`pycage mcp` on stdio
    // ends at the end of its input).
    let out = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .arg("mcp")
        .env("PYCAGE_CACHE_DIR", dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pycage: the sandbox: loaded the prepared artifact"),
        "{stderr}"
    );
    assert!(!stderr.contains("compiling"), "{stderr}");
}

#[test]
fn prepare_without_a_cache_directory_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .arg("prepare")
        .env("PYCAGE_CACHE_DIR", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out DIR"));
}

use std::ffi::OsStr;

use super::*;

/// The Python that makes virtualenvs, as the build picks it.
fn python() -> std::ffi::OsString {
    std::env::var_os("PYCAGE_PYTHON").unwrap_or_else(|| "python3".into())
}

#[test]
fn the_lock_pins_one_version_by_the_hash_of_every_wheel() {
    let requirement: Vec<&str> = LOCK
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(requirement[0], format!("{COMPONENTIZE_PY} \\"));
    let hashes: Vec<&str> = requirement[1..]
        .iter()
        .map(|l| l.trim().trim_end_matches(" \\"))
        .collect();
    // Linux x86_64 and aarch64, macOS x86_64 and arm64, Windows x86_64.
    assert_eq!(hashes.len(), 5, "{hashes:?}");
    for h in hashes {
        let hex = h.strip_prefix("--hash=sha256:").expect("a sha256 hash");
        assert!(
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{h}"
        );
    }
}

/// pip downloads componentize-py's wheel (about 20 MB) and refuses it: its hash is not the
/// one in the (tampered) lock. No toolchain results, and the error says which step failed.
#[test]
fn a_wheel_whose_hash_is_not_in_the_lock_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = "0".repeat(64);
    let tampered = format!("{COMPONENTIZE_PY} --hash=sha256:{zeros}\n");
    let err = Toolchain::install(dir.path(), OsStr::new(&python()), &tampered, |_| {})
        .expect_err("a wrong hash must fail the install");
    assert!(err.message().contains("--require-hashes"), "{err}");
    // pip's own words for a hash mismatch: it got the wheel, and refused it.
    assert!(err.message().contains("DO NOT MATCH THE HASHES"), "{err}");
    assert!(!dir.path().join("pycage-installed.lock").exists());
    assert!(!dir.path().join("bin/componentize-py").exists());
}

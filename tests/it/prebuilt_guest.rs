//! The prebuilt default guest (`guest-default/`): that it was built from the sources in this
//! checkout, that the runtime and the guest agree on one WIT contract, and that a corrupted
//! component fails the build with a message naming the file.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// componentize-py's output is not reproducible, so the prebuilt component is tied to its
/// sources by their digest: any change to the guest's Python, its WIT or the builder without
/// a rebuilt component fails here.
#[test]
fn the_prebuilt_guest_was_built_from_these_sources() {
    assert_eq!(
        pycage_guest::inputs_digest(),
        pycage_guest_default::INPUTS_DIGEST,
        "the guest's sources changed since guest-default/pycage-guest.wasm.xz was built: \
         run scripts/guest-prebuilt and commit the two files it writes"
    );
}

#[test]
fn the_runtime_and_the_guest_are_built_from_one_contract() {
    let runtime = fs::read_to_string(repo().join("runtime/wit/pycage.wit")).unwrap();
    assert_eq!(
        runtime.replace("\r\n", "\n"),
        pycage_guest_default::WIT.replace("\r\n", "\n"),
        "runtime/wit/pycage.wit (the host's bindings) and guest-default/wit/pycage.wit (the \
         guest's build) differ: change both"
    );
}

/// `guest-default` alone, in a workspace of its own under the test's temporary directory (its
/// manifest inherits the real workspace's package fields and lints).
fn guest_default_copy(root: &Path) {
    let _ = fs::remove_dir_all(root.join("guest-default"));
    let src = repo().join("guest-default");
    for dir in ["", "src", "python", "wit"] {
        fs::create_dir_all(root.join("guest-default").join(dir)).unwrap();
        for entry in fs::read_dir(src.join(dir)).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                fs::copy(
                    entry.path(),
                    root.join("guest-default").join(dir).join(entry.file_name()),
                )
                .unwrap();
            }
        }
    }
    let manifest: toml::Table = fs::read_to_string(repo().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let workspace = manifest["workspace"].as_table().unwrap();
    let mut own = toml::Table::new();
    own.insert(
        "members".into(),
        toml::Value::Array(vec!["guest-default".into()]),
    );
    own.insert("resolver".into(), "2".into());
    for key in ["package", "lints"] {
        own.insert(key.into(), workspace[key].clone());
    }
    let mut root_manifest = toml::Table::new();
    root_manifest.insert("workspace".into(), toml::Value::Table(own));
    fs::write(
        root.join("Cargo.toml"),
        toml::to_string(&root_manifest).unwrap(),
    )
    .unwrap();
    fs::copy(repo().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
}

fn build(root: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--offline",
            "--quiet",
            "-p",
            "pycage-guest-default",
        ])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_corrupted_prebuilt_guest_fails_the_build_naming_the_file() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prebuilt-guest");
    fs::create_dir_all(&root).unwrap();

    // As committed, it builds.
    guest_default_copy(&root);
    let (ok, stderr) = build(&root);
    assert!(ok, "the committed prebuilt guest does not build: {stderr}");

    // A flipped byte in the compressed file: xz's own check finds it.
    let xz = root.join("guest-default/pycage-guest.wasm.xz");
    let mut bytes = fs::read(&xz).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    fs::write(&xz, &bytes).unwrap();
    let (ok, stderr) = build(&root);
    assert!(!ok, "a corrupted component built");
    assert!(
        stderr.contains("pycage-guest.wasm.xz is corrupted"),
        "the error does not name the file: {stderr}"
    );

    // An intact file whose component is not the committed one: the digest check finds it.
    guest_default_copy(&root);
    let digests = root.join("guest-default/pycage-guest.blake3");
    let text = fs::read_to_string(&digests).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("component = "))
        .unwrap();
    let other = format!("component = {}", "0".repeat(64));
    fs::write(&digests, text.replace(line, &other)).unwrap();
    let (ok, stderr) = build(&root);
    assert!(!ok, "a component with another digest built");
    assert!(
        stderr.contains("pycage-guest.wasm.xz does not hold the committed guest")
            && stderr.contains(&"0".repeat(64)),
        "the error does not name the file and the digest: {stderr}"
    );
}

/// The switch back to a build from source works, and gives the prebuilt component again
/// everywhere outside its heap snapshot (which componentize-py does not reproduce; see
/// `pycage_guest::compare_outside_snapshot`). Needs Python 3 with `venv`, and the package
/// index the first time (scripts/setup provides both).
#[test]
fn the_guest_built_from_source_is_the_prebuilt_one_outside_its_snapshot() {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let python = std::env::var_os("PYCAGE_PYTHON").unwrap_or_else(|| "python3".into());
    let toolchain =
        pycage_guest::Toolchain::ensure(&target.join("../pycage-guest/venv"), &python, |what| {
            eprintln!("{what}")
        })
        .unwrap();
    let built = pycage_guest::build_default(&toolchain, &target.join("guest-from-source")).unwrap();
    pycage_guest::compare_outside_snapshot(&built, pycage_guest_default::COMPONENT).unwrap_or_else(
        |e| panic!("the guest built from source is not the prebuilt one outside its snapshot: {e}"),
    );

    // The comparison is not blind: a byte of code changed is found.
    let mut changed = pycage_guest_default::COMPONENT.to_vec();
    let code = wasm_code_byte(&changed);
    changed[code] ^= 1;
    assert!(pycage_guest::compare_outside_snapshot(&built, &changed).is_err());
}

/// The offset of a byte inside the first code section of `component`.
fn wasm_code_byte(component: &[u8]) -> usize {
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        if let wasmparser::Payload::CodeSectionStart { range, .. } = payload.unwrap() {
            return range.start + range.len() / 2;
        }
    }
    panic!("no code section")
}

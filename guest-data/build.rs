//! Checks each prebuilt wheel against its committed BLAKE3 digest and lists them for `lib.rs`.
//!
//! `wheels.blake3` has one line per wheel in `wheels/`: its BLAKE3 and its file name. A wheel
//! whose digest differs, or that the list does not name, fails the build, naming the file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a build script fails by panicking, with the message cargo shows"
)]

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let list = dir.join("wheels.blake3");
    let wheels = dir.join("wheels");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-changed={}", wheels.display());
    let text = fs::read_to_string(&list)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", list.display())));
    let mut named = Vec::new();
    let mut code = String::from("&[\n");
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let Some((digest, file)) = line.split_once("  ") else {
            fail(&format!("{}: not `DIGEST  FILE`: {line:?}", list.display()));
        };
        let path = wheels.join(file);
        let bytes =
            fs::read(&path).unwrap_or_else(|e| fail(&format!("reading {}: {e}", path.display())));
        let actual = blake3::hash(&bytes).to_hex();
        if actual.as_str() != digest {
            fail(&format!(
                "{} is not the committed wheel: its BLAKE3 is {actual}, {} says {digest}; \
                 restore it, or rebuild it with guest-data/recipe/build",
                path.display(),
                list.display()
            ));
        }
        println!("cargo:rerun-if-changed={}", path.display());
        writeln!(
            code,
            "    Wheel {{ file_name: {file:?}, blake3: {digest:?}, bytes: include_bytes!({:?}) }},",
            path.display().to_string()
        )
        .expect("writing to a String");
        named.push(file.to_owned());
    }
    code.push_str("]\n");
    for entry in fs::read_dir(&wheels)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", wheels.display())))
    {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        if !named.iter().any(|n| *n == name) {
            fail(&format!(
                "wheels/{name} is not listed in {}",
                list.display()
            ));
        }
    }
    fs::write(out.join("wheels.rs"), code)
        .unwrap_or_else(|e| fail(&format!("writing the wheel list: {e}")));
}

fn fail(message: &str) -> ! {
    panic!("pycage-guest-data: {message}");
}

//! Builds the Python guest component and embeds it in the library.
//!
//! By default this installs the pinned componentize-py into a private virtualenv under the
//! target directory (once, by version and hash: `guest-build/componentize-py.lock`), runs it
//! on `guest-python/` and `wit/`, and takes pycage's steps on its output
//! ([`pycage_guest::finish`]: the parser's nesting limit raised, the heap snapshot made
//! immortal, the guest's libraries linked into one core module). Setting `PYCAGE_COMPONENT`
//! to a prebuilt component skips all of that: it is used as it is. `PYCAGE_PYTHON` picks the
//! Python that creates the virtualenv (default `python3`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a build script fails by panicking, with the message cargo shows"
)]

use std::env;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use pycage_guest::{APP, GUEST_FILES, Toolchain, WORLD};

const ENV_COMPONENT: &str = "PYCAGE_COMPONENT";
const ENV_PYTHON: &str = "PYCAGE_PYTHON";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let guest_dir = root.join("guest-python");
    let wit_dir = root.join("wit");

    println!("cargo:rerun-if-env-changed={ENV_COMPONENT}");
    println!("cargo:rerun-if-env-changed={ENV_PYTHON}");
    println!("cargo:rerun-if-changed={}", wit_dir.display());
    for file in GUEST_FILES {
        println!("cargo:rerun-if-changed={}", guest_dir.join(file).display());
    }

    let component = out.join("pycage-guest.wasm");
    let bytes = match env::var_os(ENV_COMPONENT) {
        Some(prebuilt) => {
            println!("cargo:rerun-if-changed={}", Path::new(&prebuilt).display());
            fs::copy(&prebuilt, &component).unwrap_or_else(|e| {
                fail(&format!(
                    "{ENV_COMPONENT}={}: {e}",
                    Path::new(&prebuilt).display()
                ))
            });
            read_component(&component)
        }
        None => {
            build_component(&out, &guest_dir, &wit_dir, &component);
            // componentize-py's output, worked on in memory and written once.
            let bytes = pycage_guest::finish(&read_component(&component))
                .unwrap_or_else(|e| fail(e.message()));
            fs::write(&component, &bytes)
                .unwrap_or_else(|e| fail(&format!("writing component: {e}")));
            bytes
        }
    };

    let digest = blake3::hash(&bytes).to_hex().to_string();
    let mut f = fs::File::create(out.join("component_digest.rs")).expect("OUT_DIR is writable");
    writeln!(f, "/// BLAKE3 of the embedded guest component.").unwrap();
    writeln!(f, "pub const COMPONENT_DIGEST: &str = \"{digest}\";").unwrap();
}

fn build_component(out: &Path, guest_dir: &Path, wit_dir: &Path, component: &Path) {
    let venv = target_dir(out).join("pycage-guest").join("venv");
    let python = env::var_os(ENV_PYTHON).unwrap_or_else(|| OsString::from("python3"));
    let toolchain = Toolchain::ensure(&venv, &python, |what| {
        println!("cargo:warning={what}");
    })
    .unwrap_or_else(|e| fail(e.message()));

    // Build from a copy: componentize-py imports the app at build time, and the bytecode it
    // writes next to the sources would otherwise retrigger this build script.
    let src = out.join("guest-src");
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(&src).expect("OUT_DIR is writable");
    for file in GUEST_FILES {
        fs::copy(guest_dir.join(file), src.join(file))
            .unwrap_or_else(|e| fail(&format!("copying guest-python/{file}: {e}")));
    }
    // The guest sees no site-packages: an empty virtualenv stands in for the host's.
    let no_packages = out.join("no-packages");
    fs::create_dir_all(no_packages.join("lib").join("site-packages")).expect("OUT_DIR is writable");
    toolchain
        .componentize(wit_dir, WORLD, APP, &[&src], &no_packages, component)
        .unwrap_or_else(|e| fail(e.message()));
}

fn read_component(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| fail(&format!("reading component: {e}")))
}

/// `<target>/<profile>` from `<target>/<profile>/build/<pkg>-<hash>/out`.
fn target_dir(out: &Path) -> PathBuf {
    out.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.to_path_buf())
}

fn fail(message: &str) -> ! {
    eprintln!("error: building the pycage guest: {message}");
    eprintln!("hint: set {ENV_COMPONENT}=/path/to/pycage-guest.wasm to use a prebuilt component");
    std::process::exit(1);
}

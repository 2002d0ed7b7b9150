//! Chooses the guest component the library embeds.
//!
//! By default it is `pycage-guest-default`'s prebuilt component, and this script does
//! nothing: building pycage needs no Python. Two switches replace it:
//!
//! - `PYCAGE_COMPONENT=/path/to/guest.wasm`: that finished component, used as it is.
//! - the `guest-from-source` feature: the guest is built here from `pycage-guest-default`'s
//!   Python and WIT. This installs the pinned componentize-py into a private virtualenv under
//!   the target directory (once, by version and hash), runs it, and takes pycage's steps on
//!   its output ([`pycage_guest::finish`]). `PYCAGE_PYTHON` picks the Python that creates the
//!   virtualenv (default `python3`). `scripts/guest-prebuilt` builds this way to refresh the
//!   prebuilt component.
//!
//! Either switch sets `cfg(pycage_built_guest)`, and the library embeds
//! `$OUT_DIR/pycage-guest.wasm` instead.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a build script fails by panicking, with the message cargo shows"
)]

use std::env;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

const ENV_COMPONENT: &str = "PYCAGE_COMPONENT";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pycage_built_guest)");
    println!("cargo:rerun-if-env-changed={ENV_COMPONENT}");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    // The component, and for one built from source the digest of its inputs.
    let (bytes, inputs): (Vec<u8>, Option<String>) = match env::var_os(ENV_COMPONENT) {
        Some(given) => {
            println!("cargo:rerun-if-changed={}", Path::new(&given).display());
            let bytes = fs::read(&given).unwrap_or_else(|e| {
                fail(&format!(
                    "{ENV_COMPONENT}={}: {e}",
                    Path::new(&given).display()
                ))
            });
            (bytes, None)
        }
        #[cfg(feature = "guest-from-source")]
        None => (
            from_source::build(&out),
            Some(pycage_guest::inputs_digest()),
        ),
        #[cfg(not(feature = "guest-from-source"))]
        None => return,
    };
    fs::write(out.join("pycage-guest.wasm"), &bytes)
        .unwrap_or_else(|e| fail(&format!("writing component: {e}")));
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let mut f = fs::File::create(out.join("component_digest.rs")).expect("OUT_DIR is writable");
    writeln!(f, "/// BLAKE3 of the embedded guest component.").unwrap();
    writeln!(f, "pub const COMPONENT_DIGEST: &str = \"{digest}\";").unwrap();
    if let Some(inputs) = inputs {
        // What `scripts/guest-prebuilt` records beside the component it compresses.
        fs::write(
            out.join("pycage-guest.blake3"),
            format!("component = {digest}\ninputs = {inputs}\n"),
        )
        .expect("OUT_DIR is writable");
    }
    println!("cargo:rustc-cfg=pycage_built_guest");
}

#[cfg(feature = "guest-from-source")]
mod from_source {
    use std::env;
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    use pycage_guest::Toolchain;

    use super::fail;

    const ENV_PYTHON: &str = "PYCAGE_PYTHON";

    /// The finished component, built from the sources `pycage-guest` embeds (a change to
    /// them rebuilds that crate, and so reruns this script).
    pub fn build(out: &Path) -> Vec<u8> {
        println!("cargo:rerun-if-env-changed={ENV_PYTHON}");
        let venv = target_dir(out).join("pycage-guest").join("venv");
        let python = env::var_os(ENV_PYTHON).unwrap_or_else(|| OsString::from("python3"));
        let toolchain = Toolchain::ensure(&venv, &python, |what| {
            println!("cargo:warning={what}");
        })
        .unwrap_or_else(|e| fail(e.message()));
        pycage_guest::build_default(&toolchain, &out.join("guest-build"))
            .unwrap_or_else(|e| fail(e.message()))
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
}

fn fail(message: &str) -> ! {
    eprintln!("error: building the pycage guest: {message}");
    eprintln!("hint: without the `guest-from-source` feature, pycage uses its prebuilt guest");
    std::process::exit(1);
}

//! Decompresses the prebuilt guest component and checks it against its committed digest.
//!
//! `pycage-guest.wasm.xz` is the component `scripts/guest-prebuilt` built from `python/` and
//! `wit/`; `pycage-guest.blake3` holds the BLAKE3 of the decompressed component and of its
//! inputs. A component whose digest differs is not used: the build fails, naming the file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a build script fails by panicking, with the message cargo shows"
)]

use std::env;
use std::fs;
use std::io::Read;
use std::path::PathBuf;

const COMPRESSED: &str = "pycage-guest.wasm.xz";
const DIGESTS: &str = "pycage-guest.blake3";

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let compressed = dir.join(COMPRESSED);
    let digests = dir.join(DIGESTS);
    println!("cargo:rerun-if-changed={}", compressed.display());
    println!("cargo:rerun-if-changed={}", digests.display());

    let expected = fs::read_to_string(&digests)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", digests.display())));
    let [expected, inputs] = ["component", "inputs"].map(|name| {
        field(&expected, name)
            .unwrap_or_else(|| fail(&format!("{} has no `{name}` line", digests.display())))
    });
    let xz = fs::read(&compressed)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", compressed.display())));
    let mut component = Vec::new();
    lzma_rust2::XzReader::new(&xz[..], false)
        .read_to_end(&mut component)
        .unwrap_or_else(|e| {
            fail(&format!(
                "{} is corrupted (xz: {e}); restore it, or rebuild it with scripts/guest-prebuilt",
                compressed.display()
            ))
        });
    let actual = blake3::hash(&component).to_hex();
    if actual.as_str() != expected {
        fail(&format!(
            "{} does not hold the committed guest: its BLAKE3 is {actual}, {} says {expected}; \
             restore the file, or rebuild it with scripts/guest-prebuilt",
            compressed.display(),
            digests.display()
        ));
    }
    fs::write(out.join("pycage-guest.wasm"), &component)
        .unwrap_or_else(|e| fail(&format!("writing the component: {e}")));
    fs::write(
        out.join("digests.rs"),
        format!(
            "/// BLAKE3 of [`COMPONENT`], checked when this crate was built.\n\
             pub const COMPONENT_DIGEST: &str = \"{expected}\";\n\
             /// BLAKE3 of the inputs [`COMPONENT`] was built from (`pycage_guest::inputs_digest`).\n\
             pub const INPUTS_DIGEST: &str = \"{inputs}\";\n"
        ),
    )
    .unwrap_or_else(|e| fail(&format!("writing the digests: {e}")));
}

/// The value of `name = value` in the digests file.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == name).then(|| value.trim())
    })
}

fn fail(message: &str) -> ! {
    eprintln!("error: pycage's prebuilt guest: {message}");
    std::process::exit(1);
}

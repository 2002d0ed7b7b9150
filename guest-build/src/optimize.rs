//! binaryen's optimizer (`wasm-opt`), run over the default guest's linked module.
//!
//! componentize-py's libraries are compiled separately and linked at build time
//! (`crate::link`), so no compiler has seen CPython, libc and componentize-py's runtime
//! together: a call from the interpreter into a small libc or runtime function stays a call,
//! and every call costs a fuel or epoch check and a spill of what the caller keeps in
//! registers. `wasm-opt -O3` over the linked module inlines across those boundaries and
//! simplifies what that exposes, once, at build time. Measured side by side (release builds,
//! `pycage bench --only compute` and `--only fuel`, 2026-12-07): the compute case 152-163 ms
//! against 179-180 ms metered, 138-142 against 164-166 ms unmetered. Cranelift's own
//! inlining (`Config::compiler_inlining`) would do similar work in every host that compiles
//! the guest, at 23 s and 8 GB per compile (`runtime/src/wasm/engine.rs`); `wasm-opt` takes
//! about 20 s and 0.4 GB here, once per guest build.
//!
//! The linked module does not depend on the heap snapshot (two builds of the same sources give
//! the same module byte for byte; the snapshot lives in `main`), so its optimized form is
//! reproducible too, for one version of binaryen: the build requires [`WASM_OPT_VERSION`].

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, Result};

/// The binaryen release whose `wasm-opt` the default guest is built with (Debian bookworm's
/// `binaryen` package; `scripts/setup` installs it). Another release optimizes differently,
/// and the guest built from source would no longer be the prebuilt one.
pub const WASM_OPT_VERSION: &str = "108";

/// Where `wasm-opt` is looked for first: a path, for a binaryen outside `PATH`.
pub const ENV_WASM_OPT: &str = "PYCAGE_WASM_OPT";

/// The guest's features, named because binaryen 108 does not detect them (the linked module
/// has no `target_features` section), and nothing beyond them, so the optimizer introduces no
/// instruction the guest's engine would have to allow anew. `-g` keeps the function names
/// (profiles, `PYCAGE_PERFMAP`); it does not change the code.
const FLAGS: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-mutable-globals",
    "--enable-sign-ext",
    "--enable-nontrapping-float-to-int",
    "--enable-reference-types",
    "--enable-multivalue",
    "--enable-simd",
    "--enable-extended-const",
    "-O3",
    "-g",
];

/// A `wasm-opt` of [`WASM_OPT_VERSION`].
#[derive(Debug, Clone)]
pub struct Optimizer {
    wasm_opt: PathBuf,
}

impl Optimizer {
    /// `wasm-opt` from [`ENV_WASM_OPT`] if set, else from `PATH`.
    ///
    /// # Errors
    ///
    /// [`BuildError`] naming what was run when it does not run or is another release.
    pub fn find() -> Result<Optimizer> {
        let wasm_opt = std::env::var_os(ENV_WASM_OPT).unwrap_or_else(|| "wasm-opt".into());
        Optimizer::at(Path::new(&wasm_opt))
    }

    /// The `wasm-opt` at `wasm_opt`, checked to be [`WASM_OPT_VERSION`].
    ///
    /// # Errors
    ///
    /// As [`Optimizer::find`].
    pub fn at(wasm_opt: &Path) -> Result<Optimizer> {
        let hint = format!(
            "the default guest is built with binaryen {WASM_OPT_VERSION}'s wasm-opt (Debian's \
             `binaryen` package; scripts/setup installs it, or set {ENV_WASM_OPT} to its path)"
        );
        let out = Command::new(wasm_opt)
            .arg("--version")
            .output()
            .map_err(|e| BuildError::new(format!("running {}: {e}; {hint}", wasm_opt.display())))?;
        let said = String::from_utf8_lossy(&out.stdout);
        let version = said.trim().strip_prefix("wasm-opt version ").map(|v| {
            // Later releases add the commit in parentheses: "123 (version_123)".
            v.split_whitespace().next().unwrap_or_default()
        });
        if !out.status.success() || version != Some(WASM_OPT_VERSION) {
            return Err(BuildError::new(format!(
                "{} --version said {:?}; {hint}",
                wasm_opt.display(),
                said.trim()
            )));
        }
        Ok(Optimizer {
            wasm_opt: wasm_opt.to_path_buf(),
        })
    }

    /// `module`, optimized. `work` is a directory for the files `wasm-opt` reads and writes.
    pub(crate) fn optimize(&self, module: &[u8], work: &Path) -> Result<Vec<u8>> {
        let io = |what: &str, e: std::io::Error| BuildError::new(format!("{what}: {e}"));
        let (input, output) = (work.join("linked.wasm"), work.join("linked.opt.wasm"));
        std::fs::write(&input, module).map_err(|e| io("writing the linked module", e))?;
        let out = Command::new(&self.wasm_opt)
            .args(FLAGS)
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .output()
            .map_err(|e| io(&format!("running {}", self.wasm_opt.display()), e))?;
        if !out.status.success() {
            return Err(BuildError::new(format!(
                "wasm-opt failed on the linked module ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let optimized = std::fs::read(&output).map_err(|e| io("reading wasm-opt's output", e))?;
        // Neither file is needed again; a leftover one is only a stale copy in `work`.
        let _ = std::fs::remove_file(&input);
        let _ = std::fs::remove_file(&output);
        Ok(optimized)
    }
}

// The stand-in `wasm-opt` is a shell script.
#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in `wasm-opt` that prints `version` and copies its input to its output.
    fn fake(dir: &Path, version: &str) -> PathBuf {
        let path = dir.join("wasm-opt");
        let script = format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo '{version}'; exit 0; }}\n\
             while [ $# -gt 2 ]; do shift; done\nin=$(ls \"$(dirname \"$2\")\"/linked.wasm)\n\
             cp \"$in\" \"$2\"\n"
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_pinned_release_is_taken_and_run() {
        let dir = tempfile::tempdir().unwrap();
        let optimizer = Optimizer::at(&fake(dir.path(), "wasm-opt version 108")).unwrap();
        let out = optimizer.optimize(b"\0asm module", dir.path()).unwrap();
        assert_eq!(out, b"\0asm module");
        assert!(
            !dir.path().join("linked.wasm").exists(),
            "input left behind"
        );
    }

    #[test]
    fn another_release_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = Optimizer::at(&fake(dir.path(), "wasm-opt version 123 (version_123)")).unwrap_err();
        assert!(
            e.message()
                .contains("\"wasm-opt version 123 (version_123)\""),
            "{e}"
        );
        assert!(
            e.message().contains("binaryen 108") && e.message().contains(ENV_WASM_OPT),
            "{e}"
        );
    }

    #[test]
    fn a_missing_wasm_opt_is_named() {
        let e = Optimizer::at(Path::new("/nonexistent/wasm-opt")).unwrap_err();
        assert!(e.message().contains("/nonexistent/wasm-opt"), "{e}");
        assert!(e.message().contains("scripts/setup"), "{e}");
    }
}

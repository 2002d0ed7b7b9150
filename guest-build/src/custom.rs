//! A guest with packages baked in: the same sources and steps as the default guest, plus a
//! directory of installed pure-Python packages and a list of modules to preload.

use std::fs;
use std::path::Path;

use crate::{APP, BuildError, Result, SOURCES, Toolchain, WIT, WORLD, finish};

/// The line `pycage_wasm.py` raises when a module to preload does not import, as a sentence.
fn preload_failure(output: &str) -> Option<String> {
    let line = output.lines().find_map(|l| {
        l.split_once("ImportError: PYCAGE_PRELOAD_FAILED ")
            .map(|(_, rest)| rest)
    })?;
    let (module, why) = line.split_once(": ")?;
    Some(format!(
        "--preload {module}: it does not import in the guest: {why}"
    ))
}

/// What a custom guest is built from.
#[derive(Debug, Clone)]
pub struct CustomGuest<'a> {
    /// The installed packages (`pip install --target`): a `site-packages` directory.
    pub site_packages: &'a Path,
    /// Modules imported when the guest is built, so that importing them in a run is free.
    pub preload: &'a [String],
    /// A directory for the build's files; its contents are replaced.
    pub work: &'a Path,
}

/// Builds a custom guest with `toolchain` and returns the finished component (not yet
/// sealed with its manifest). `step` is told as each step begins (`componentize`, `finish`).
///
/// # Errors
///
/// [`BuildError`] when a step fails; a preloaded module that does not import fails
/// componentize-py, whose output names it.
pub fn build_custom(
    toolchain: &Toolchain,
    guest: &CustomGuest<'_>,
    mut step: impl FnMut(&str),
) -> Result<Vec<u8>> {
    let io = |what: &str, e: std::io::Error| BuildError::new(format!("{what}: {e}"));
    let _ = fs::remove_dir_all(guest.work);
    let src = guest.work.join("src");
    let wit = guest.work.join("wit");
    let empty = guest
        .work
        .join("no-packages")
        .join("lib")
        .join("site-packages");
    for dir in [&src, &wit, &empty] {
        fs::create_dir_all(dir).map_err(|e| io(&format!("creating {}", dir.display()), e))?;
    }
    for (name, text) in SOURCES {
        fs::write(src.join(name), text).map_err(|e| io(&format!("writing {name}"), e))?;
    }
    // The guest reads what to preload, and where its packages are (`/1`: the second path
    // given to componentize-py, after the sources), from this module.
    let preload: Vec<String> = guest.preload.iter().map(|m| format!("{m:?}")).collect();
    let config = format!(
        "PRELOAD = ({})\nSITE = \"/1\"\n",
        preload.iter().map(|m| format!("{m}, ")).collect::<String>()
    );
    fs::write(src.join("pycage_guest_config.py"), config)
        .map_err(|e| io("writing the guest's configuration", e))?;
    fs::write(wit.join("pycage.wit"), WIT).map_err(|e| io("writing the WIT contract", e))?;
    step("componentize");
    let out = guest.work.join("componentized.wasm");
    let no_packages = guest.work.join("no-packages");
    toolchain
        .componentize_captured(
            &wit,
            WORLD,
            APP,
            &[&src, guest.site_packages],
            &no_packages,
            &out,
        )
        .map_err(|output| match preload_failure(&output) {
            Some(what) => BuildError::preload(what),
            None => BuildError::new(output),
        })?;
    let component = fs::read(&out).map_err(|e| io("reading componentize-py's output", e))?;
    step("finish");
    finish(&component)
}

#[cfg(test)]
mod tests {
    use super::preload_failure;

    #[test]
    fn a_module_that_does_not_import_is_named_with_why() {
        let output = "Traceback (most recent call last):\n  raise ImportError(\n    \
                      f\"PYCAGE_PRELOAD_FAILED {_name}: {type(_e).__name__}: {_e}\"\n\
                      ImportError: \
                      PYCAGE_PRELOAD_FAILED networkx: ModuleNotFoundError: No module named \
                      '_bz2'\n\nCaused by:\n    ImportError: PYCAGE_PRELOAD_FAILED networkx: ...";
        assert_eq!(
            preload_failure(output).as_deref(),
            Some(
                "--preload networkx: it does not import in the guest: ModuleNotFoundError: \
                 No module named '_bz2'"
            )
        );
        assert_eq!(preload_failure("Traceback: SyntaxError"), None);
    }
}

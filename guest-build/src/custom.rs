//! Building guests: the default guest from its sources, and a guest with packages baked in (the
//! same sources and steps, plus a directory of installed pure-Python packages and a list of
//! modules to preload).

use std::fs;
use std::path::{Path, PathBuf};

use crate::{
    APP, BuildError, GUEST_FILES, Optimizer, Result, SOURCES, Toolchain, WIT, WORLD, finish,
    finish_with,
};

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
    let work = Work::lay_out(guest.work, SOURCES)?;
    // The guest reads what to preload, and where its packages are (`/1`: the second path
    // given to componentize-py, after the sources), from this module.
    let preload: Vec<String> = guest.preload.iter().map(|m| format!("{m:?}")).collect();
    let config = format!(
        "PRELOAD = ({})\nSITE = \"/1\"\n",
        preload.iter().map(|m| format!("{m}, ")).collect::<String>()
    );
    fs::write(work.src.join("pycage_guest_config.py"), config)
        .map_err(|e| io("writing the guest's configuration", e))?;
    step("componentize");
    let out = guest.work.join("componentized.wasm");
    toolchain
        .componentize_captured(
            &work.wit,
            WORLD,
            APP,
            &[&work.src, guest.site_packages],
            &work.no_packages,
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

/// Builds the default guest from its sources ([`GUEST_FILES`] of [`SOURCES`], and [`WIT`]) with
/// `toolchain`, in `work` (its contents are replaced), and returns the finished component:
/// what `pycage-guest-default` ships prebuilt, and what `pycage`'s `guest-from-source` feature
/// embeds. Its linked module is optimized by binaryen's `wasm-opt` ([`Optimizer::find`]); a
/// custom guest's is not (yet: its C extensions have not been tried under it).
///
/// # Errors
///
/// [`BuildError`] when `wasm-opt` is missing or another release, or when componentize-py or a
/// step of [`finish`] fails.
pub fn build_default(toolchain: &Toolchain, work: &Path) -> Result<Vec<u8>> {
    // Found first, so that a missing binaryen fails the build before componentize-py runs.
    let optimizer = Optimizer::find()?;
    let sources = SOURCES
        .iter()
        .filter(|(name, _)| GUEST_FILES.contains(name));
    let laid = Work::lay_out(work, sources)?;
    let out = work.join("componentized.wasm");
    toolchain.componentize(&laid.wit, WORLD, APP, &[&laid.src], &laid.no_packages, &out)?;
    let component = fs::read(&out).map_err(|e| io("reading componentize-py's output", e))?;
    finish_with(&component, Some((&optimizer, work)))
}

fn io(what: &str, e: std::io::Error) -> BuildError {
    BuildError::new(format!("{what}: {e}"))
}

/// A guest build's directory: the guest's Python files in `src`, the WIT contract in `wit`,
/// and an empty virtualenv (`no_packages`) standing in for the host's `site-packages`, which
/// componentize-py would otherwise put on the guest's path.
struct Work {
    src: PathBuf,
    wit: PathBuf,
    no_packages: PathBuf,
}

impl Work {
    /// Empties `work` and writes `sources` and the WIT contract into it. The sources are
    /// copies, never the originals: componentize-py imports them and writes bytecode beside
    /// them.
    fn lay_out<'a>(
        work: &Path,
        sources: impl IntoIterator<Item = &'a (&'a str, &'a str)>,
    ) -> Result<Work> {
        let _ = fs::remove_dir_all(work);
        let laid = Work {
            src: work.join("src"),
            wit: work.join("wit"),
            no_packages: work.join("no-packages"),
        };
        let site = laid.no_packages.join("lib").join("site-packages");
        for dir in [&laid.src, &laid.wit, &site] {
            fs::create_dir_all(dir).map_err(|e| io(&format!("creating {}", dir.display()), e))?;
        }
        for (name, text) in sources {
            fs::write(laid.src.join(name), text).map_err(|e| io(&format!("writing {name}"), e))?;
        }
        fs::write(laid.wit.join("pycage.wit"), WIT)
            .map_err(|e| io("writing the WIT contract", e))?;
        Ok(laid)
    }
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

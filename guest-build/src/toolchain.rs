//! componentize-py in a private virtualenv, installed by version and hash, and run so that
//! nothing of the host's Python reaches the guest.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, Result};

/// The lock file the virtualenv is installed from (`pip install --require-hashes`).
pub const LOCK: &str = include_str!("../componentize-py.lock");

/// The requirement the lock pins, for messages.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// componentize-py, installed in a virtualenv of its own.
#[derive(Debug, Clone)]
pub struct Toolchain {
    componentize: PathBuf,
    python: PathBuf,
}

impl Toolchain {
    /// The toolchain in `venv`, created there with `python` (which needs its `venv` module)
    /// and installed from [`LOCK`] when it is missing or was installed from another lock.
    /// `progress` is told when the (one-time) install starts.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when the virtualenv cannot be created or pip refuses the install (no
    /// network, or a wheel whose hash is not in the lock).
    pub fn ensure(venv: &Path, python: &OsStr, progress: impl FnOnce(&str)) -> Result<Toolchain> {
        Toolchain::install(venv, python, LOCK, progress)
    }

    /// [`Toolchain::ensure`] from the lock `lock_text` (tests tamper with it).
    fn install(
        venv: &Path,
        python: &OsStr,
        lock_text: &str,
        progress: impl FnOnce(&str),
    ) -> Result<Toolchain> {
        let bin = venv.join("bin");
        let componentize = bin.join("componentize-py");
        let stamp = venv.join("pycage-installed.lock");
        let toolchain = Toolchain {
            componentize,
            python: bin.join("python"),
        };
        let installed = || {
            fs::read_to_string(&stamp).ok().as_deref() == Some(lock_text)
                && toolchain.componentize.exists()
        };
        if installed() {
            return Ok(toolchain);
        }
        // Processes that find it missing at once (a server and a `pycage run --guest data`
        // on a new machine) take turns: `venv --clear` under another's pip breaks both. The
        // lock is an advisory one on a file beside the virtualenv, released when it closes.
        let parent = venv.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent)
            .map_err(|e| BuildError::new(format!("creating {}: {e}", parent.display())))?;
        let mut turn = venv.as_os_str().to_owned();
        turn.push(".install-lock");
        let turn = PathBuf::from(turn);
        let turn = fs::File::create(&turn)
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| BuildError::new(format!("locking {}: {e}", turn.display())))?;
        if installed() {
            return Ok(toolchain);
        }
        progress(&format!(
            "installing {COMPONENTIZE_PY} into {} (once)",
            venv.display()
        ));
        run(
            Command::new(python)
                .args(["-m", "venv", "--clear"])
                .arg(venv),
            "creating the virtualenv",
        )?;
        let lock = venv.join("componentize-py.lock");
        write(&lock, lock_text)?;
        run_quietly(
            Command::new(bin.join("python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args([
                    "--require-hashes",
                    "--only-binary",
                    ":all:",
                    "--no-deps",
                    "-r",
                ])
                .arg(&lock),
            "installing componentize-py (pip install --require-hashes)",
        )?;
        write(&stamp, lock_text)?;
        drop(turn);
        Ok(toolchain)
    }

    /// The virtualenv's Python (for pip).
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// componentize-py's command line for [`Toolchain::componentize`].
    fn command(
        &self,
        wit: &Path,
        world: &str,
        app: &str,
        paths: &[&Path],
        site_packages_of: &Path,
        out: &Path,
    ) -> Command {
        let mut cmd = Command::new(&self.componentize);
        cmd.arg("-d")
            .arg(wit)
            .args(["-w", world, "componentize", app]);
        for path in paths {
            cmd.arg("-p").arg(path);
        }
        cmd.arg("-o").arg(out).env("VIRTUAL_ENV", site_packages_of);
        if let Some(first) = paths.first() {
            cmd.current_dir(first);
        }
        cmd
    }

    /// Runs componentize-py: the WIT world `world` in `wit`, the app module `app` found in
    /// `paths` (searched in order; the first holds the app), written to `out`.
    ///
    /// componentize-py also puts a virtualenv's `site-packages` on the guest's path: the
    /// one `VIRTUAL_ENV` names, or else the host's own (from `pipenv --venv`, or `python3`'s
    /// `site` module). `site_packages_of` is given to it as `VIRTUAL_ENV`, so that only what
    /// it holds (`lib/<anything>/site-packages`, possibly nothing) is seen.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when componentize-py fails; its own output says why.
    pub fn componentize(
        &self,
        wit: &Path,
        world: &str,
        app: &str,
        paths: &[&Path],
        site_packages_of: &Path,
        out: &Path,
    ) -> Result<()> {
        let mut cmd = self.command(wit, world, app, paths, site_packages_of, out);
        run(&mut cmd, "componentize-py (see its output above)")
    }

    /// [`Toolchain::componentize`] with its output captured: on failure, the error holds
    /// everything it printed.
    pub(crate) fn componentize_captured(
        &self,
        wit: &Path,
        world: &str,
        app: &str,
        paths: &[&Path],
        site_packages_of: &Path,
        out: &Path,
    ) -> std::result::Result<(), String> {
        let mut cmd = self.command(wit, world, app, paths, site_packages_of, out);
        let output = cmd
            .output()
            .map_err(|e| format!("running componentize-py: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "componentize-py failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(BuildError::new(format!("{what} failed ({s})"))),
        Err(e) => Err(BuildError::new(format!("{what}: {e}"))),
    }
}

/// Runs `cmd` with its output captured; a failure's message ends with what it printed last.
fn run_quietly(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| BuildError::new(format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let tail = text.trim();
    let tail = &tail[tail.floor_char_boundary(tail.len().saturating_sub(2000))..];
    Err(BuildError::new(format!(
        "{what} failed ({}):\n{tail}",
        out.status
    )))
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| BuildError::new(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
#[path = "toolchain_tests.rs"]
mod tests;

//! [`RunDir`]: one run's private directory, holding the broker's socket (and, for native
//! guests, the guest's Python files).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::native::SOCKET_NAME;

/// The environment variable naming the per-user runtime directory, preferred for run
/// directories.
pub const ENV_XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";

/// The longest socket path the platform's `sockaddr_un` holds (with its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A directory of mode 0700 with a random name under `$XDG_RUNTIME_DIR` (or the system's
/// temporary directory), removed with everything in it when dropped.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

/// The random part of a run directory's name, in characters.
const RANDOM_NAME_CHARS: usize = 12;

impl RunDir {
    /// Creates a fresh run directory. Uses ambient authority: the process's view of the
    /// file system and its environment.
    ///
    /// # Errors
    ///
    /// When no directory can be created, or the socket path would be too long.
    pub fn create() -> std::io::Result<RunDir> {
        let base = std::env::var_os(ENV_XDG_RUNTIME_DIR)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        Self::create_in(&base)
    }

    /// Creates a fresh run directory under `base`.
    ///
    /// # Errors
    ///
    /// As for [`RunDir::create`].
    pub fn create_in(base: &Path) -> std::io::Result<RunDir> {
        let longest = base
            .join(format!("pycage-{}", "x".repeat(RANDOM_NAME_CHARS)))
            .join(SOCKET_NAME);
        if longest.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(std::io::Error::other(
                "the run directory's path is too long for a Unix socket",
            ));
        }
        // tempfile picks a fresh random name (retrying on a collision) and creates the
        // directory with the mode given; removing it is ours, so a failure is logged.
        let path = tempfile::Builder::new()
            .prefix("pycage-")
            .rand_bytes(RANDOM_NAME_CHARS)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(base)?
            .keep();
        Ok(RunDir { path })
    }

    /// The directory's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket's host path.
    pub fn socket_path(&self) -> PathBuf {
        self.path().join(SOCKET_NAME)
    }

    /// Writes a read-only file into the directory (it must not exist yet).
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn write_file(&self, name: &str, contents: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.path().join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&path)?;
        f.write_all(contents)?;
        Ok(path)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(error = %e, "pycage: could not remove a run directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_removed_on_drop() {
        let base = std::env::temp_dir();
        let dir = RunDir::create_in(&base).unwrap();
        let path = dir.path().to_owned();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let file = dir.write_file("a.py", b"x = 1").unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        assert!(dir.write_file("a.py", b"again").is_err(), "no overwrite");
        let other = RunDir::create_in(&base).unwrap();
        assert_ne!(other.path(), dir.path());
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn too_long_a_base_is_refused() {
        let base = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        assert!(RunDir::create_in(&base).is_err());
    }
}

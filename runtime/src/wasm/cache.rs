//! The compiled-artifact cache.
//!
//! Compiling the CPython component takes seconds; loading a serialized artifact takes
//! milliseconds. Artifacts live in the user's cache directory, one per (component, engine
//! configuration) pair, each with a sidecar:
//!
//! ```text
//! <cache>/guest-<component digest>-<engine digest>-<arch>-<os>.cwasm       the serialized component
//! <cache>/guest-<component digest>-<engine digest>-<arch>-<os>.cwasm.sum   "<BLAKE3 hex>\n[<stat>\n]"
//! ```
//!
//! Files are written under temporary names and renamed into place, so readers never see half
//! a file. An artifact is handed to the engine only after its BLAKE3 matched the sidecar.
//! Hashing 50 MB on every start would cost more than the rest of a run, so after a
//! successful check the sidecar also records the artifact's identity as the file system reports
//! it (size, inode, change time). A later load whose identity still matches skips the hash and
//! maps the file directly: any write to the artifact through the file system changes its
//! change time, so a modified, truncated or replaced file is hashed again, and rebuilt when the
//! hash does not match. A missing, short or mismatched artifact is compiled again.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// The environment variable that overrides the cache directory. `off` disables the cache.
pub const ENV_CACHE_DIR: &str = "PYCAGE_CACHE_DIR";

/// How many artifacts the cache keeps (other builds and engine configurations of pycage may
/// share the directory).
const KEEP_ARTIFACTS: usize = 4;

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactSource {
    /// Loaded from a cached artifact whose identity was verified earlier.
    Cache,
    /// Loaded from a cached artifact after checking its hash now.
    CacheVerified,
    /// Compiled now (no cache file, or it was stale or corrupt) and written to the cache.
    Compiled,
    /// Compiled now; there is no cache directory (or writing failed).
    CompiledUncached,
}

/// The default cache directory: `$PYCAGE_CACHE_DIR`, else the OS's per-user cache directory
/// for pycage (the `directories` crate's conventions): `$XDG_CACHE_HOME/pycage` or
/// `~/.cache/pycage` on Linux, `~/Library/Caches/pycage` on macOS,
/// `%LOCALAPPDATA%\pycage\cache` on Windows. `None` when caching is off or the OS names no
/// such directory (no home directory).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_CACHE_DIR) {
        if dir == "off" || dir.is_empty() {
            return None;
        }
        return Some(PathBuf::from(dir));
    }
    directories::ProjectDirs::from("", "", "pycage").map(|dirs| dirs.cache_dir().to_owned())
}

/// The artifact file for a component digest under an engine, on this target: the name
/// says the architecture and OS as well as the engine's digest, so a cache directory shared
/// between machines (a network home, a synced folder) never hands one the other's code.
pub(crate) fn artifact_path(dir: &Path, engine: &Engine, component_digest: &str) -> PathBuf {
    let mut hasher = Blake3Hasher(blake3::Hasher::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_digest = hasher.0.finalize().to_hex();
    dir.join(format!(
        "guest-{}-{}-{}-{}.cwasm",
        &component_digest[..16],
        &engine_digest.as_str()[..16],
        std::env::consts::ARCH,
        std::env::consts::OS,
    ))
}

fn sum_path(artifact: &Path) -> PathBuf {
    let mut name = artifact.as_os_str().to_owned();
    name.push(".sum");
    PathBuf::from(name)
}

/// Loads the component from the cache, or compiles it and caches the result.
pub(crate) fn load_or_compile(
    engine: &Engine,
    wasm: &[u8],
    component_digest: &str,
    dir: Option<&Path>,
) -> wasmtime::Result<(Component, ArtifactSource)> {
    let Some(dir) = dir else {
        return Ok((
            Component::new(engine, wasm)?,
            ArtifactSource::CompiledUncached,
        ));
    };
    let path = artifact_path(dir, engine, component_digest);
    if let Ok(Some(loaded)) = load(engine, &path) {
        return Ok(loaded);
    }
    // Another process may be compiling the same artifact: wait for it rather than compile
    // twice. The lock is advisory and only taken on this slow path.
    let _lock = lock_dir(dir);
    match load(engine, &path) {
        Ok(Some(loaded)) => return Ok(loaded),
        Ok(None) => {}
        Err(why) => {
            tracing::warn!(path = %path.display(), why, "pycage: rebuilding the cached artifact")
        }
    }
    let component = Component::new(engine, wasm)?;
    let source = match component.serialize().map(|bytes| store(dir, &path, &bytes)) {
        Ok(Ok(())) => {
            prune(dir, KEEP_ARTIFACTS);
            ArtifactSource::Compiled
        }
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "pycage: could not write the artifact cache");
            ArtifactSource::CompiledUncached
        }
        Err(e) => {
            tracing::warn!(error = %e, "pycage: could not serialize the component");
            ArtifactSource::CompiledUncached
        }
    };
    Ok((component, source))
}

/// True when a valid-looking artifact for this component exists (its checksum is not read).
pub(crate) fn is_cached(engine: &Engine, component_digest: &str, dir: Option<&Path>) -> bool {
    dir.is_some_and(|dir| {
        let path = artifact_path(dir, engine, component_digest);
        path.is_file() && sum_path(&path).is_file()
    })
}

/// What the sidecar says: the artifact's hash and, once verified, its identity.
struct Sum {
    hash: blake3::Hash,
    verified: Option<String>,
}

impl Sum {
    fn parse(text: &str) -> Option<Sum> {
        let mut lines = text.lines();
        let hash = blake3::Hash::from_hex(lines.next()?.trim()).ok()?;
        let verified = lines.next().map(str::to_owned).filter(|l| !l.is_empty());
        Some(Sum { hash, verified })
    }

    fn render(&self) -> String {
        match &self.verified {
            Some(id) => format!("{}\n{id}\n", self.hash.to_hex()),
            None => format!("{}\n", self.hash.to_hex()),
        }
    }
}

/// The artifact's identity as the file system reports it.
#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "size={} dev={} ino={} ctime={}.{:09} mtime={}.{:09}",
        meta.len(),
        meta.dev(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec(),
        meta.mtime(),
        meta.mtime_nsec()
    )
}

/// Without inode and change time, every load hashes.
#[cfg(not(unix))]
fn identity(_meta: &std::fs::Metadata) -> String {
    String::new()
}

/// `Ok(None)` when there is no artifact; `Err` with a reason when it is unusable.
fn load(engine: &Engine, path: &Path) -> Result<Option<(Component, ArtifactSource)>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    let sum_file = sum_path(path);
    let sum = std::fs::read_to_string(&sum_file)
        .ok()
        .and_then(|t| Sum::parse(&t))
        .ok_or("no valid checksum beside it")?;
    let id = identity(&meta);
    let source = if !id.is_empty() && sum.verified.as_deref() == Some(id.as_str()) {
        ArtifactSource::Cache
    } else {
        let data = std::fs::read(path).map_err(|e| format!("unreadable: {e}"))?;
        if blake3::hash(&data) != sum.hash {
            return Err("checksum mismatch (corrupt, truncated or replaced)".into());
        }
        let stamped = Sum {
            hash: sum.hash,
            verified: Some(id),
        };
        let _ = write_atomic(&sum_file, stamped.render().as_bytes());
        ArtifactSource::CacheVerified
    };
    // SAFETY: `deserialize_file` trusts its input to be an artifact this wasmtime produced.
    // The file is one `Component::serialize` wrote into our own cache (its name binds the
    // engine's compatibility hash), and it is used only when its BLAKE3 matched the sidecar
    // now, or earlier for this very file identity (size, inode, change time), which any write
    // through the file system would have changed. The cache directory belongs to the user
    // running pycage: the same trust as the pycage binary itself.
    let component = unsafe { Component::deserialize_file(engine, path) }
        .map_err(|e| format!("rejected by the engine: {e}"))?;
    // Mark it recently used (on the sidecar: the artifact's own times are its identity).
    let _ = std::fs::File::options()
        .write(true)
        .open(&sum_file)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    Ok(Some((component, source)))
}

fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // The sidecar goes first: an artifact never appears without the hash that vouches for it.
    let sum = Sum {
        hash: blake3::hash(artifact),
        verified: None,
    };
    write_atomic(&sum_path(path), sum.render().as_bytes())?;
    write_atomic(path, artifact)
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("artifact");
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes all but the `keep` most recently used artifacts: each is tens of megabytes.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut artifacts: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("guest-") && name.ends_with(".cwasm")
        })
        .map(|e| {
            let used = std::fs::metadata(sum_path(&e.path()))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (used, e.path())
        })
        .collect();
    artifacts.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
    for (_, path) in artifacts.into_iter().skip(keep) {
        let _ = std::fs::remove_file(sum_path(&path));
        let _ = std::fs::remove_file(path);
    }
}

/// Takes the cache directory's compile lock; `None` when it cannot (then compile unlocked).
fn lock_dir(dir: &Path) -> Option<std::fs::File> {
    std::fs::create_dir_all(dir).ok()?;
    let file = std::fs::File::create(dir.join(".compile.lock")).ok()?;
    file.lock().ok()?;
    Some(file)
}

/// Feeds `Hash` output into BLAKE3, so the engine digest is stable across Rust versions.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        let mut out = [0u8; 8];
        out.copy_from_slice(&self.0.finalize().as_bytes()[..8]);
        u64::from_le_bytes(out)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;

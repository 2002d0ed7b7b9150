//! The compiled-artifact cache.
//!
//! Compiling the CPython component takes seconds; loading a serialized artifact takes
//! milliseconds. Artifacts live in the user's cache directory, one file per (component,
//! engine configuration) pair:
//!
//! ```text
//! <cache>/pycage/guest-<component digest>-<engine digest>.cwasm
//!     "PYCAGE01" | BLAKE3 of the artifact (32 bytes) | the artifact
//! ```
//!
//! A file is written to a temporary name and renamed into place, so readers never see half a
//! file. A file that is short, has another magic, or fails its checksum is never handed to the
//! engine: it is compiled again and replaced.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

const MAGIC: &[u8; 8] = b"PYCAGE01";
const HEADER: usize = MAGIC.len() + blake3::OUT_LEN;

/// The environment variable that overrides the cache directory. `off` disables the cache.
pub const ENV_CACHE_DIR: &str = "PYCAGE_CACHE_DIR";

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactSource {
    /// Loaded from a valid cached artifact.
    Cache,
    /// Compiled now (no cache file, or it was stale or corrupt) and written to the cache.
    Compiled,
    /// Compiled now; there is no cache directory (or writing failed).
    CompiledUncached,
}

/// The default cache directory: `$PYCAGE_CACHE_DIR`, else `$XDG_CACHE_HOME/pycage`, else
/// `$HOME/.cache/pycage`. `None` when caching is off or no directory can be found.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_CACHE_DIR) {
        if dir == "off" || dir.is_empty() {
            return None;
        }
        return Some(PathBuf::from(dir));
    }
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(xdg).join("pycage"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|home| PathBuf::from(home).join(".cache").join("pycage"))
}

/// The cache file for a component digest under an engine.
pub(crate) fn artifact_path(dir: &Path, engine: &Engine, component_digest: &str) -> PathBuf {
    let mut hasher = Blake3Hasher(blake3::Hasher::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_digest = hasher.0.finalize().to_hex();
    dir.join(format!(
        "guest-{}-{}.cwasm",
        &component_digest[..16],
        &engine_digest.as_str()[..16]
    ))
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
    if let Ok(Some(component)) = load(engine, &path) {
        return Ok((component, ArtifactSource::Cache));
    }
    // Another process may be compiling the same artifact: wait for it rather than compile
    // twice. The lock is advisory and only taken on this slow path.
    let _lock = lock_dir(dir);
    match load(engine, &path) {
        Ok(Some(component)) => return Ok((component, ArtifactSource::Cache)),
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

/// How many artifacts the cache keeps (other builds of pycage may share the directory).
const KEEP_ARTIFACTS: usize = 3;

/// Removes all but the `keep` newest artifacts: each is tens of megabytes.
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
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    artifacts.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, path) in artifacts.into_iter().skip(keep) {
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

/// True when a valid-looking artifact for this component exists (its checksum is not read).
pub(crate) fn is_cached(engine: &Engine, component_digest: &str, dir: Option<&Path>) -> bool {
    dir.is_some_and(|dir| artifact_path(dir, engine, component_digest).is_file())
}

/// `Ok(None)` when there is no file; `Err` with a reason when the file is unusable.
fn load(engine: &Engine, path: &Path) -> Result<Option<Component>, String> {
    let data = match std::fs::read(path) {
        Ok(data) => data,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    let artifact = verify(&data)?;
    // SAFETY: `deserialize` trusts its input to be an artifact this wasmtime produced. The
    // bytes are exactly what `Component::serialize` wrote into our own cache file (the file
    // name binds the engine's compatibility hash, and the checksum in the header binds the
    // content, so truncation and corruption are caught above). The cache directory belongs to
    // the user running pycage, the same trust as the pycage binary itself.
    let component = unsafe { Component::deserialize(engine, artifact) }
        .map_err(|e| format!("rejected by the engine: {e}"))?;
    Ok(Some(component))
}

/// Checks the header and checksum; returns the artifact bytes.
fn verify(data: &[u8]) -> Result<&[u8], String> {
    if data.len() < HEADER || &data[..MAGIC.len()] != MAGIC {
        return Err("not a pycage artifact (bad header)".into());
    }
    let (expected, artifact) = data[MAGIC.len()..].split_at(blake3::OUT_LEN);
    if blake3::hash(artifact).as_bytes() != expected {
        return Err("checksum mismatch (corrupt or truncated)".into());
    }
    Ok(artifact)
}

fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("artifact"),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(blake3::hash(artifact).as_bytes())?;
        f.write_all(artifact)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
mod tests {
    use super::*;

    #[test]
    fn verify_rejects_bad_header_truncation_and_corruption() {
        let artifact = b"some artifact bytes".to_vec();
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(blake3::hash(&artifact).as_bytes());
        file.extend_from_slice(&artifact);
        assert_eq!(verify(&file).unwrap(), &artifact[..]);

        assert!(
            verify(&file[..file.len() - 1])
                .unwrap_err()
                .contains("checksum")
        );
        assert!(verify(&file[..10]).unwrap_err().contains("header"));
        let mut flipped = file.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(verify(&flipped).unwrap_err().contains("checksum"));
        let mut other = file.clone();
        other[0] = b'X';
        assert!(verify(&other).unwrap_err().contains("header"));
    }
}

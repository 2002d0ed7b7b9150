//! Which Python guest a [`WasmBackend`](super::WasmBackend) runs: the one built into this
//! library, or a guest file built for it (with packages baked in).
//!
//! A guest file is a component followed by one custom section, [`SECTION`], holding its
//! [`GuestManifest`] as JSON: who built it (pycage's version), with what (Python, packages
//! and their hashes, preloaded modules), and the BLAKE3 of every byte before the section.
//! [`Guest::from_bytes`] refuses, before anything is compiled, a file that is not a guest, one
//! whose bytes do not match its digest, one built by another pycage version, and one that
//! imports anything beyond the committed list of host interfaces (`wit/guest-imports.txt`):
//! a guest can never bring a new channel to the host.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use wasmparser::{Encoding, Parser, Payload};

/// The name of the custom section that makes a component a pycage guest file.
pub const SECTION: &str = "pycage-guest";

/// The manifest format this library reads and writes.
pub const FORMAT: u32 = 1;

/// The host interfaces a guest may import, one per line (`wit/guest-imports.txt`); the
/// built-in guest imports exactly these (`tests/it/guest_contract.rs`).
const ALLOWED_IMPORTS: &str = include_str!("../../wit/guest-imports.txt");

/// What a guest file says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GuestManifest {
    /// The manifest's format ([`FORMAT`]).
    pub format: u32,
    /// The version of pycage that built the guest; only that version runs it.
    pub pycage: String,
    /// The guest's Python (`3.14.0`).
    pub python: String,
    /// The packages baked in, as resolved.
    pub packages: Vec<Package>,
    /// The modules imported when the guest was built (free to import in a run), beyond the
    /// standard library's preloaded ones.
    pub preload: Vec<String>,
    /// BLAKE3 (hex) of the component: every byte of the file before this section.
    pub content_blake3: String,
}

/// One package of a guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Package {
    /// The distribution's name, as its metadata spells it.
    pub name: String,
    /// Its version.
    pub version: String,
    /// SHA-256 (hex) of the wheel it was installed from.
    pub sha256: String,
    /// The top-level modules it installs: the names code imports (`dateutil` for
    /// `python-dateutil`).
    #[serde(default)]
    pub modules: Vec<String>,
}

impl Package {
    /// A package record.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        sha256: impl Into<String>,
    ) -> Package {
        Package {
            name: name.into(),
            version: version.into(),
            sha256: sha256.into(),
            modules: Vec::new(),
        }
    }

    /// The same record, with the top-level modules the package installs.
    #[must_use]
    pub fn with_modules(mut self, modules: Vec<String>) -> Package {
        self.modules = modules;
        self
    }
}

impl GuestManifest {
    /// A manifest for `component` (the bytes the section will follow), built by this pycage.
    pub fn new(
        component: &[u8],
        python: impl Into<String>,
        packages: Vec<Package>,
        preload: Vec<String>,
    ) -> GuestManifest {
        GuestManifest {
            format: FORMAT,
            pycage: env!("CARGO_PKG_VERSION").to_owned(),
            python: python.into(),
            packages,
            preload,
            content_blake3: blake3::hash(component).to_hex().to_string(),
        }
    }
}

/// Why a guest file was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum GuestError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The bytes are not a pycage guest: not a component, or one without the
    /// [`SECTION`] section at its end.
    NotAGuest(String),
    /// The manifest is not one this library reads.
    Malformed(String),
    /// The component's bytes do not have the digest its manifest gives: the file was
    /// changed or cut after it was built.
    Corrupted {
        /// The digest the manifest gives.
        expected: String,
        /// The digest of the bytes.
        actual: String,
    },
    /// The guest was built by another version of pycage (its snapshot is tied to the
    /// guest code of the version that built it).
    OtherVersion {
        /// The version that built it.
        built_by: String,
    },
    /// The guest imports host interfaces beyond the allowed list.
    Imports(Vec<String>),
}

impl fmt::Display for GuestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuestError::Io { path, error } => write!(f, "reading {}: {error}", path.display()),
            GuestError::NotAGuest(why) => write!(f, "not a pycage guest: {why}"),
            GuestError::Malformed(why) => write!(f, "the guest's manifest is malformed: {why}"),
            GuestError::Corrupted { expected, actual } => write!(
                f,
                "the guest is corrupted: its manifest gives the digest {expected}, its bytes \
                 have {actual}"
            ),
            GuestError::OtherVersion { built_by } => write!(
                f,
                "the guest was built by pycage {built_by}; this is pycage {}: rebuild it with \
                 `pycage guest build`",
                env!("CARGO_PKG_VERSION")
            ),
            GuestError::Imports(extra) => write!(
                f,
                "the guest imports host interfaces pycage does not allow: {}",
                extra.join(", ")
            ),
        }
    }
}

impl std::error::Error for GuestError {}

/// A guest's bytes: the built-in guest's stay where the binary maps them (read only on a
/// cache miss, to compile); a file's are owned.
#[derive(Clone)]
enum Bytes {
    /// The built-in component, in the binary. Copying its 28 MB to the heap, as an
    /// `Arc<[u8]>` did, cost every process about 7,000 page faults (85% of `pycage run -c
    /// pass`'s, measured with `perf record -e page-faults`) though a cached artifact needs
    /// none of it.
    Static(&'static [u8]),
    Owned(Arc<[u8]>),
}

/// A Python guest for the wasm backend. Cheap to clone.
#[derive(Clone)]
pub struct Guest {
    bytes: Bytes,
    /// BLAKE3 (hex) of `bytes`: the artifact cache's key.
    digest: Arc<str>,
    /// `None` for the built-in guest.
    manifest: Option<Arc<GuestManifest>>,
}

impl fmt::Debug for Guest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guest")
            .field("digest", &self.digest)
            .field("bytes", &self.bytes().len())
            .field("manifest", &self.manifest)
            .finish()
    }
}

impl Guest {
    /// The guest built into this library (the standard library, no packages).
    pub fn builtin() -> Guest {
        static BUILTIN: std::sync::OnceLock<Guest> = std::sync::OnceLock::new();
        BUILTIN
            .get_or_init(|| Guest {
                bytes: Bytes::Static(super::COMPONENT),
                digest: Arc::from(super::COMPONENT_DIGEST),
                manifest: None,
            })
            .clone()
    }

    /// A guest file's bytes, checked (see the module docs).
    ///
    /// # Errors
    ///
    /// [`GuestError`] saying why the file is refused.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Guest, GuestError> {
        let (component, manifest) = split(&bytes)?;
        if manifest.format != FORMAT {
            return Err(GuestError::Malformed(format!(
                "format {} (this pycage reads {FORMAT})",
                manifest.format
            )));
        }
        let actual = blake3::hash(component).to_hex().to_string();
        if actual != manifest.content_blake3 {
            return Err(GuestError::Corrupted {
                expected: manifest.content_blake3,
                actual,
            });
        }
        if manifest.pycage != env!("CARGO_PKG_VERSION") {
            return Err(GuestError::OtherVersion {
                built_by: manifest.pycage,
            });
        }
        let extra = disallowed_imports(component)?;
        if !extra.is_empty() {
            return Err(GuestError::Imports(extra));
        }
        Ok(Guest {
            digest: Arc::from(blake3::hash(&bytes).to_hex().as_str()),
            bytes: Bytes::Owned(Arc::from(bytes)),
            manifest: Some(Arc::new(manifest)),
        })
    }

    /// A guest file, read and checked.
    ///
    /// # Errors
    ///
    /// As for [`Guest::from_bytes`], and [`GuestError::Io`].
    pub fn from_path(path: &Path) -> Result<Guest, GuestError> {
        let bytes = std::fs::read(path).map_err(|error| GuestError::Io {
            path: path.to_owned(),
            error,
        })?;
        Guest::from_bytes(bytes)
    }

    /// The guest's manifest; `None` for the built-in guest.
    pub fn manifest(&self) -> Option<&GuestManifest> {
        self.manifest.as_deref()
    }

    /// BLAKE3 (hex) of the guest's bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The guest's bytes (a component, followed by its manifest unless built in).
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Static(bytes) => bytes,
            Bytes::Owned(bytes) => bytes,
        }
    }

    /// True for the guest built into this library.
    pub fn is_builtin(&self) -> bool {
        self.manifest.is_none()
    }
}

/// `component` followed by its manifest section: a guest file.
///
/// # Errors
///
/// When the manifest does not serialize (it always does).
pub fn seal(component: &[u8], manifest: &GuestManifest) -> Result<Vec<u8>, GuestError> {
    let json = serde_json::to_vec(manifest).map_err(|e| GuestError::Malformed(e.to_string()))?;
    let mut section = Vec::with_capacity(json.len() + 32);
    leb128(&mut section, SECTION.len() as u64);
    section.extend_from_slice(SECTION.as_bytes());
    section.extend_from_slice(&json);
    let mut out = Vec::with_capacity(component.len() + section.len() + 8);
    out.extend_from_slice(component);
    out.push(0); // a custom section
    leb128(&mut out, section.len() as u64);
    out.extend_from_slice(&section);
    Ok(out)
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The component and its manifest: the last top-level section must be [`SECTION`].
fn split(bytes: &[u8]) -> Result<(&[u8], GuestManifest), GuestError> {
    let not = |why: &str| GuestError::NotAGuest(why.to_owned());
    let mut depth = 0usize;
    let mut last: Option<(usize, &[u8], &str)> = None;
    let mut is_component = false;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| not(&format!("it does not parse as wasm: {e}")))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 {
                    is_component = encoding == Encoding::Component;
                }
                depth += 1;
                last = None;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::CustomSection(c) if depth == 1 => {
                last = Some((c.range().start, c.data(), c.name()));
            }
            _ if depth == 1 => last = None,
            _ => {}
        }
    }
    if !is_component {
        return Err(not(
            "it is a core module or something else, not a component",
        ));
    }
    let Some((content_start, data, _)) = last.filter(|(_, _, name)| *name == SECTION) else {
        return Err(not(&format!(
            "it does not end with a `{SECTION}` section (the built-in guest's component, or \
             one not built by `pycage guest build`)"
        )));
    };
    // The section's id byte and size precede its content.
    let begin = section_start(bytes, content_start).ok_or_else(|| {
        not(&format!(
            "its `{SECTION}` section is not where it should be"
        ))
    })?;
    let manifest: GuestManifest =
        serde_json::from_slice(data).map_err(|e| GuestError::Malformed(e.to_string()))?;
    Ok((&bytes[..begin], manifest))
}

/// Where the custom section whose content starts at `content_start` begins (its id byte), if
/// it is the file's last.
fn section_start(bytes: &[u8], content_start: usize) -> Option<usize> {
    // A custom section is `0x00`, its size (LEB128, 1 to 5 bytes), then its content; the
    // content starts with the name's length. Walk back over the size's bytes.
    (2..=6).find_map(|back| {
        let begin = content_start.checked_sub(back)?;
        if bytes.get(begin) != Some(&0) {
            return None;
        }
        let (size, used) = read_leb128(bytes.get(begin + 1..content_start)?)?;
        (used == back - 1 && begin + 1 + used + size as usize == bytes.len()).then_some(begin)
    })
}

fn read_leb128(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The component's imports that `wit/guest-imports.txt` does not allow.
fn disallowed_imports(component: &[u8]) -> Result<Vec<String>, GuestError> {
    let allowed: BTreeSet<&str> = ALLOWED_IMPORTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut depth = 0usize;
    let mut extra = Vec::new();
    for payload in Parser::new(0).parse_all(component) {
        match payload.map_err(|e| GuestError::NotAGuest(format!("it does not parse: {e}")))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import =
                        import.map_err(|e| GuestError::NotAGuest(format!("its imports: {e}")))?;
                    let name = import.name.name;
                    if !allowed.contains(name) {
                        extra.push(name.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(extra)
}

#[cfg(test)]
#[path = "guest_tests.rs"]
mod tests;

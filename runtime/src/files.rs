//! Files in and out of a run: [`InputFile`]s the code reads, [`OutputFile`]s it produced, and
//! the scratch directory that holds them.
//!
//! # Security
//!
//! The scratch directory is a fresh private directory on the host (mode 0700 where the OS has
//! modes), never one of the host's own directories. The guest sees it at [`GUEST_DIR`] and
//! reaches it only through a capability handle (cap-std on the host, the WASI preopen in the
//! wasm guest): `..`, absolute paths and symbolic links cannot lead out of it. Input names are
//! checked before anything is written ([`check_path`]). Reading the produced files back walks
//! the directory through the same handle without following any symbolic link, and takes
//! regular files only.
//!
//! Every byte the guest can put there is budgeted on the host ([`Limits`]: total input bytes,
//! bytes written, number of entries, size of one file, bytes returned), so the host's disk is
//! never at the guest's mercy. A write past a budget fails in the guest as `OSError` (`ENOSPC`,
//! or `EFBIG` for one file too large), and the run goes on.

use std::fmt;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{ErrorKind, Limits, RunError};

mod scratch;

pub(crate) use self::scratch::Scratch;

/// Where the scratch directory appears to the guest; also the code's working directory.
pub const GUEST_DIR: &str = "/work";

/// The longest path an input file may have, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// The longest one component of an input path may be, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The deepest an input file may be nested, and the deepest the produced files are looked
/// for.
pub const MAX_DEPTH: usize = 32;

/// A file the code gets, at `path` in its working directory.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Relative, normalized, UTF-8: `data.csv`, `inputs/2024/a.json`.
    pub path: String,
    /// The file's contents.
    #[serde(with = "base64_bytes")]
    pub bytes: Vec<u8>,
}

impl InputFile {
    /// An input file. The path is checked when the run starts.
    pub fn new(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        InputFile {
            path: path.into(),
            bytes: bytes.into(),
        }
    }
}

impl fmt::Debug for InputFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputFile")
            .field("path", &self.path)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// A file the code created or changed in its working directory.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to the working directory, with `/` between components.
    pub path: String,
    /// The file's size.
    pub size: u64,
    /// Its contents; `None` when returning them would pass the run's `max_returned_bytes`.
    #[serde(with = "base64_opt")]
    pub bytes: Option<Vec<u8>>,
}

impl fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputFile")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("returned", &self.bytes.is_some())
            .finish()
    }
}

/// Checks an input file's path: relative, normalized UTF-8 (no `.` or `..` component, no
/// empty component, no trailing `/`), no NUL, backslash or control character, at most
/// [`MAX_PATH_BYTES`] long with components of at most [`MAX_NAME_BYTES`], and at most
/// [`MAX_DEPTH`] deep.
///
/// # Errors
///
/// An `invalid_input` [`RunError`] naming the path and what is wrong with it.
pub fn check_path(path: &str) -> Result<(), RunError> {
    let bad = |why: &str| {
        Err(RunError::new(
            ErrorKind::InvalidInput,
            format!("input file `{}`: {why}", printable(path)),
        ))
    };
    if path.is_empty() {
        return bad("the path is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return bad(&format!("the path is longer than {MAX_PATH_BYTES} bytes"));
    }
    if path.chars().any(|c| c == '\\' || c.is_control()) {
        return bad("the path holds a backslash or a control character");
    }
    if path.starts_with('/') {
        return bad("the path is absolute; give it relative to the working directory");
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() > MAX_DEPTH {
        return bad(&format!(
            "the path is nested deeper than {MAX_DEPTH} levels"
        ));
    }
    for part in &parts {
        match *part {
            "" => return bad("the path has an empty component (`//`, or a trailing `/`)"),
            "." | ".." => return bad("the path has a `.` or `..` component"),
            p if p.len() > MAX_NAME_BYTES => {
                return bad(&format!(
                    "a component is longer than {MAX_NAME_BYTES} bytes"
                ));
            }
            _ => {}
        }
    }
    // The platform's own reading of the path must agree: plain names only (on Windows this
    // also refuses drive prefixes such as `C:x`).
    if !Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return bad("the path is not a plain relative path on this host");
    }
    Ok(())
}

/// Checks a run's input files against each other and the budgets, before anything is
/// written.
///
/// # Errors
///
/// An `invalid_input` [`RunError`]: a bad path, a path given twice or both as a file and a
/// directory, more bytes than `max_input_bytes`, a file over `max_file_bytes`, or more
/// entries than `max_files`.
pub fn check_inputs(files: &[InputFile], limits: &Limits) -> Result<(), RunError> {
    let invalid = |m: String| Err(RunError::new(ErrorKind::InvalidInput, m));
    let mut total = 0u64;
    let mut entries = std::collections::BTreeSet::new();
    let mut files_seen = std::collections::BTreeSet::new();
    for file in files {
        check_path(&file.path)?;
        let size = file.bytes.len() as u64;
        if size > limits.max_file_bytes() {
            return invalid(format!(
                "input file `{}` is {size} bytes; the limit for one file is {}",
                printable(&file.path),
                limits.max_file_bytes()
            ));
        }
        total = total.saturating_add(size);
        if !files_seen.insert(file.path.as_str()) {
            return invalid(format!(
                "input file `{}` is given twice",
                printable(&file.path)
            ));
        }
        let mut prefix = String::new();
        for part in file.path.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            entries.insert(prefix.clone());
        }
    }
    if let Some(both) = files_seen
        .iter()
        .find(|f| files_seen.iter().any(|g| g.starts_with(&format!("{f}/"))))
    {
        return invalid(format!(
            "input file `{}` is also a directory of another input",
            printable(both)
        ));
    }
    if total > limits.max_input_bytes() {
        return invalid(format!(
            "the input files are {total} bytes; the limit is {}",
            limits.max_input_bytes()
        ));
    }
    if entries.len() as u64 > u64::from(limits.max_files()) {
        return invalid(format!(
            "the input files make {} files and directories; the limit is {}",
            entries.len(),
            limits.max_files()
        ));
    }
    Ok(())
}

/// What the guest has spent of a scratch directory's budgets. Shared by the directory and
/// every stream writing into it; the counters only grow (a deleted file gives nothing back:
/// the budget counts what was written, and so bounds what the host's disk ever held).
#[derive(Debug)]
pub(crate) struct Usage {
    max_written: u64,
    max_file: u64,
    max_entries: u32,
    written: AtomicU64,
    entries: AtomicU32,
    /// Writes and entries refused, and (as `Refusal as u8 + 1`) the kind of the first.
    refused: AtomicU32,
    first_refusal: std::sync::atomic::AtomicU8,
}

/// Why the guest may not write what it asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The directory's budget (bytes written, or entries) is spent: `ENOSPC`.
    NoSpace,
    /// The file would grow past the size of one file: `EFBIG`.
    FileTooLarge,
}

impl Usage {
    /// The budgets of `limits`, with `entries` already taken (by the input files).
    pub(crate) fn new(limits: &Limits, entries: u32) -> Self {
        Usage {
            max_written: limits.max_written_bytes(),
            max_file: limits.max_file_bytes(),
            max_entries: limits.max_files(),
            written: AtomicU64::new(0),
            entries: AtomicU32::new(entries),
            refused: AtomicU32::new(0),
            first_refusal: std::sync::atomic::AtomicU8::new(0),
        }
    }

    fn refuse(&self, refusal: Refusal) -> Refusal {
        self.refused.fetch_add(1, Ordering::SeqCst);
        let _ = self.first_refusal.compare_exchange(
            0,
            refusal as u8 + 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        refusal
    }

    /// Forgets the refusals so far: a session's next run reports its own.
    pub(crate) fn clear_refusals(&self) {
        self.refused.store(0, Ordering::SeqCst);
        self.first_refusal.store(0, Ordering::SeqCst);
    }

    /// How many writes were refused, and what the first was: for the notice a run's stderr
    /// gets.
    pub(crate) fn refusals(&self) -> (u32, Option<Refusal>) {
        let first = match self.first_refusal.load(Ordering::SeqCst) {
            1 => Some(Refusal::NoSpace),
            2 => Some(Refusal::FileTooLarge),
            _ => None,
        };
        (self.refused.load(Ordering::SeqCst), first)
    }

    /// The note a run's stderr gets when `count` writes were refused, `first` being the
    /// first: the guest saw only an `OSError` (through a file stream, WASI's libc reports
    /// every refused write as `EIO`), so the reason is said here, with the limit.
    pub(crate) fn notice(&self, count: u32, first: Refusal) -> String {
        let why = match first {
            Refusal::NoSpace => format!(
                "the file budget is spent ({} bytes written of max_written_bytes {}, or \
                 max_files {} reached)",
                self.written.load(Ordering::SeqCst),
                self.max_written,
                self.max_entries
            ),
            Refusal::FileTooLarge => format!(
                "a file would have grown past max_file_bytes ({})",
                self.max_file
            ),
        };
        format!("\n[pycage: {count} file write(s) refused: {why}]\n")
    }

    /// True when no byte more may be written.
    pub(crate) fn spent(&self) -> bool {
        self.written.load(Ordering::SeqCst) >= self.max_written
    }

    /// Takes `len` bytes of the write budget for a write that ends at `end` in its file.
    pub(crate) fn write(&self, end: u64, len: u64) -> Result<(), Refusal> {
        if end > self.max_file {
            return Err(self.refuse(Refusal::FileTooLarge));
        }
        self.written
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                w.checked_add(len).filter(|&n| n <= self.max_written)
            })
            .map(drop)
            .map_err(|_| self.refuse(Refusal::NoSpace))
    }

    /// Takes one entry (a file, directory or link the guest creates).
    pub(crate) fn add_entry(&self) -> Result<(), Refusal> {
        self.entries
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                e.checked_add(1).filter(|&n| n <= self.max_entries)
            })
            .map(drop)
            .map_err(|_| self.refuse(Refusal::NoSpace))
    }

    /// Takes one entry for an input file placed by the host (a refusal here is the
    /// request's, not a guest write's).
    pub(crate) fn take_input_entry(&self) -> bool {
        self.entries
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                e.checked_add(1).filter(|&n| n <= self.max_entries)
            })
            .is_ok()
    }

    /// Bytes written so far.
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }
}

/// A peer-supplied text made safe for messages: control characters escaped, at most 80
/// characters.
fn printable(text: &str) -> String {
    let mut out: String = text.chars().take(80).flat_map(char::escape_debug).collect();
    if text.chars().nth(80).is_some() {
        out.push('…');
    }
    out
}

/// Bytes as base64 text in JSON.
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// Optional bytes as base64 text (or `null`) in JSON.
mod base64_opt {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_str(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| STANDARD.decode(t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;

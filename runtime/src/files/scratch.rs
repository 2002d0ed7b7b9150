//! [`Scratch`]: one run's (or one session's) scratch directory on the host.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::{InputFile, MAX_DEPTH, OutputFile, Usage};
use crate::Limits;

/// A fresh private directory with the run's input files in it, removed with everything in it
/// when dropped. Everything in it is reached through a capability handle, never by host path.
#[derive(Debug)]
pub(crate) struct Scratch {
    path: PathBuf,
    dir: Dir,
    usage: Arc<Usage>,
    /// The inputs, by path: a produced file is one that is not among them unchanged. Their
    /// bytes are kept (they were in memory already) because comparing against them is
    /// cheaper than hashing what the file holds now.
    inputs: BTreeMap<String, InputFile>,
}

impl Scratch {
    /// Creates the directory under the system's temporary directory and writes `files` into
    /// it (checked already: [`check_inputs`](super::check_inputs)). Uses ambient authority
    /// once, to open the fresh directory.
    ///
    /// # Errors
    ///
    /// When the directory or a file cannot be created.
    pub(crate) fn create(files: Vec<InputFile>, limits: &Limits) -> std::io::Result<Scratch> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("pycage-work-");
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700));
        let path = builder.tempdir()?.keep();
        Self::open(path.clone(), files, limits).inspect_err(|_| {
            // Removed here: a Scratch that was never made has no drop to do it.
            let _ = std::fs::remove_dir_all(&path);
        })
    }

    fn open(path: PathBuf, files: Vec<InputFile>, limits: &Limits) -> std::io::Result<Scratch> {
        let dir = Dir::open_ambient_dir(&path, ambient_authority())?;
        let mut inputs = BTreeMap::new();
        let mut entries = std::collections::BTreeSet::new();
        for file in files {
            if let Some((parent, _)) = file.path.clone().rsplit_once('/') {
                dir.create_dir_all(parent)?;
                let mut prefix = String::new();
                for part in parent.split('/') {
                    if !prefix.is_empty() {
                        prefix.push('/');
                    }
                    prefix.push_str(part);
                    entries.insert(prefix.clone());
                }
            }
            entries.insert(file.path.clone());
            let mut f = dir.create(&file.path)?;
            f.write_all(&file.bytes)?;
            inputs.insert(file.path.clone(), file);
        }
        let taken = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        Ok(Scratch {
            path,
            dir,
            usage: Arc::new(Usage::new(limits, taken)),
            inputs,
        })
    }

    /// The directory's host path: for a bind mount, never shown to the guest.
    #[cfg(test)]
    pub(crate) fn host_path(&self) -> &std::path::Path {
        &self.path
    }

    /// A handle to the directory, for a WASI preopen.
    ///
    /// # Errors
    ///
    /// When the handle cannot be duplicated.
    pub(crate) fn handle(&self) -> std::io::Result<std::fs::File> {
        Ok(self.dir.try_clone()?.into_std_file())
    }

    /// What the guest has spent of the directory's budgets.
    pub(crate) fn usage(&self) -> &Arc<Usage> {
        &self.usage
    }

    /// The files the code created or changed, sorted by path, with their bytes while the
    /// total stays within `max_returned` (the rest are listed with their size only).
    ///
    /// Walks the directory through its handle, at most [`MAX_DEPTH`] deep, and takes regular
    /// files only: a symbolic link is never followed, whatever it points to.
    pub(crate) fn produced(&self, max_returned: u64) -> Vec<OutputFile> {
        let mut found = Vec::new();
        walk(&self.dir, "", 0, &mut found);
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut returned = 0u64;
        let mut out = Vec::new();
        for (path, size) in found {
            let same_size = self
                .inputs
                .get(&path)
                .filter(|f| f.bytes.len() as u64 == size);
            let fits = returned.saturating_add(size) <= max_returned;
            let read = if same_size.is_some() || fits {
                read_file(&self.dir, &path, size)
            } else {
                None
            };
            if let (Some(input), Some(bytes)) = (same_size, &read)
                && input.bytes == *bytes
            {
                continue; // an input, as it came in
            }
            let bytes = read.filter(|_| fits);
            if let Some(b) = &bytes {
                returned += b.len() as u64;
            }
            out.push(OutputFile { path, size, bytes });
        }
        out
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(error = %e, "pycage: could not remove a scratch directory");
        }
    }
}

/// Collects `(path, size)` of the regular files under `dir`, without following links.
fn walk(dir: &Dir, prefix: &str, depth: usize, found: &mut Vec<(String, u64)>) {
    let Ok(entries) = dir.entries() else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        // `DirEntry::file_type` and `metadata` do not follow a symbolic link.
        let Ok(ty) = entry.file_type() else {
            continue;
        };
        if ty.is_file() {
            if let Ok(meta) = entry.metadata() {
                found.push((path, meta.len()));
            }
        } else if ty.is_dir()
            && depth + 1 < MAX_DEPTH
            && let Ok(sub) = entry.open_dir()
        {
            walk(&sub, &path, depth + 1, found);
        }
    }
}

/// A regular file's bytes, read through the directory handle, at most `size` of them (the
/// size it had when the walk found it).
fn read_file(dir: &Dir, path: &str, size: u64) -> Option<Vec<u8>> {
    let file = dir.open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(size).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

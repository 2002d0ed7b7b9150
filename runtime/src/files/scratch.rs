//! [`Scratch`]: one run's (or one session's) scratch directory on the host.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use super::{InputFile, MAX_DEPTH, OutputFile, Usage};
use crate::Limits;

/// A fresh private directory with the run's input files in it, removed with everything in it
/// when dropped. Everything in it is reached through a capability handle, never by host path.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// The host path to remove on drop; `None` for a directory the host only holds a handle
    /// to (a bubblewrap guest's tmpfs, which goes when the last handle closes).
    path: Option<PathBuf>,
    dir: Dir,
    usage: Arc<Usage>,
    /// The inputs, by path: a produced file is one that is not among them unchanged. Their
    /// bytes are kept (they were in memory already) because comparing against them is
    /// cheaper than hashing what the file holds now.
    inputs: BTreeMap<String, InputFile>,
    /// In a session, what each file was (size, modification time) when the last run ended: a
    /// later run's produced files are the ones it created or changed.
    baseline: BTreeMap<String, Stamp>,
}

/// A file's size and modification time, as the walk saw them.
type Stamp = (u64, Option<SystemTime>);

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
        Dir::open_ambient_dir(&path, ambient_authority())
            .and_then(|dir| Self::fill(Some(path.clone()), dir, files, limits))
            .inspect_err(|_| {
                // Removed here: a Scratch that was never made has no drop to do it.
                let _ = std::fs::remove_dir_all(&path);
            })
    }

    /// A scratch directory over `dir`, a directory the host holds only by its handle (it has
    /// no host path, and nothing is removed on drop), with `files` written into it (checked
    /// already: [`check_inputs`](super::check_inputs)).
    ///
    /// # Errors
    ///
    /// When a file cannot be created.
    #[cfg(unix)]
    pub(crate) fn adopt(
        dir: Dir,
        files: Vec<InputFile>,
        limits: &Limits,
    ) -> std::io::Result<Scratch> {
        Self::fill(None, dir, files, limits)
    }

    fn fill(
        path: Option<PathBuf>,
        dir: Dir,
        files: Vec<InputFile>,
        limits: &Limits,
    ) -> std::io::Result<Scratch> {
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
            baseline: BTreeMap::new(),
        })
    }

    /// Writes a session run's input files into the directory (replacing files of the same
    /// name), counting new entries against the directory's budget of entries.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the directory would hold more entries than its budget; otherwise
    /// when a file cannot be written.
    pub(crate) fn add_inputs(&mut self, files: Vec<InputFile>) -> std::io::Result<()> {
        for file in files {
            if let Some((parent, _)) = file.path.rsplit_once('/') {
                let mut prefix = String::new();
                for part in parent.split('/') {
                    if !prefix.is_empty() {
                        prefix.push('/');
                    }
                    prefix.push_str(part);
                    if !self.dir.exists(&prefix) && !self.usage.take_input_entry() {
                        return Err(too_many_entries());
                    }
                }
                self.dir.create_dir_all(parent)?;
            }
            if !self.dir.exists(&file.path) && !self.usage.take_input_entry() {
                return Err(too_many_entries());
            }
            // Between a native session's runs, threads the code left may have put anything
            // at this name: a link or a FIFO is replaced (opening a FIFO could block the
            // host), a directory is refused, and the file is opened without blocking.
            if let Ok(meta) = self.dir.symlink_metadata(&file.path)
                && !meta.is_file()
            {
                if meta.is_dir() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "an input file's name is a directory in the session's directory",
                    ));
                }
                self.dir.remove_file(&file.path)?;
            }
            let mut f = self.dir.open_with(&file.path, &never_blocking(true))?;
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::other("an input file's name is not a file"));
            }
            f.write_all(&file.bytes)?;
            self.inputs.insert(file.path.clone(), file);
        }
        Ok(())
    }

    /// Marks what the directory holds now as the session's state: the next
    /// [`produced`](Self::produced) lists only the files created or changed after this.
    pub(crate) fn rebase(&mut self) {
        self.rebase_within(usize::MAX);
    }

    /// As [`rebase`](Self::rebase), looking at no more than `max_entries` entries (as
    /// [`produced_within`](Self::produced_within)).
    pub(crate) fn rebase_within(&mut self, max_entries: usize) {
        let mut found = Vec::new();
        let mut budget = max_entries;
        walk(&self.dir, "", 0, &mut budget, &mut found);
        self.baseline = found
            .into_iter()
            .map(|(path, size, modified)| (path, (size, modified)))
            .collect();
        self.inputs.clear();
    }

    /// The directory's host path: for a bind mount, never shown to the guest.
    #[cfg(test)]
    pub(crate) fn host_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
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
        self.produced_within(max_returned, usize::MAX).0
    }

    /// As [`produced`](Self::produced), looking at no more than `max_entries` entries
    /// (files, directories, links, ...) of the directory; true with the files when there
    /// were more, which are then not listed. For a directory whose count of entries the host
    /// could not bound while the guest wrote (a native guest's tmpfs): the walk, and the
    /// host memory it takes, stay bounded whatever the guest left.
    pub(crate) fn produced_within(
        &self,
        max_returned: u64,
        max_entries: usize,
    ) -> (Vec<OutputFile>, bool) {
        let mut found = Vec::new();
        let mut budget = max_entries;
        let overflow = !walk(&self.dir, "", 0, &mut budget, &mut found);
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let mut returned = 0u64;
        let mut out = Vec::new();
        for (path, size, modified) in found {
            if modified.is_some() && self.baseline.get(&path) == Some(&(size, modified)) {
                continue; // as the session's last run left it
            }
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
        (out, overflow)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(path) = &self.path else {
            return; // held by its handle only: it goes with the handle
        };
        if let Err(e) = std::fs::remove_dir_all(path) {
            tracing::warn!(error = %e, "pycage: could not remove a scratch directory");
        }
    }
}

/// Collects `(path, size, modified)` of the regular files under `dir`, without following
/// links, looking at no more than `budget` entries; false when there were more.
fn walk(
    dir: &Dir,
    prefix: &str,
    depth: usize,
    budget: &mut usize,
    found: &mut Vec<(String, u64, Option<SystemTime>)>,
) -> bool {
    let Ok(entries) = dir.entries() else {
        return true;
    };
    for entry in entries.flatten() {
        let Some(left) = budget.checked_sub(1) else {
            return false;
        };
        *budget = left;
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
                found.push((path, meta.len(), meta.modified().ok().map(|t| t.into_std())));
            }
        } else if ty.is_dir()
            && depth + 1 < MAX_DEPTH
            && let Ok(sub) = entry.open_dir()
            && !walk(&sub, &path, depth + 1, budget, found)
        {
            return false;
        }
    }
    true
}

/// Options that open a file for reading (or, with `write`, create or truncate it for
/// writing) without ever blocking: on Unix with `O_NONBLOCK`, so a FIFO in the file's place
/// fails or opens at once instead of waiting for its other end.
fn never_blocking(write: bool) -> cap_std::fs::OpenOptions {
    let mut options = cap_std::fs::OpenOptions::new();
    if write {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    #[cfg(unix)]
    {
        use cap_std::fs::OpenOptionsExt as _;
        #[allow(
            clippy::cast_possible_wrap,
            reason = "O_NONBLOCK is a small positive flag"
        )]
        options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    }
    options
}

fn too_many_entries() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "the session's scratch directory would hold more files than its budget",
    )
}

/// A regular file's bytes, read through the directory handle, at most `size` of them (the
/// size it had when the walk found it).
fn read_file(dir: &Dir, path: &str, size: u64) -> Option<Vec<u8>> {
    let file = dir.open_with(path, &never_blocking(false)).ok()?;
    // What the walk saw as a regular file may have been replaced since (by threads a
    // native session's code left running): only a regular file is read.
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(size).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

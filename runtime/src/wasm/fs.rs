//! The guest's `wasi:filesystem`: wasmtime-wasi's own implementation (cap-std handles, so no
//! path leads out of the preopen), with the scratch directory's budgets in front of it.
//!
//! # Security
//!
//! wasmtime-wasi's preopened directories have no write budget: a guest could fill the host's
//! disk. Every call that can grow the directory passes [`Usage`] first, on the host: `write`,
//! the streams of `write-via-stream` and `append-via-stream` (each write they carry),
//! `set-size`, and every call that adds an entry (`open-at` that creates, `create-directory-at`,
//! `symlink-at`, `link-at`). The file streams are this module's own (see [`ScratchReader`]).
//! A refused write is `insufficient-space` (`ENOSPC` in the guest)
//! or `file-too-large` (`EFBIG`): ordinary `OSError`s the code can catch. Everything else goes
//! to wasmtime-wasi unchanged.
//!
//! The scratch directory is created when the guest first asks for its preopens (a run that
//! never touches a file costs no directory), or before the run when it has input files. It
//! appears at [`GUEST_DIR`]; its host path is never shown.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, Dir, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{FsError, FsResult};
use wasmtime_wasi::{FsPerms, OpenMode};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{
    DynInputStream, DynOutputStream, InputStream, OutputStream, StreamError,
};

use crate::files::{GUEST_DIR, Refusal, Scratch, Usage};
use crate::{ErrorKind, RunError};

/// The `HasData` of the budgeted filesystem.
pub(crate) struct ScratchFs;

impl HasData for ScratchFs {
    type Data<'a> = ScratchView<'a>;
}

/// One store's filesystem: wasmtime-wasi's view, and the run's scratch directory.
pub(crate) struct ScratchView<'a> {
    pub fs: WasiFilesystemCtxView<'a>,
    pub scratch: &'a mut ScratchSlot,
}

/// A store's scratch directory: not wanted (no file budget to spend), not made yet, or made.
#[derive(Debug, Default)]
pub(crate) enum ScratchSlot {
    /// The store gives the guest no directory (an instance made before its run was known).
    #[default]
    None,
    /// Made on the guest's first look at its preopens, with these limits.
    Lazy(crate::Limits),
    /// Made.
    Ready(Scratch),
    /// Making it failed (logged); the guest sees no directory.
    Failed,
}

impl ScratchSlot {
    /// The directory, once made.
    pub(crate) fn get(&self) -> Option<&Scratch> {
        match self {
            ScratchSlot::Ready(s) => Some(s),
            _ => None,
        }
    }

    fn ensure(&mut self) -> Option<&Scratch> {
        if let ScratchSlot::Lazy(limits) = self {
            *self = match Scratch::create(Vec::new(), limits) {
                Ok(s) => ScratchSlot::Ready(s),
                Err(e) => {
                    tracing::error!(error = %e, "pycage: the scratch directory could not be made");
                    ScratchSlot::Failed
                }
            };
        }
        self.get()
    }

    /// Sets the directory up for a run with input `files`. A one-shot run gets a fresh one
    /// (made now when there are inputs, else on the guest's first look at the file system:
    /// most runs never look). A session run uses the session's, adding the inputs to it.
    pub(crate) fn place(
        &mut self,
        files: Vec<crate::InputFile>,
        limits: &crate::Limits,
        session: bool,
    ) -> Result<(), RunError> {
        let made = |e: std::io::Error| {
            tracing::error!(error = %e, "pycage: the scratch directory could not be made");
            RunError::new(
                ErrorKind::BackendError,
                "the run's scratch directory could not be made",
            )
        };
        if !session {
            *self = if files.is_empty() {
                ScratchSlot::Lazy(limits.clone())
            } else {
                ScratchSlot::Ready(Scratch::create(files, limits).map_err(made)?)
            };
            return Ok(());
        }
        if let ScratchSlot::Ready(scratch) = self {
            scratch.usage().clear_refusals();
        }
        if files.is_empty() {
            return Ok(());
        }
        match self {
            ScratchSlot::Lazy(session_limits) => {
                *self = ScratchSlot::Ready(Scratch::create(files, session_limits).map_err(made)?);
                Ok(())
            }
            ScratchSlot::Ready(scratch) => scratch.add_inputs(files).map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    RunError::new(ErrorKind::InvalidInput, e.to_string())
                } else {
                    made(e)
                }
            }),
            ScratchSlot::None | ScratchSlot::Failed => Err(RunError::new(
                ErrorKind::BackendError,
                "the session's scratch directory is unavailable",
            )),
        }
    }

    fn usage(&self) -> Option<Arc<Usage>> {
        self.get().map(|s| s.usage().clone())
    }
}

/// A write the budgets refused, carried inside a stream's error so that
/// `filesystem-error-code` can name it.
#[derive(Debug, Clone, Copy)]
struct Refused(Refusal);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Refusal::NoSpace => f.write_str("the scratch directory's budget is spent"),
            Refusal::FileTooLarge => f.write_str("the file would pass the size of one file"),
        }
    }
}

impl std::error::Error for Refused {}

fn code(refusal: Refusal) -> ErrorCode {
    match refusal {
        Refusal::NoSpace => ErrorCode::InsufficientSpace,
        Refusal::FileTooLarge => ErrorCode::FileTooLarge,
    }
}

fn refused(refusal: Refusal) -> FsError {
    code(refusal).into()
}

impl ScratchView<'_> {
    /// Takes one entry of the budget if `path` under `fd` does not exist yet.
    async fn take_entry_for(
        &mut self,
        fd: &Resource<types::Descriptor>,
        path: &str,
    ) -> FsResult<()> {
        let Some(usage) = self.scratch.usage() else {
            return Ok(());
        };
        let exists = HostDescriptor::stat_at(
            &mut self.fs,
            Resource::new_borrow(fd.rep()),
            types::PathFlags::empty(),
            path.to_owned(),
        )
        .await
        .is_ok();
        if exists {
            return Ok(());
        }
        usage.add_entry().map_err(refused)
    }

    /// The file behind `fd`, for a stream of ours.
    fn file(&mut self, fd: &Resource<types::Descriptor>) -> FsResult<Arc<std::fs::File>> {
        match self.fs.table.get(fd)? {
            Descriptor::File(f) => Ok(f.file.clone()),
            Descriptor::Dir(_) => Err(ErrorCode::IsDirectory.into()),
        }
    }

    /// A stream writing `fd` at `at`, each write charged to the budgets.
    fn writer(
        &mut self,
        fd: Resource<types::Descriptor>,
        at: WriteAt,
    ) -> FsResult<Resource<DynOutputStream>> {
        let Some(usage) = self.scratch.usage() else {
            return Err(ErrorCode::NotPermitted.into());
        };
        let file = self.file(&fd)?;
        let stream: DynOutputStream = Box::new(ScratchWriter { file, at, usage });
        Ok(self.fs.table.push(stream)?)
    }
}

impl preopens::Host for ScratchView<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let Some(scratch) = self.scratch.ensure() else {
            return Ok(Vec::new());
        };
        let mut preopens = Vec::with_capacity(2);
        // The directory is the guest's root, so its working directory (`/`, which a run
        // never changes: `chdir` would reach for the directory on every run) is the scratch
        // directory, and relative paths land there; and it is `/work` too, the path every
        // backend shows.
        for name in ["/", GUEST_DIR] {
            // Blocking calls on the current thread: the directory is local and the calls are
            // short; a blocking-pool hop would cost more than most of them.
            let dir = Dir::new(
                scratch.handle()?,
                FsPerms::ReadWrite,
                OpenMode::READ | OpenMode::WRITE,
                true,
            );
            preopens.push((self.fs.table.push(Descriptor::Dir(dir))?, name.to_owned()));
        }
        Ok(preopens)
    }
}

impl types::Host for ScratchView<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        if let Some(Refused(refusal)) = self.fs.table.get(&err)?.downcast_ref::<Refused>() {
            return Ok(Some(code(*refusal)));
        }
        types::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl HostDescriptor for ScratchView<'_> {
    async fn advise(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        HostDescriptor::advise(&mut self.fs, fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        HostDescriptor::sync_data(&mut self.fs, fd).await
    }

    async fn get_flags(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorFlags> {
        HostDescriptor::get_flags(&mut self.fs, fd).await
    }

    async fn get_type(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorType> {
        HostDescriptor::get_type(&mut self.fs, fd).await
    }

    async fn set_size(
        &mut self,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        if let Some(usage) = self.scratch.usage() {
            let now = HostDescriptor::stat(&mut self.fs, Resource::new_borrow(fd.rep()))
                .await?
                .size;
            // Growing a file counts as writing the bytes it gains.
            if size > now {
                usage.write(size, size - now).map_err(refused)?;
            }
        }
        HostDescriptor::set_size(&mut self.fs, fd, size).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<types::Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times(&mut self.fs, fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<types::Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        HostDescriptor::read(&mut self.fs, fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<types::Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        if let Some(usage) = self.scratch.usage() {
            let len = buf.len() as u64;
            usage
                .write(offset.saturating_add(len), len)
                .map_err(refused)?;
        }
        HostDescriptor::write(&mut self.fs, fd, buf, offset).await
    }

    async fn read_directory(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        HostDescriptor::read_directory(&mut self.fs, fd).await
    }

    async fn sync(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        HostDescriptor::sync(&mut self.fs, fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.take_entry_for(&fd, &path).await?;
        HostDescriptor::create_directory_at(&mut self.fs, fd, path).await
    }

    async fn stat(&mut self, fd: Resource<types::Descriptor>) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat(&mut self.fs, fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.take_entry_for(&new_descriptor, &new_path).await?;
        HostDescriptor::link_at(
            &mut self.fs,
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
        .await
    }

    async fn open_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<types::Descriptor>> {
        if oflags.contains(types::OpenFlags::CREATE) {
            self.take_entry_for(&fd, &path).await?;
        }
        // With the write budget spent, opening to write fails at once, with its real
        // reason (a write through the file's stream could only say `EIO`).
        if let Some(usage) = self.scratch.usage()
            && usage.spent()
            && (flags.contains(types::DescriptorFlags::WRITE)
                || oflags.contains(types::OpenFlags::TRUNCATE))
        {
            return Err(refused(Refusal::NoSpace));
        }
        HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, oflags, flags).await
    }

    fn drop(&mut self, fd: Resource<types::Descriptor>) -> wasmtime::Result<()> {
        HostDescriptor::drop(&mut self.fs, fd)
    }

    async fn readlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<String> {
        HostDescriptor::readlink_at(&mut self.fs, fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        HostDescriptor::remove_directory_at(&mut self.fs, fd, path).await
    }

    async fn rename_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path).await
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.take_entry_for(&fd, &dest_path).await?;
        HostDescriptor::symlink_at(&mut self.fs, fd, src_path, dest_path).await
    }

    async fn unlink_file_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        HostDescriptor::unlink_file_at(&mut self.fs, fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        let file = self.file(&fd)?;
        let stream: DynInputStream = Box::new(ScratchReader {
            file,
            position: offset,
        });
        Ok(self.fs.table.push(stream)?)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        self.writer(fd, WriteAt::Offset(offset))
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        self.writer(fd, WriteAt::End)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<types::Descriptor>,
        b: Resource<types::Descriptor>,
    ) -> wasmtime::Result<bool> {
        HostDescriptor::is_same_object(&mut self.fs, a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash(&mut self.fs, fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for ScratchView<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream).await
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

/// The most bytes one stream read or write moves: bounds the host's transient copy.
const STREAM_CHUNK: usize = 1 << 20;

/// The file streams of the scratch directory, in place of wasmtime-wasi's: those move every
/// read and write through tokio's blocking pool and answer the guest "not yet" first, so a
/// 64 KiB read cost about 250 us (a 10 MiB file: 40 ms to read, 60 ms to write; measured with
/// `pycage bench --only files_10mib`). These read and write the local file on the calling
/// thread, up to [`STREAM_CHUNK`] a call, and are always ready.
struct ScratchReader {
    file: Arc<std::fs::File>,
    position: u64,
}

#[wasmtime_wasi::async_trait]
impl Pollable for ScratchReader {
    async fn ready(&mut self) {}
}

impl InputStream for ScratchReader {
    fn read(&mut self, size: usize) -> Result<Bytes, StreamError> {
        if size == 0 {
            return Ok(Bytes::new());
        }
        let mut buf = vec![0u8; size.min(STREAM_CHUNK)];
        let n = read_at(&self.file, &mut buf, self.position)
            .map_err(|e| StreamError::LastOperationFailed(e.into()))?;
        if n == 0 {
            return Err(StreamError::Closed);
        }
        buf.truncate(n);
        self.position += n as u64;
        Ok(buf.into())
    }
}

/// Where a [`ScratchWriter`] writes.
enum WriteAt {
    /// At this offset, moving on with each write.
    Offset(u64),
    /// At the file's end, whatever it is at each write.
    End,
}

/// A file's output stream, each write charged to the directory's budgets before it reaches
/// the file.
struct ScratchWriter {
    file: Arc<std::fs::File>,
    at: WriteAt,
    usage: Arc<Usage>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for ScratchWriter {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for ScratchWriter {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        let failed = |e: std::io::Error| StreamError::LastOperationFailed(e.into());
        let position = match self.at {
            WriteAt::Offset(o) => o,
            WriteAt::End => self.file.metadata().map_err(failed)?.len(),
        };
        let len = bytes.len() as u64;
        let end = position.saturating_add(len);
        self.usage
            .write(end, len)
            .map_err(|r| StreamError::LastOperationFailed(wasmtime::Error::new(Refused(r))))?;
        write_all_at(&self.file, &bytes, position).map_err(failed)?;
        if let WriteAt::Offset(o) = &mut self.at {
            *o = end;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(STREAM_CHUNK)
    }
}

#[cfg(unix)]
fn read_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, at)
}

#[cfg(windows)]
fn read_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, at)
}

#[cfg(unix)]
fn write_all_at(file: &std::fs::File, buf: &[u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, at)
}

#[cfg(windows)]
fn write_all_at(file: &std::fs::File, mut buf: &[u8], mut at: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = std::os::windows::fs::FileExt::seek_write(file, buf, at)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
        at += n as u64;
    }
    Ok(())
}

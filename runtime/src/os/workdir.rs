//! A bubblewrap guest's working directory: a size-capped tmpfs made inside the sandbox at
//! [`GUEST_DIR`], which the host reaches through a descriptor the guest's bootstrap hands
//! over before the code runs.
//!
//! # Why a tmpfs inside the sandbox, held by a descriptor
//!
//! A host directory bound read-write has no size cap of its own: the guest could fill the
//! host's disk (an unprivileged host cannot mount a capped file system for it either). A
//! tmpfs that bubblewrap mounts in the sandbox's mount namespace (`--size BYTES --tmpfs
//! /work`) is capped by the kernel: writes past it fail in the guest with `ENOSPC`, and one
//! file past `RLIMIT_FSIZE` (= `max_file_bytes`) with `EFBIG`. It lives in memory, never on
//! the host's disk, and (where the run has a cgroup) its pages count against the run's memory.
//! But it is gone from the host's view once the sandbox's mount namespace is: so the guest's
//! bootstrap, before any of the code runs, opens `/work` and sends the descriptor over
//! [`WORKDIR_SOCKET`] in the run directory. The host checks that it is a directory on a tmpfs,
//! writes the input files through it (cap-std: nothing outside it is reachable), acknowledges,
//! and after the process tree has ended reads the produced files through the same handle,
//! never following a link. An open descriptor keeps the tmpfs alive after the namespace has
//! gone; dropping the [`Scratch`] frees it. No host path is ever bound read-write, and the
//! guest never learns a host path.
//!
//! bubblewrap cannot cap a tmpfs's inodes (`nr_inodes`), so `max_files` is a count on the
//! way out: the host looks at no more than `max_files` entries and says in the run's stderr
//! when there were more (the kernel memory of empty files is bounded by the run's cgroup where
//! there is one, as for the guest's `/tmp`).
//!
//! The descriptor comes from the guest's process, but before the code runs: only the
//! bootstrap (the host's own Python, with the host's header) runs then, and the listener
//! takes one connection only. The host still trusts nothing of it but that it is a directory
//! on a tmpfs: anything the guest could put there, it could have written anyway.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use cap_std::fs::Dir;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::files::{GUEST_DIR, Scratch};
use crate::{InputFile, Limits};

/// The socket's file name in the run directory.
pub const WORKDIR_SOCKET: &str = "workdir.sock";

/// The tmpfs file system type, as `statfs` reports it.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// The size of a session's `/work` tmpfs: every run's inputs (within `max_input_bytes`
/// together) plus `max_written_bytes`, for the session's life.
pub(crate) fn session_work_bytes(limits: &Limits) -> u64 {
    limits
        .max_input_bytes()
        .saturating_add(limits.max_written_bytes())
        .max(1)
}

/// What a run's stderr gets when its working directory held more than `max_files` entries:
/// the files past them are not returned.
pub(crate) fn overflow_notice(max_files: usize) -> String {
    format!(
        "\n[pycage: the working directory holds more than max_files ({max_files}) files and \
         directories; the files past them are not returned]\n"
    )
}

/// How the descriptor is received: close-on-exec from the start where the OS can (Linux, the
/// one OS bubblewrap runs on; this module also compiles on the other Unixes).
#[cfg(target_os = "linux")]
const RECV_FLAGS: RecvFlags = RecvFlags::CMSG_CLOEXEC;
#[cfg(not(target_os = "linux"))]
const RECV_FLAGS: RecvFlags = RecvFlags::empty();

/// The byte the host sends once the inputs are in place: the bootstrap waits for it.
const READY: u8 = b'k';

/// The size of a run's `/work` tmpfs: its inputs plus `max_written_bytes` (the kernel rounds
/// it up to whole pages, and counts each file's bytes in pages).
pub(crate) fn work_bytes(files: &[InputFile], limits: &Limits) -> u64 {
    let inputs: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
    inputs.saturating_add(limits.max_written_bytes()).max(1)
}

/// The host's end of [`WORKDIR_SOCKET`]: takes one connection, receives the working
/// directory's descriptor.
#[derive(Debug)]
pub(crate) struct WorkdirListener {
    listener: UnixListener,
}

impl WorkdirListener {
    /// Binds the socket (mode 0600) in the run directory `run_dir`.
    ///
    /// # Errors
    ///
    /// When the socket cannot be bound.
    pub(crate) fn bind(run_dir: &Path) -> std::io::Result<WorkdirListener> {
        use std::os::unix::fs::PermissionsExt;

        let path: PathBuf = run_dir.join(WORKDIR_SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(WorkdirListener {
            listener: UnixListener::from_std(listener)?,
        })
    }

    /// Waits for the guest's bootstrap, receives its working directory, writes `files` into
    /// it and tells the guest to go on.
    ///
    /// # Errors
    ///
    /// When the peer sends no descriptor, or one that is not a directory on a tmpfs, or the
    /// inputs cannot be written.
    pub(crate) async fn receive(
        self,
        files: Vec<InputFile>,
        limits: Limits,
    ) -> std::io::Result<Scratch> {
        let (mut stream, _) = self.listener.accept().await?;
        // One connection only: nothing later (the code) reaches this socket.
        drop(self.listener);
        let fd = receive_fd(&stream).await?;
        let dir = check_workdir(fd)?;
        let scratch =
            tokio::task::spawn_blocking(move || Scratch::adopt(dir, files, &limits)).await??;
        stream.write_all(&[READY]).await?;
        Ok(scratch)
    }
}

/// The one descriptor of the first message on `stream`.
async fn receive_fd(stream: &UnixStream) -> std::io::Result<OwnedFd> {
    loop {
        stream.readable().await?;
        let got = stream.try_io(Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            rustix::net::recvmsg(
                stream,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RECV_FLAGS,
            )?;
            let mut fds = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            Ok(fds)
        });
        match got {
            Ok(mut fds) if fds.len() == 1 => return Ok(fds.remove(0)),
            Ok(_) => {
                return Err(std::io::Error::other(
                    "the guest sent no working directory (or more than one descriptor)",
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// `fd` as a directory handle, when it is a directory on a tmpfs (the sandbox's own: the
/// guest can mount nothing, and binds nothing of the host's read-write).
fn check_workdir(fd: OwnedFd) -> std::io::Result<Dir> {
    let stat = rustix::fs::fstatfs(&fd)?;
    #[allow(
        clippy::unnecessary_cast,
        reason = "the field's type differs between targets"
    )]
    let fs_type = stat.f_type as u64;
    if fs_type != TMPFS_MAGIC {
        return Err(std::io::Error::other(format!(
            "the guest's {GUEST_DIR} is not a tmpfs"
        )));
    }
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_dir() {
        return Err(std::io::Error::other(format!(
            "the guest's {GUEST_DIR} is not a directory"
        )));
    }
    Ok(Dir::from_std_file(file))
}

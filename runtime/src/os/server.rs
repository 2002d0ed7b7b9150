//! [`SocketServer`]: the host end of a run's private Unix socket, forwarding the guest's tool
//! calls to the run's broker.
//!
//! # Security
//!
//! The socket has mode 0600 inside a directory of mode 0700 (see [`RunDir`]). What the server
//! does with each connection (frame caps, the byte budget, the token check, the end of the
//! run) is in the `os::serve` module, shared with the Windows named pipe.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};

use super::protocol::Outcome;
use super::run_dir::RunDir;
use super::serve::{self, Shared};
use super::token::Token;
use crate::Limits;
use crate::broker::ToolGate;

pub use super::serve::{MAX_CONNECTIONS, MAX_IN_FLIGHT};

/// The host end of one run's socket. Stops serving (and closes every connection) when
/// dropped; the run directory goes with it.
pub struct SocketServer {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    // Declared last: dropped after the accept task is aborted.
    dir: RunDir,
}

impl std::fmt::Debug for SocketServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketServer")
            .field("dir", &self.dir)
            .field("cap", &self.shared.cap())
            .finish_non_exhaustive()
    }
}

impl SocketServer {
    /// Binds `broker.sock` (mode 0600) in `dir` and starts serving, with a fresh token.
    /// Calls go to `gate` (the run's broker); frames are capped by
    /// [`protocol::max_frame_bytes`](super::protocol::max_frame_bytes) of `limits`. Must be
    /// called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// When the token cannot be generated or the socket cannot be bound.
    pub fn start(
        dir: RunDir,
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
    ) -> std::io::Result<SocketServer> {
        Self::serve(dir, Shared::new(gate, limits)?)
    }

    /// As [`start`](Self::start), for a session's guest: its `next` requests are answered
    /// with the runs sent on the returned sender (see
    /// [`SessionJob`](super::protocol::SessionJob)), and each run begins with
    /// [`begin_run`](Self::begin_run). `gate` serves every run: the session switches it.
    pub(crate) fn start_session(
        dir: RunDir,
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
    ) -> std::io::Result<(SocketServer, mpsc::Sender<String>)> {
        let (shared, jobs) = Shared::for_session(gate, limits)?;
        Ok((Self::serve(dir, shared)?, jobs))
    }

    fn serve(dir: RunDir, shared: Shared) -> std::io::Result<SocketServer> {
        use std::os::unix::fs::PermissionsExt;

        let shared = Arc::new(shared);
        let path = dir.socket_path();
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        // The directory is 0700 already; the socket itself is owner-only too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(listener)?;
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(SocketServer {
            shared,
            accept,
            dir,
        })
    }

    /// The run directory (its host path is what a sandbox binds).
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }

    /// The token a peer must present.
    pub fn token(&self) -> &Token {
        self.shared.token()
    }

    /// The largest frame accepted.
    pub fn max_frame_bytes(&self) -> u64 {
        self.shared.cap()
    }

    /// The guest's outcome, once its result frame has arrived.
    pub fn take_outcome(&self) -> Option<Outcome> {
        self.shared.take_outcome()
    }

    /// True once the guest's result frame has arrived: later calls are refused.
    pub fn finished(&self) -> bool {
        self.shared.finished()
    }

    /// Starts a session's next run: frames capped at `cap` (the cap only grows), no outcome
    /// yet, calls accepted again.
    pub(crate) fn begin_run(&self, cap: u64) {
        self.shared.begin_run(cap);
    }

    /// Waits for the run's result frame (a session's guest lives on after sending it).
    pub(crate) async fn outcome(&self) -> Outcome {
        self.shared.outcome().await
    }

    /// The host's process id of the session's guest interpreter, once it has asked for a run.
    pub(crate) fn guest_pid(&self) -> Option<i32> {
        self.shared.guest_pid()
    }

    /// Waits until the guest asks for its next run (a session's guest is then ready).
    pub(crate) async fn asked(&self) {
        self.shared.asked().await;
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        // Dropping the accept task drops its set of connection tasks, which aborts them.
        self.accept.abort();
    }
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                // The kernel translates the peer's id into this host's pid namespace.
                let pid = stream.peer_cred().ok().and_then(|c| c.pid());
                let shared = shared.clone();
                connections.spawn(async move {
                    serve::serve_connection(stream, shared, pid).await;
                    drop(slot);
                });
            }
            Err(e) => {
                // Out of descriptors, or a peer that vanished while connecting: wait a
                // moment rather than spin.
                tracing::debug!(error = %e, "pycage: accepting a guest connection failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

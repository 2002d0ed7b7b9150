//! [`PipeServer`]: the host end of a run's named pipe, forwarding the guest's tool calls to
//! the run's gate. The Windows twin of the Unix [`SocketServer`](crate::os::SocketServer):
//! what it does with each connection is [`serve`](super::super::serve)'s, shared by both.
//! Windows only; compile-checked, never run in CI (see the backend's docs).
//!
//! # Security
//!
//! The pipe is created as the first instance of its name (someone who made it first fails
//! the run, rather than receiving the guest's connections), rejects remote clients, and
//! carries the DACL of [`acl::pipe_sddl`](super::acl::pipe_sddl): the owner and the run's
//! AppContainer only. At most [`MAX_CONNECTIONS`] instances exist at once (each waiting or
//! connected one holds a slot), which also caps any the guest could create.

use std::ffi::OsString;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::windows::named_pipe::{NamedPipeServer, PipeMode, ServerOptions};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use windows_sys::Win32::Security::SECURITY_ATTRIBUTES;

use super::super::protocol::Outcome;
use super::super::serve::{self, MAX_CONNECTIONS, Shared};
use super::super::token::Token;
use super::win32::SecurityDescriptor;
use crate::Limits;
use crate::broker::ToolGate;

// `ServerOptions::max_instances` panics from 255 on.
const _: () = assert!(MAX_CONNECTIONS < 255);

/// The host end of one run's named pipe. Stops serving (and closes every connection) when
/// dropped.
pub(super) struct PipeServer {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for PipeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipeServer")
            .field("cap", &self.shared.cap())
            .finish_non_exhaustive()
    }
}

/// Creates one instance of the pipe `name` with the descriptor `sd`.
fn instance(name: &OsString, sd: &SecurityDescriptor, first: bool) -> io::Result<NamedPipeServer> {
    let mut attributes = SECURITY_ATTRIBUTES {
        nLength: u32::try_from(size_of::<SECURITY_ATTRIBUTES>()).map_err(io::Error::other)?,
        lpSecurityDescriptor: sd.as_ptr(),
        bInheritHandle: 0,
    };
    let max = MAX_CONNECTIONS;
    // SAFETY: `attributes` is a valid SECURITY_ATTRIBUTES whose descriptor (`sd`, a
    // self-relative descriptor Windows made) outlives the call, which only reads both.
    unsafe {
        ServerOptions::new()
            .first_pipe_instance(first)
            .reject_remote_clients(true)
            .pipe_mode(PipeMode::Byte)
            .max_instances(max)
            .create_with_security_attributes_raw(name, std::ptr::from_mut(&mut attributes).cast())
    }
}

impl PipeServer {
    /// Creates the pipe `name` (`\\.\pipe\...`), the first of its name, with the
    /// descriptor `sddl`, and starts serving with a fresh token. Calls go to `gate`; frames
    /// are capped by [`protocol::max_frame_bytes`](super::super::protocol::max_frame_bytes) of
    /// `limits`. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// When the token cannot be generated, the descriptor is refused, or the pipe cannot be
    /// created (among others: because a pipe of that name exists).
    pub(super) fn start(
        name: &str,
        sddl: &str,
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
    ) -> io::Result<PipeServer> {
        let shared = Arc::new(Shared::new(gate, limits)?);
        let sd = SecurityDescriptor::from_sddl(sddl)?;
        let name = OsString::from(name);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let slot = slots
            .clone()
            .try_acquire_owned()
            .map_err(io::Error::other)?;
        let first = instance(&name, &sd, true)?;
        let accept = tokio::spawn(accept_loop(
            Listening {
                server: first,
                slot,
            },
            Instances { name, sd, slots },
            shared.clone(),
        ));
        Ok(PipeServer { shared, accept })
    }

    /// The token a peer must present.
    pub(super) fn token(&self) -> &Token {
        self.shared.token()
    }

    /// The guest's outcome, once its result frame has arrived.
    pub(super) fn take_outcome(&self) -> Option<Outcome> {
        self.shared.take_outcome()
    }
}

impl Drop for PipeServer {
    fn drop(&mut self) {
        // Dropping the accept task drops its set of connection tasks, which aborts them and
        // closes every instance.
        self.accept.abort();
    }
}

/// An instance waiting for a client, and the slot it holds.
struct Listening {
    server: NamedPipeServer,
    slot: OwnedSemaphorePermit,
}

/// What making the next instance needs.
struct Instances {
    name: OsString,
    sd: SecurityDescriptor,
    slots: Arc<Semaphore>,
}

impl Instances {
    /// The next waiting instance, once a slot is free. `None` when the slots are closed.
    async fn next(&self) -> Option<Listening> {
        let slot = self.slots.clone().acquire_owned().await.ok()?;
        loop {
            match instance(&self.name, &self.sd, false) {
                Ok(server) => return Some(Listening { server, slot }),
                Err(e) => {
                    tracing::debug!(error = %e, "pycage: creating a pipe instance failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

async fn accept_loop(mut listening: Listening, instances: Instances, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        match listening.server.connect().await {
            Ok(()) => {
                let Listening { server, slot } = listening;
                let shared = shared.clone();
                connections.spawn(async move {
                    serve::serve_connection(server, shared, None).await;
                    drop(slot);
                });
            }
            Err(e) => {
                // A client that vanished while connecting: this instance is spent.
                tracing::debug!(error = %e, "pycage: accepting a guest connection failed");
                drop(listening);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // The next instance, so a client finds one waiting (the guest retries while the
        // pipe is busy).
        listening = match instances.next().await {
            Some(next) => next,
            None => return,
        };
    }
}

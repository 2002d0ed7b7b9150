//! [`SocketServer`]: the host end of a run's private Unix socket, forwarding the guest's tool
//! calls to the run's broker.
//!
//! # Security
//!
//! Everything a peer sends is untrusted. The server
//!
//! * listens on a socket of mode 0600 inside a directory of mode 0700 (see [`RunDir`]);
//! * checks every frame's length against the cap before reading its body, and keeps the bytes
//!   of frames being read or served within a fixed budget (twice the cap), so memory stays
//!   bounded however many peers connect (at most [`MAX_CONNECTIONS`]) and however many calls
//!   they pipeline (at most [`MAX_IN_FLIGHT`] per connection);
//! * checks the per-run token before looking at anything else in a frame, and closes a
//!   connection that presents a wrong one;
//! * forwards calls to the broker, where all policy lives, and refuses calls once the guest's
//!   result has arrived;
//! * never panics on peer input: malformed frames get `bad-request` responses, a peer that
//!   breaks a frame loses its connection, and other connections carry on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use super::frame_io::{self, write_frame};
use super::protocol::{self, Outcome, ProtocolError, Request, Response, WireErrorKind};
use super::run_dir::RunDir;
use super::token::Token;
use crate::Limits;
use crate::broker::{CallError, ToolGate};

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The most calls one connection may have in flight.
pub const MAX_IN_FLIGHT: usize = 16;

/// The host end of one run's socket. Stops serving (and closes every connection) when
/// dropped; the run directory goes with it.
pub struct SocketServer {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    // Declared last: dropped after the accept task is aborted.
    dir: RunDir,
}

struct Shared {
    gate: Arc<dyn ToolGate>,
    token: Token,
    cap: u64,
    /// Bytes of frames being read or served.
    budget: Arc<Semaphore>,
    outcome: Mutex<Option<Outcome>>,
    finished: AtomicBool,
}

impl std::fmt::Debug for SocketServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketServer")
            .field("dir", &self.dir)
            .field("cap", &self.shared.cap)
            .finish_non_exhaustive()
    }
}

impl SocketServer {
    /// Binds `broker.sock` (mode 0600) in `dir` and starts serving, with a fresh token.
    /// Calls go to `gate` (the run's broker); frames are capped by
    /// [`protocol::max_frame_bytes`] of `limits`. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// When the token cannot be generated or the socket cannot be bound.
    pub fn start(
        dir: RunDir,
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
    ) -> std::io::Result<SocketServer> {
        use std::os::unix::fs::PermissionsExt;

        let token = Token::generate()?;
        let path = dir.socket_path();
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        // The directory is 0700 already; the socket itself is owner-only too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(listener)?;
        let cap = protocol::max_frame_bytes(limits);
        let budget = usize::try_from(cap.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        let shared = Arc::new(Shared {
            gate,
            token,
            cap,
            budget: Arc::new(Semaphore::new(budget)),
            outcome: Mutex::new(None),
            finished: AtomicBool::new(false),
        });
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
        &self.shared.token
    }

    /// The largest frame accepted.
    pub fn max_frame_bytes(&self) -> u64 {
        self.shared.cap
    }

    /// The guest's outcome, once its result frame has arrived.
    pub fn take_outcome(&self) -> Option<Outcome> {
        lock(&self.shared.outcome).take()
    }

    /// True once the guest's result frame has arrived: later calls are refused.
    pub fn finished(&self) -> bool {
        self.shared.finished.load(Ordering::SeqCst)
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        // Dropping the accept task drops its set of connection tasks, which aborts them.
        self.accept.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
                let shared = shared.clone();
                connections.spawn(async move {
                    serve_connection(stream, shared).await;
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

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

async fn respond(writer: &Writer, response: &Response) -> bool {
    let body = protocol::encode_response(response);
    write_frame(&mut *writer.lock().await, &body).await.is_ok()
}

async fn serve_connection(stream: tokio::net::UnixStream, shared: Arc<Shared>) {
    let (mut reader, writer) = stream.into_split();
    let writer: Writer = Arc::new(tokio::sync::Mutex::new(writer));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut calls = JoinSet::new();
    loop {
        while calls.try_join_next().is_some() {}
        let Ok(call_slot) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let Ok(header) = frame_io::read_header(&mut reader).await else {
            break; // closed between frames, or broken inside the prefix
        };
        let len = match protocol::check_frame_len(header, shared.cap) {
            Ok(len) => len,
            Err(e) => {
                // The body is never read: answer, then drop the connection (the stream has
                // lost its framing).
                respond(&writer, &e.response()).await;
                break;
            }
        };
        let permits = u32::try_from(len.max(1)).unwrap_or(u32::MAX);
        let Ok(bytes) = shared.budget.clone().acquire_many_owned(permits).await else {
            break;
        };
        let Ok(body) = frame_io::read_body(&mut reader, len).await else {
            break; // truncated or broken mid-frame
        };
        let request = protocol::decode_request(&body, &shared.token);
        drop(body);
        match request {
            Err(
                e @ ProtocolError {
                    kind: WireErrorKind::Unauthorized,
                    ..
                },
            ) => {
                respond(&writer, &e.response()).await;
                break;
            }
            Err(e) => {
                if !respond(&writer, &e.response()).await {
                    break;
                }
            }
            Ok(Request::Result { id, outcome }) => {
                let accepted = {
                    let mut slot = lock(&shared.outcome);
                    let first = !shared.finished.swap(true, Ordering::SeqCst);
                    if first {
                        *slot = Some(outcome);
                    }
                    first
                };
                let response = if accepted {
                    Response::Ok {
                        id,
                        result_json: "null".into(),
                    }
                } else {
                    Response::Err {
                        id: Some(id),
                        kind: WireErrorKind::Denied,
                        message: "the result was already sent".into(),
                    }
                };
                if !respond(&writer, &response).await {
                    break;
                }
            }
            Ok(Request::Call(call)) => {
                let shared = shared.clone();
                let writer = writer.clone();
                calls.spawn(async move {
                    let outcome = if shared.finished.load(Ordering::SeqCst) {
                        Err(CallError::Denied("the run has finished".into()))
                    } else {
                        shared.gate.call(&call.tool_name(), &call.arguments).await
                    };
                    let response = match outcome {
                        Ok(result_json) => Response::Ok {
                            id: call.id,
                            result_json,
                        },
                        Err(e) => Response::Err {
                            id: Some(call.id),
                            kind: wire_kind(&e),
                            message: e.message().to_owned(),
                        },
                    };
                    drop(call);
                    respond(&writer, &response).await;
                    drop(bytes);
                    drop(call_slot);
                });
            }
        }
    }
    // Calls already started still answer (the peer may have stopped writing, not reading).
    while calls.join_next().await.is_some() {}
}

/// The wire kind of a broker error.
fn wire_kind(e: &CallError) -> WireErrorKind {
    match e {
        CallError::NotFound(_) => WireErrorKind::NotFound,
        CallError::InvalidArguments(_) => WireErrorKind::InvalidArguments,
        CallError::Denied(_) => WireErrorKind::Denied,
        CallError::Failed(_) => WireErrorKind::Failed,
        CallError::LimitExceeded(_) => WireErrorKind::LimitExceeded,
    }
}

//! The frame server's connection handling, the same on every transport: the Unix socket's
//! [`SocketServer`](super::SocketServer) and the Windows backend's named pipe accept
//! connections and hand each one here.
//!
//! # Security
//!
//! Everything a peer sends is untrusted. Per connection and per run this
//!
//! * checks every frame's length against the cap before reading its body, and keeps the bytes
//!   of frames being read or served within a fixed budget (twice the cap), so memory stays
//!   bounded however many peers connect (at most [`MAX_CONNECTIONS`]) and however many calls
//!   they pipeline (at most [`MAX_IN_FLIGHT`] per connection);
//! * checks the per-run token before looking at anything else in a frame, and closes a
//!   connection that presents a wrong one;
//! * forwards calls to the run's gate (the broker, where all policy lives), and refuses calls
//!   once the guest's result has arrived;
//! * for a session's guest, answers its `next` requests with the session's runs, one at a
//!   time, as the host starts them (a one-shot run's guest has no next run);
//! * never panics on peer input: malformed frames get `bad-request` responses, a peer that
//!   breaks a frame loses its connection, and other connections carry on.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;

use super::frame_io::{self, write_frame};
use super::protocol::{self, Outcome, ProtocolError, Request, Response, WireErrorKind};
use super::token::Token;
use crate::Limits;
use crate::broker::{CallError, ToolGate};

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The most calls one connection may have in flight.
pub const MAX_IN_FLIGHT: usize = 16;

/// What every connection of one run shares.
pub(crate) struct Shared {
    gate: Arc<dyn ToolGate>,
    token: Token,
    cap: AtomicU64,
    /// Bytes of frames being read or served.
    budget: Arc<Semaphore>,
    /// The permits `budget` was given in all (twice the largest cap so far).
    budget_total: Mutex<usize>,
    outcome: Mutex<Option<Outcome>>,
    finished: AtomicBool,
    /// Told when an outcome arrives (a session's host waits for it, the process lives on).
    arrived: Notify,
    /// A session's runs, for its guest's `next` requests; `None` for a one-shot run.
    jobs: Option<tokio::sync::Mutex<mpsc::Receiver<String>>>,
    /// Told when a guest asks for its next run (a session's guest is then ready).
    asked: Notify,
    /// The host's process id of the peer that asked for a session's runs (0: none yet):
    /// the guest's interpreter, which a run's deadline interrupts.
    guest_pid: AtomicI32,
}

/// How many permits a byte budget of twice `cap` is.
fn budget_for(cap: u64) -> usize {
    usize::try_from(cap.saturating_mul(2))
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

impl Shared {
    /// A run's serving state: a fresh token, frames capped by [`protocol::max_frame_bytes`]
    /// of `limits`, calls to `gate`.
    ///
    /// # Errors
    ///
    /// When the token cannot be generated.
    pub(crate) fn new(gate: Arc<dyn ToolGate>, limits: &Limits) -> std::io::Result<Shared> {
        Self::with_jobs(gate, limits, None)
    }

    /// A session's serving state: as [`Shared::new`], and its guest's `next` requests are
    /// answered with the runs sent on the returned sender, in order.
    ///
    /// # Errors
    ///
    /// When the token cannot be generated.
    // Only the Unix socket server keeps sessions.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn for_session(
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
    ) -> std::io::Result<(Shared, mpsc::Sender<String>)> {
        let (send, receive) = mpsc::channel(1);
        let shared = Self::with_jobs(gate, limits, Some(tokio::sync::Mutex::new(receive)))?;
        Ok((shared, send))
    }

    fn with_jobs(
        gate: Arc<dyn ToolGate>,
        limits: &Limits,
        jobs: Option<tokio::sync::Mutex<mpsc::Receiver<String>>>,
    ) -> std::io::Result<Shared> {
        let cap = protocol::max_frame_bytes(limits);
        let budget = budget_for(cap);
        Ok(Shared {
            gate,
            token: Token::generate()?,
            cap: AtomicU64::new(cap),
            budget: Arc::new(Semaphore::new(budget)),
            budget_total: Mutex::new(budget),
            outcome: Mutex::new(None),
            finished: AtomicBool::new(false),
            arrived: Notify::new(),
            jobs,
            asked: Notify::new(),
            guest_pid: AtomicI32::new(0),
        })
    }

    /// Starts a session's next run: its frames capped at `cap` (the cap only grows, with the
    /// byte budget), no outcome yet, calls accepted again.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn begin_run(&self, cap: u64) {
        let mut total = lock(&self.budget_total);
        let wanted = budget_for(cap);
        if wanted > *total {
            self.budget.add_permits(wanted - *total);
            *total = wanted;
        }
        self.cap.fetch_max(cap, Ordering::SeqCst);
        drop(total);
        *lock(&self.outcome) = None;
        self.finished.store(false, Ordering::SeqCst);
    }

    /// Waits for the run's outcome (a session's host: its guest lives on after sending it).
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) async fn outcome(&self) -> Outcome {
        loop {
            if let Some(outcome) = self.take_outcome() {
                return outcome;
            }
            // A permit left by an outcome already taken only costs one more look.
            self.arrived.notified().await;
        }
    }

    /// The host's process id of the peer that asked for a session's runs, once one has.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn guest_pid(&self) -> Option<i32> {
        Some(self.guest_pid.load(Ordering::SeqCst)).filter(|&pid| pid > 0)
    }

    /// Waits until a guest asks for its next run.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) async fn asked(&self) {
        self.asked.notified().await;
    }

    /// The token a peer must present.
    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// The largest frame accepted.
    pub(crate) fn cap(&self) -> u64 {
        self.cap.load(Ordering::SeqCst)
    }

    /// The guest's outcome, once its result frame has arrived.
    pub(crate) fn take_outcome(&self) -> Option<Outcome> {
        lock(&self.outcome).take()
    }

    /// True once the guest's result frame has arrived: later calls are refused.
    // Only the Unix socket server offers this to its callers; the named pipe's launcher
    // takes the outcome instead.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Writer<W> = Arc<tokio::sync::Mutex<W>>;

async fn respond<W: AsyncWrite + Unpin>(writer: &Writer<W>, response: &Response) -> bool {
    let body = protocol::encode_response(response);
    write_frame(&mut *writer.lock().await, &body).await.is_ok()
}

/// Serves one peer's connection until it closes, breaks a frame, or presents a wrong token.
/// `peer_pid` is the host's process id of the peer, where the transport tells it.
pub(crate) async fn serve_connection<S>(stream: S, shared: Arc<Shared>, peer_pid: Option<i32>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, writer) = tokio::io::split(stream);
    let writer: Writer<_> = Arc::new(tokio::sync::Mutex::new(writer));
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
        let len = match protocol::check_frame_len(header, shared.cap()) {
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
                if accepted {
                    shared.arrived.notify_one();
                }
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
            Ok(Request::Next { id }) => {
                drop(bytes);
                // The peer presented the token and asks for runs: it is the guest's
                // interpreter.
                if let Some(pid) = peer_pid {
                    shared.guest_pid.store(pid, Ordering::SeqCst);
                }
                let shared = shared.clone();
                let writer = writer.clone();
                calls.spawn(async move {
                    let response = next_run(&shared, id).await;
                    respond(&writer, &response).await;
                    drop(call_slot);
                });
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

/// The answer to a `next` request: the session's next run when the host starts it.
async fn next_run(shared: &Shared, id: u64) -> Response {
    let refuse = |kind, message: &str| Response::Err {
        id: Some(id),
        kind,
        message: message.into(),
    };
    let Some(jobs) = &shared.jobs else {
        return refuse(
            WireErrorKind::BadRequest,
            "`next` is only for a session's guest",
        );
    };
    shared.asked.notify_one();
    // One waiter at a time; another waits its turn (and gets the run after).
    match jobs.lock().await.recv().await {
        Some(result_json) => Response::Ok { id, result_json },
        None => refuse(WireErrorKind::Denied, "the session has ended"),
    }
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

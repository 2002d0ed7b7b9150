//! The layered backend's worker: the process that runs the wasm engine inside bubblewrap.
//!
//! The worker reads a [`WorkerRequest`] (JSON) on stdin, loads the guest from a read-only,
//! already prepared artifact cache (it never compiles), and runs the job with
//! [`WasmBackend::run_gated`](crate::WasmBackend::run_gated), its tool calls going over the run's socket to the host's
//! broker ([`SocketGate`]). It sends its result, with the guest's captured output and fuel,
//! as the run's result frame. An executable that hosts the worker calls [`serve`] when it is
//! started as `<exe> worker --cache-dir <dir>` (the `pycage` CLI does).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::net::UnixStream;

use super::classify::BOOTSTRAP_FAILED;
use super::frame_io::{ReadError, read_frame, write_frame};
use super::protocol::{self, FRAME_SLACK_BYTES, Outcome, Response, WireErrorKind, WorkerReport};
use crate::backend::Job;
use crate::broker::{CallError, GateFuture, ToolGate};
use crate::policy::Binding;
use crate::{ErrorKind, Limits, RunError};

/// The most bytes of request the worker reads on stdin (the code's cap is 4 GiB at most;
/// this is the JSON around it).
const MAX_REQUEST_BYTES: u64 = 5 << 30;

/// What the host sends the worker on stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerRequest {
    /// The broker socket, as the worker sees it.
    pub socket: PathBuf,
    /// The run's token.
    pub token: String,
    /// The job.
    pub job: WorkerJob,
}

/// A [`Job`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerJob {
    /// The code.
    pub code: String,
    /// The initial variables.
    pub vars: Map<String, Value>,
    /// The limits.
    pub limits: Limits,
    /// The tools the guest defines.
    pub tools: Vec<Binding>,
    /// The input files (the worker makes the scratch directory inside its own sandbox).
    #[serde(default)]
    pub files: Vec<crate::InputFile>,
}

impl From<Job> for WorkerJob {
    fn from(job: Job) -> Self {
        WorkerJob {
            code: job.code,
            vars: job.vars,
            limits: job.limits,
            tools: job.tools,
            files: job.files,
        }
    }
}

impl From<WorkerJob> for Job {
    fn from(job: WorkerJob) -> Self {
        Job {
            code: job.code,
            vars: job.vars,
            limits: job.limits,
            tools: job.tools,
            files: job.files,
            // The worker's output reaches the host when the run ends: nothing to count live.
            output_meter: None,
        }
    }
}

/// Runs one worker: reads the request from `input`, runs the job, reports over the socket.
/// Returns the process's exit status (0 when the result was delivered).
pub async fn serve(input: impl Read, cache_dir: &Path) -> i32 {
    let mut text = Vec::new();
    if input
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut text)
        .is_err()
    {
        eprintln!("pycage worker: cannot read the request");
        return BOOTSTRAP_FAILED;
    }
    let request: WorkerRequest = match serde_json::from_slice(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pycage worker: malformed request: {e}");
            return BOOTSTRAP_FAILED;
        }
    };
    drop(text);
    let stream = match UnixStream::connect(&request.socket).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pycage worker: cannot reach the broker: {e}");
            return BOOTSTRAP_FAILED;
        }
    };
    let limits = request.job.limits.clone();
    let gate = Arc::new(SocketGate::new(stream, request.token, &limits));
    let result = match super::layered::worker_backend(cache_dir) {
        Ok(backend) if backend.is_cached() => {
            backend.run_gated(request.job.into(), gate.clone()).await
        }
        Ok(_) => crate::RunResult::failed(
            "wasm+bubblewrap",
            RunError::new(
                ErrorKind::BackendError,
                "the guest artifact is not prepared",
            ),
            std::time::Duration::ZERO,
        ),
        Err(e) => {
            eprintln!("pycage worker: {e}");
            return BOOTSTRAP_FAILED;
        }
    };
    let outcome = Outcome {
        value: match result.error {
            None => Ok(result.value.to_string()),
            Some(e) => Err(e),
        },
        report: Some(WorkerReport {
            stdout: result.stdout,
            stderr: result.stderr,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
            fuel_consumed: result.fuel_consumed,
            files: result.files,
        }),
    };
    match gate.send_result(&outcome).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pycage worker: the result was not delivered: {e}");
            BOOTSTRAP_FAILED
        }
    }
}

/// A [`ToolGate`] that forwards every call to the host's broker over the run's socket. The
/// host decides; this only carries.
pub struct SocketGate {
    stream: tokio::sync::Mutex<Option<UnixStream>>,
    token: String,
    next_id: AtomicU64,
    max_args_bytes: u64,
    max_response_bytes: u64,
}

impl SocketGate {
    /// A gate over a connected stream.
    pub fn new(stream: UnixStream, token: String, limits: &Limits) -> Self {
        SocketGate {
            stream: tokio::sync::Mutex::new(Some(stream)),
            token,
            next_id: AtomicU64::new(1),
            max_args_bytes: limits.max_tool_args_bytes(),
            max_response_bytes: limits
                .max_tool_result_bytes()
                .saturating_mul(2)
                .saturating_add(FRAME_SLACK_BYTES),
        }
    }

    /// Sends one request body and reads its response.
    async fn exchange(&self, body: &[u8]) -> Result<Response, String> {
        let mut slot = self.stream.lock().await;
        let Some(stream) = slot.as_mut() else {
            return Err("the connection to the host broke earlier".into());
        };
        let result = async {
            write_frame(stream, body)
                .await
                .map_err(|e| format!("sending: {e}"))?;
            let reply = read_frame(stream, self.max_response_bytes)
                .await
                .map_err(|e| match e {
                    ReadError::Closed | ReadError::Truncated => {
                        "the host closed the connection".to_owned()
                    }
                    ReadError::TooLarge(e) => e.message,
                    ReadError::Io => "reading failed".to_owned(),
                })?;
            protocol::decode_response(&reply).map_err(|e| e.message)
        }
        .await;
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// Sends the run's outcome and waits for the host to accept it.
    ///
    /// # Errors
    ///
    /// When the host cannot be reached or refuses the result.
    pub async fn send_result(&self, outcome: &Outcome) -> Result<(), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match self
            .exchange(&protocol::encode_result(&self.token, id, outcome))
            .await?
        {
            Response::Ok { .. } => Ok(()),
            Response::Err { kind, message, .. } => Err(format!("{kind}: {message}")),
        }
    }

    async fn call_inner(&self, name: &str, args_json: &str) -> Result<String, CallError> {
        // The broker checks all of this again; these checks only keep a bad call off the wire.
        if args_json.len() as u64 > self.max_args_bytes {
            return Err(CallError::LimitExceeded(format!(
                "tool arguments are {} bytes; the limit is {}",
                args_json.len(),
                self.max_args_bytes
            )));
        }
        let arguments = crate::broker::raw_args(args_json)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = protocol::encode_call(&self.token, id, name, None, arguments);
        match self.exchange(&body).await {
            Ok(Response::Ok { result_json, .. }) => Ok(result_json),
            Ok(Response::Err { kind, message, .. }) => Err(match kind {
                WireErrorKind::NotFound => CallError::NotFound(message),
                WireErrorKind::InvalidArguments => CallError::InvalidArguments(message),
                WireErrorKind::Denied => CallError::Denied(message),
                WireErrorKind::Failed => CallError::Failed(message),
                WireErrorKind::LimitExceeded => CallError::LimitExceeded(message),
                WireErrorKind::Unauthorized | WireErrorKind::BadRequest => {
                    CallError::Failed("the host broker refused the call".into())
                }
            }),
            Err(e) => {
                tracing::error!(error = %e, "pycage worker: a tool call could not reach the broker");
                Err(CallError::Failed(
                    "the connection to the host broker failed".into(),
                ))
            }
        }
    }
}

impl ToolGate for SocketGate {
    fn call<'a>(&'a self, name: &'a str, args_json: &'a str) -> GateFuture<'a> {
        Box::pin(self.call_inner(name, args_json))
    }

    fn run_id(&self) -> &str {
        "worker"
    }
}

//! One run's reply, the same on both servers. `pycage serve` answers with [`Reply::body`]
//! as the response body (file contents inline, base64); `pycage mcp` as `structuredContent`
//! (file contents as embedded resources instead). The fields are the library's `RunResult`
//! JSON (its names: `duration` in milliseconds) with `files` listed as `path`, `size`,
//! `returned` (and `bytes` where inlined), plus what a server adds: `session_id`, `clamped`
//! (`field`, `asked`, `got`), `status`, `run_id` and `pending`. Every field is always there
//! (`null` or `false` when it does not apply), so a client reads one shape.

use std::sync::Arc;

use pycage::journal::PendingCall;
use pycage::{ErrorKind, RunError, RunResult, SessionId};
use serde_json::{Map, Value, json};

use crate::clamp::Clamped;
use crate::suspended::{SuspendedRun, SuspendedRuns};

/// A run suspended at a call that waits for a person's decision.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PendingApproval {
    /// The run's id, under which the server keeps it.
    pub run_id: String,
    /// The call that waits.
    pub call: PendingCall,
}

impl PendingApproval {
    /// What a person is asked: the call, its tool and arguments.
    pub fn question(&self) -> String {
        /// How much of the arguments a person is shown: enough to judge a call, not a
        /// megabyte of them in a dialog or a log line.
        const SHOWN: usize = 2_000;
        let mut args = Value::Object(self.call.args.clone()).to_string();
        if args.len() > SHOWN {
            let total = args.len();
            args.truncate(args.floor_char_boundary(SHOWN));
            args.push_str(&format!("… ({total} bytes in all)"));
        }
        format!(
            "Code a model wrote wants to call `{}` with {args}. Allow this call?",
            self.call.tool,
        )
    }
}

/// A run's outcome as a server replies with it.
#[derive(Debug)]
pub struct Reply {
    /// The result, its journal and suspended state taken out.
    pub result: RunResult,
    /// The call it waits at, when it suspended and was kept.
    pub pending: Option<PendingApproval>,
    /// The limits the server lowered to its maxima.
    pub clamped: Vec<Clamped>,
    /// The session it ran in.
    pub session: Option<SessionId>,
}

impl Reply {
    /// `result` as a reply: a suspended run is kept in `store` with its `replacements`, for
    /// its resume, counted against `client`'s share; one too big to keep fails as its own
    /// outcome (like any limit it hit).
    ///
    /// # Errors
    ///
    /// `busy` when the store is full: a refusal, not the run's outcome.
    pub fn settle(
        store: &SuspendedRuns,
        mut result: RunResult,
        clamped: Vec<Clamped>,
        session: Option<SessionId>,
        replacements: Vec<Arc<dyn pycage_tools::Tool>>,
        client: Option<String>,
    ) -> Result<Self, RunError> {
        result.journal = None;
        let mut pending = None;
        if let Some(state) = result.suspended.take() {
            let call = state.pending.clone();
            match store.keep(SuspendedRun::new(state, replacements).for_client(client)) {
                Ok(run_id) => pending = Some(PendingApproval { run_id, call }),
                Err(error) if error.kind == ErrorKind::Busy => return Err(error),
                Err(error) => {
                    result.ok = false;
                    result.error = Some(error);
                }
            }
        }
        Ok(Reply {
            result,
            pending,
            clamped,
            session,
        })
    }

    /// A failure before or instead of a run, in the same shape.
    pub fn failed(backend: &str, error: RunError) -> Self {
        Reply {
            result: RunResult::failed(backend, error, std::time::Duration::ZERO),
            pending: None,
            clamped: Vec::new(),
            session: None,
        }
    }

    /// `completed`, `failed` or `suspended`.
    pub fn status(&self) -> &'static str {
        crate::suspended::status(self.pending.is_some(), self.result.ok)
    }

    /// The reply's JSON (see the [module docs](self)); with `inline_files`, each returned
    /// file's bytes as base64 in `bytes`.
    pub fn body(&self, inline_files: bool) -> Map<String, Value> {
        // The library's own serialization, so a field it gains reaches both servers.
        let mut body = match serde_json::to_value(&self.result) {
            Ok(Value::Object(body)) => body,
            // A result is plain data; were it ever not to serialize, say so in its place.
            _ => {
                let error = RunError::new(ErrorKind::BackendError, "the result does not serialize");
                let fields = [
                    ("ok", json!(false)),
                    ("error", json!(error)),
                    ("status", json!("failed")),
                ];
                return fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            }
        };
        if let Some(Value::Array(files)) = body.get_mut("files") {
            for file in files.iter_mut().filter_map(Value::as_object_mut) {
                let bytes = file.remove("bytes").unwrap_or(Value::Null);
                file.insert("returned".into(), json!(!bytes.is_null()));
                if inline_files {
                    file.insert("bytes".into(), bytes);
                }
            }
        }
        let added = [
            (
                "session_id",
                json!(self.session.as_ref().map(SessionId::as_str)),
            ),
            ("session_ended", json!(self.result.session_ended)),
            ("clamped", json!(self.clamped)),
            ("status", json!(self.status())),
            ("run_id", json!(self.pending.as_ref().map(|p| &p.run_id))),
            ("pending", json!(self.pending.as_ref().map(|p| &p.call))),
        ];
        body.extend(added.into_iter().map(|(k, v)| (k.to_owned(), v)));
        body
    }
}

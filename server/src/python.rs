//! The `run_python` tool and its session tools, apart from any transport: what the MCP and
//! HTTP servers call. A call's input is JSON; its output is a structured object (see
//! [`PythonTool::output_schema`]), the compact text for the model, and the produced files.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pycage::{
    Decision, Description, ErrorKind, Limits, OutputFile, Persistence, RunError, RunRequest,
    RunResult, Runner, SessionId, SessionManager,
};
use serde_json::{Map, Value, json};

use crate::clamp::{self, Clamped};
use crate::config::ServerConfig;
use crate::input::{self, FilesAs};
pub use crate::reply::PendingApproval;
use crate::reply::Reply;
use crate::schema;
use crate::service::{Admission, Service};

/// The tool's name.
pub const RUN_PYTHON: &str = "run_python";
/// The tool that opens a session.
pub const CREATE_SESSION: &str = "create_session";
/// The tool that destroys a session.
pub const CLOSE_SESSION: &str = "close_session";
/// The tool that finishes a run suspended at a call waiting for a person's approval.
pub const RESUME_RUN: &str = "resume_run";

/// Why a server could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is unusable.
    Config(crate::ConfigError),
    /// The sandbox could not be made (a backend, a tools file, the policy).
    Sandbox(String),
    /// The sandbox could not be described (its probe run failed).
    Describe(pycage::DescribeError),
    /// An upstream MCP server could not be started or listed.
    Upstream(crate::UpstreamError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => e.fmt(f),
            StartError::Sandbox(why) => f.write_str(why),
            StartError::Describe(e) => write!(f, "the sandbox could not be described: {e}"),
            StartError::Upstream(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StartError {}

/// A long run's progress, reported every [`RunsConfig::progress_interval`](crate::RunsConfig).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// How long the call has been running (waiting for a slot included).
    pub elapsed: Duration,
    /// Bytes the code has written to stdout so far (every byte, kept or cut by the output
    /// cap; 0 on a backend that sees the output only at the end, see
    /// [`pycage::OutputMeter`]).
    pub stdout_bytes: u64,
    /// Bytes the code has written to stderr so far, likewise.
    pub stderr_bytes: u64,
}

/// What one tool call gives back.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ToolOutput {
    /// The structured result (for `run_python`, of [`PythonTool::output_schema`]).
    pub structured: Value,
    /// The compact text for the model.
    pub text: String,
    /// True when the call failed (the guest's failure, a limit, bad input, busy).
    pub is_error: bool,
    /// The files the run produced, with their bytes where they were returned.
    pub files: Vec<OutputFile>,
    /// The call a suspended run waits at, for a person to decide (see
    /// [`PythonTool::decide`]); `None` for a run that ended.
    pub pending: Option<PendingApproval>,
}

/// A run waiting for a person whose client cannot be asked: the code that approves it, for
/// the server to show that person through a channel the model does not read (see
/// [`PythonTool::with_approval_channel`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ApprovalNotice {
    /// The run.
    pub pending: PendingApproval,
    /// The one-time code that approves it (`XXXXX-XXXXX`).
    pub code: String,
}

/// Where approval codes go: a person's channel the model does not read.
#[derive(Clone)]
struct ApprovalChannel(Arc<dyn Fn(&ApprovalNotice) + Send + Sync>);

impl std::fmt::Debug for ApprovalChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApprovalChannel")
    }
}

/// `run_python`, `create_session` and `close_session` over one runner (see the [module
/// docs](self)). Cheap to share behind an `Arc`; every call may run concurrently, up to the
/// configured bound.
#[derive(Debug)]
pub struct PythonTool {
    /// The runner, sessions, suspended runs and admission both servers share.
    service: Service,
    progress_interval: Duration,
    description: Description,
    text: String,
    input_schema: Value,
    output_schema: Value,
    /// Where a run's approval code goes when the client cannot ask its person.
    approvals: Option<ApprovalChannel>,
}

impl PythonTool {
    /// The tool `config` describes: its backend, tools, policy and limits, described by a
    /// probe run (so this takes as long as one run, plus the guest's first compile).
    ///
    /// # Errors
    ///
    /// [`StartError`] naming what is unusable.
    pub async fn start(config: &ServerConfig) -> Result<Self, StartError> {
        let (runner, maxima) = crate::sandbox::start(config).await?;
        Self::with_runner(runner, config, maxima).await
    }

    /// The tool over `runner` (its limits are each call's defaults), with `config`'s
    /// sessions and bounds and the given maxima.
    ///
    /// # Errors
    ///
    /// [`StartError`] naming what is unusable.
    pub async fn with_runner(
        runner: Runner,
        config: &ServerConfig,
        maxima: Limits,
    ) -> Result<Self, StartError> {
        let service = Service::new(runner, config, maxima)?;
        let sessions = service.sessions.is_some();
        let persistence = if sessions {
            Persistence::OnRequest
        } else {
            Persistence::OneShot
        };
        let description = service
            .runner
            .description()
            .persistence(persistence)
            .build()
            .await
            .map_err(StartError::Describe)?;
        let text = schema::description_text(&description, &service.maxima, sessions);
        let input_schema = schema::run_input(
            &description,
            &service.maxima,
            sessions,
            service.has_fetch().then_some(config.net.allow.as_slice()),
        );
        Ok(PythonTool {
            service,
            progress_interval: config.runs.progress_interval,
            description,
            text,
            input_schema,
            output_schema: schema::run_output(),
            approvals: None,
        })
    }

    /// Gives each run that waits for a person whose client cannot be asked (see
    /// [`ask_out_of_band`](Self::ask_out_of_band)) a one-time approval code, and hands it to
    /// `channel`, which must show it to the person and never to the model (`pycage mcp`
    /// writes it to its stderr, the client's server log). Without a channel such a run can
    /// only be denied.
    #[must_use]
    pub fn with_approval_channel(
        mut self,
        channel: impl Fn(&ApprovalNotice) + Send + Sync + 'static,
    ) -> Self {
        self.approvals = Some(ApprovalChannel(Arc::new(channel)));
        self
    }

    /// How long a suspended run waits for its decision.
    pub fn suspended_ttl(&self) -> Duration {
        self.service.suspended.ttl()
    }

    /// The runner the calls run on.
    pub fn runner(&self) -> &Runner {
        &self.service.runner
    }

    /// The sessions, where the backend keeps them.
    pub fn sessions(&self) -> Option<&Arc<SessionManager>> {
        self.service.sessions.as_ref()
    }

    /// How many runs hold a slot now (at most the configured `max_concurrent`).
    pub fn runs_in_progress(&self) -> usize {
        self.service.runs_running()
    }

    /// The library's description of the sandbox the tool describes.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// The tool's description for the model: every limit, the tools as Python signatures,
    /// files, sessions, and what a call may ask for.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The JSON schema of `run_python`'s input.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    /// The JSON schema of `run_python`'s structured output.
    pub fn output_schema(&self) -> &Value {
        &self.output_schema
    }

    /// The JSON schema of `create_session`'s input.
    pub fn create_session_schema(&self) -> Value {
        schema::create_session_input(&self.service.maxima)
    }

    /// Runs one `run_python` call, calling `on_progress` every progress interval while it
    /// runs. Dropping the future cancels the run at once and frees its slot (a session's run
    /// cancelled so ends the session).
    pub async fn run<F, Fut>(&self, input: &Value, on_progress: F) -> ToolOutput
    where
        F: FnMut(Progress) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run_for(None, input, on_progress).await
    }

    /// [`run`](Self::run) for `client`, a name the server gives one client (an MCP session):
    /// a run it leaves suspended counts against that client's share of the suspended-run
    /// store ([`SuspendedConfig::max_runs_per_client`](crate::suspended::SuspendedConfig)).
    pub async fn run_for<F, Fut>(
        &self,
        client: Option<String>,
        input: &Value,
        mut on_progress: F,
    ) -> ToolOutput
    where
        F: FnMut(Progress) -> Fut,
        Fut: Future<Output = ()>,
    {
        let started = Instant::now();
        let mut call = match self.parse_run(input) {
            Ok(call) => call,
            Err(error) => return self.failed(&error),
        };
        let meter = pycage::OutputMeter::new();
        call.request = call.request.output_meter(meter.clone());
        let run = async {
            let _slot = self.admit().await?;
            Ok::<_, RunError>(match &call.session {
                Some((id, sessions)) => sessions.run(id, call.request).await,
                None => self.service.runner.run_request(call.request).await,
            })
        };
        tokio::pin!(run);
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + self.progress_interval,
            self.progress_interval,
        );
        let result = loop {
            tokio::select! {
                done = &mut run => break done,
                _ = ticks.tick() => {
                    on_progress(Progress {
                        elapsed: started.elapsed(),
                        stdout_bytes: meter.stdout_bytes(),
                        stderr_bytes: meter.stderr_bytes(),
                    })
                    .await;
                }
            }
        };
        match result {
            Ok(result) => self.render(
                result,
                call.session.as_ref().map(|(id, _)| id),
                &call.clamped,
                call.replacements,
                client,
            ),
            Err(error) => self.failed(&error),
        }
    }

    /// Runs one `resume_run` call: `run_id` (of a run that came back suspended), `decision`
    /// (`approve`, `deny` or `answer`), with `answer` the call's result, and with `approve`
    /// or `answer` the `approval_code` the person was given. The model makes this call: it
    /// may deny on its own, but approving needs the person's code (issue 37, hole 4).
    pub async fn resume(&self, input: &Value) -> ToolOutput {
        let parsed = object(input).and_then(|object| {
            if let Some(key) = object.keys().find(|k| {
                !matches!(
                    k.as_str(),
                    "run_id" | "decision" | "answer" | "approval_code"
                )
            }) {
                return Err(invalid(format!(
                    "`resume_run` takes `run_id`, `decision`, `answer` and `approval_code`, \
                     not `{}`",
                    key.escape_debug()
                )));
            }
            let id = object
                .get("run_id")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("`resume_run` needs `run_id`, a string".into()))?;
            let decision = object.get("decision").and_then(Value::as_str);
            let decision = crate::suspended::decision(decision, object.get("answer"))?;
            let code = match object.get("approval_code") {
                None | Some(Value::Null) => None,
                Some(Value::String(code)) => Some(code.as_str()),
                Some(_) => return Err(invalid("`approval_code` must be a string".into())),
            };
            let run = self.service.suspended.take_with_code(id, &decision, code)?;
            Ok((id.to_owned(), decision, run))
        });
        match parsed {
            Ok((id, decision, run)) => self.resume_taken(id, run, decision).await,
            Err(error) => self.failed(&error),
        }
    }

    /// Resumes the run `run_id` with a person's `decision`, made where the model cannot
    /// reach: an MCP client's elicitation, answered by its user.
    pub async fn decide(&self, run_id: &str, decision: Decision) -> ToolOutput {
        match self.service.suspended.take(run_id) {
            Some(run) => self.resume_taken(run_id.to_owned(), run, decision).await,
            None => self.failed(&invalid(
                "no suspended run has that `run_id` (it was resumed, expired or never existed)"
                    .into(),
            )),
        }
    }

    /// A token that names the live run `run_id` and carries a fresh one-time approval code,
    /// for a client to send back with its person's answer (MCP's `requestState`): the answer
    /// then counts only for the question that was put. `None` when no live run has that id
    /// or no code could be made.
    pub fn approval_token(&self, run_id: &str) -> Option<String> {
        self.fresh_code(run_id)
            .map(|code| format!("{run_id}.{code}"))
    }

    /// A fresh one-time approval code for the live run `run_id`; `None` when no live run has
    /// that id or the random source failed (logged).
    fn fresh_code(&self, run_id: &str) -> Option<String> {
        self.service
            .suspended
            .issue_code(run_id)
            .unwrap_or_else(|error| {
                tracing::warn!("no approval code for run {run_id}: {error}");
                None
            })
    }

    /// Resumes the run an [`approval_token`](Self::approval_token) names with a person's
    /// `decision`; a token that is not the run's latest ends the run unless it denies.
    pub async fn decide_by_token(&self, token: &str, decision: Decision) -> ToolOutput {
        let Some((id, code)) = token.split_once('.') else {
            return self.failed(&invalid(
                "the request state is not an approval token".into(),
            ));
        };
        match self
            .service
            .suspended
            .take_with_code(id, &decision, Some(code))
        {
            Ok(run) => self.resume_taken(id.to_owned(), run, decision).await,
            Err(error) => self.failed(&error),
        }
    }

    /// A run that waits for a person the client cannot ask: with an approval channel, the
    /// run gets a one-time code the channel shows the person; `output`'s text tells the
    /// model what it may do (ask the user for the code, or deny).
    pub fn ask_out_of_band(&self, output: &mut ToolOutput) {
        let Some(pending) = &output.pending else {
            return;
        };
        let id = &pending.run_id;
        // A code only where a channel can show it to the person.
        let issued = self.approvals.as_ref().is_some_and(|channel| {
            let Some(code) = self.fresh_code(id) else {
                return false;
            };
            (channel.0)(&ApprovalNotice {
                pending: pending.clone(),
                code,
            });
            true
        });
        output.text.push_str(&if issued {
            format!(
                "The pycage server has shown the user an approval code for this call. Ask \
                 the user whether to allow it. If they allow it, they give you the code: call \
                 `{RESUME_RUN}` with run_id \"{id}\", decision \"approve\" and \
                 approval_code as they gave it. If they refuse, or you would rather not run \
                 it, call `{RESUME_RUN}` with decision \"deny\". The code then runs again from \
                 its start, the earlier calls answered as before.\n"
            )
        } else {
            format!(
                "This client cannot ask the user (no MCP elicitation) and the server has no \
                 other channel to them, so the call cannot be approved here: call \
                 `{RESUME_RUN}` with run_id \"{id}\" and decision \"deny\" to let the code \
                 go on without it.\n"
            )
        });
    }

    /// Resumes a run taken from the store with `decision`, in a run slot.
    async fn resume_taken(
        &self,
        id: String,
        run: crate::suspended::SuspendedRun,
        decision: Decision,
    ) -> ToolOutput {
        let client = run.client.clone();
        match self.service.resume(id, run, decision).await {
            Ok((result, replacements)) => self.render(result, None, &[], replacements, client),
            Err(refused) => self.failed(&refused.into()),
        }
    }

    /// A result as `run_python` renders it; a suspended one is kept for `resume_run`.
    fn render(
        &self,
        result: RunResult,
        session: Option<&SessionId>,
        clamped: &[Clamped],
        replacements: Vec<Arc<dyn pycage_tools::Tool>>,
        client: Option<String>,
    ) -> ToolOutput {
        let settled = Reply::settle(
            &self.service.suspended,
            result,
            clamped.to_vec(),
            session.cloned(),
            replacements,
            client,
        );
        match settled {
            Ok(reply) => output(reply),
            Err(busy) => self.failed(&busy),
        }
    }

    /// Runs one `create_session` call: `limits` (optional) within the maxima.
    pub async fn create_session(&self, input: &Value) -> ToolOutput {
        let Some(sessions) = &self.service.sessions else {
            return self.failed(&unsupported(self.service.runner.backend().name()));
        };
        let opened = async {
            let object = object(input)?;
            if let Some(key) = object.keys().find(|k| k.as_str() != "limits") {
                return Err(invalid(format!(
                    "`create_session` takes only `limits`, not `{}`",
                    key.escape_debug()
                )));
            }
            let (limits, clamped) = clamp::apply(
                self.service.runner.limits(),
                &self.service.maxima,
                object.get("limits"),
            )?;
            let id = sessions.create_with(limits.clone()).await?;
            Ok((id, limits, clamped))
        };
        match opened.await {
            Ok((id, limits, clamped)) => {
                let config = sessions.config();
                let mut text = format!(
                    "session {id} created: pass \"session_id\": \"{id}\" to run_python; it \
                     expires after {} unused\n",
                    pycage_tools::units::format_duration(config.idle_timeout)
                );
                if let Some(note) = clamp::note(&clamped) {
                    text.push_str(&note);
                    text.push('\n');
                }
                ToolOutput {
                    structured: json!({
                        "session_id": id.as_str(),
                        "limits": limits,
                        "idle_timeout_seconds": config.idle_timeout.as_secs(),
                        "max_lifetime_seconds": config.max_lifetime.as_secs(),
                        "clamped": clamped,
                    }),
                    text,
                    is_error: false,
                    files: Vec::new(),
                    pending: None,
                }
            }
            Err(error) => self.failed(&error),
        }
    }

    /// Runs one `close_session` call: `session_id`.
    pub fn close_session(&self, input: &Value) -> ToolOutput {
        let closed = object(input).and_then(|object| {
            if let Some(key) = object.keys().find(|k| k.as_str() != "session_id") {
                return Err(invalid(format!(
                    "`close_session` takes only `session_id`, not `{}`",
                    key.escape_debug()
                )));
            }
            let id = object
                .get("session_id")
                .and_then(Value::as_str)
                .map(SessionId::from)
                .ok_or_else(|| invalid("`close_session` needs `session_id`, a string".into()))?;
            let live = self.service.sessions.as_ref().is_some_and(|s| s.close(&id));
            if live {
                Ok(id)
            } else {
                Err(RunError::new(
                    ErrorKind::SessionNotFound,
                    "no live session has that id (it was closed, expired or never existed)",
                ))
            }
        });
        match closed {
            Ok(id) => ToolOutput {
                structured: json!({"session_id": id.as_str(), "closed": true}),
                text: format!("session {id} closed\n"),
                is_error: false,
                files: Vec::new(),
                pending: None,
            },
            Err(error) => self.failed(&error),
        }
    }

    /// A failure as `run_python` renders it: the shape of its output schema.
    fn failed(&self, error: &RunError) -> ToolOutput {
        output(Reply::failed(
            self.service.runner.backend().name(),
            error.clone(),
        ))
    }

    /// Admits one run (see [`Service::admit`]), as a run's error when refused.
    async fn admit(&self) -> Result<Admission, RunError> {
        self.service.admit().await.map_err(RunError::from)
    }

    fn parse_run(&self, input: &Value) -> Result<Call, RunError> {
        let parsed = input::parse(&self.service, &self.description, input, FilesAs::Text)?;
        let session = match (parsed.session, &self.service.sessions) {
            (None, _) => None,
            (Some(id), Some(sessions)) => Some((id, sessions.clone())),
            (Some(_), None) => return Err(unsupported(self.service.runner.backend().name())),
        };
        Ok(Call {
            request: parsed.request,
            session,
            clamped: parsed.clamped,
            replacements: parsed.replacements,
        })
    }
}

/// One parsed `run_python` call.
struct Call {
    request: RunRequest,
    session: Option<(SessionId, Arc<SessionManager>)>,
    clamped: Vec<Clamped>,
    /// The tools that replace exposed ones for this run (kept with it if it suspends).
    replacements: Vec<Arc<dyn pycage_tools::Tool>>,
}

/// A reply as `run_python`'s output: the text for the model (the result, what was
/// clamped, the call a paused run waits at), the structured reply, and the files.
fn output(reply: Reply) -> ToolOutput {
    let mut text = reply.result.for_model();
    if let Some(note) = clamp::note(&reply.clamped) {
        text.push_str(&note);
        text.push('\n');
    }
    if let Some(pending) = &reply.pending {
        text.push_str(&format!(
            "The run is paused (run_id \"{}\"): its tool call {} (`{}` with {}) waits for a \
             person's approval.\n",
            pending.run_id,
            pending.call.position,
            pending.call.tool,
            Value::Object(pending.call.args.clone()),
        ));
    }
    let structured = Value::Object(reply.body(false));
    ToolOutput {
        structured,
        text,
        is_error: !reply.result.ok,
        files: reply.result.files,
        pending: reply.pending,
    }
}

fn object(input: &Value) -> Result<&Map<String, Value>, RunError> {
    input
        .as_object()
        .ok_or_else(|| invalid("the tool input must be a JSON object".into()))
}

fn invalid(why: String) -> RunError {
    RunError::new(ErrorKind::InvalidInput, why)
}

fn unsupported(backend: &str) -> RunError {
    RunError::new(
        ErrorKind::Unsupported,
        format!("the {backend} backend does not keep sessions"),
    )
}

#[cfg(test)]
#[path = "python_tests.rs"]
mod tests;

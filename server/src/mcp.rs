//! The `run_python` tool over the Model Context Protocol, on the official SDK (`rmcp`).
//!
//! [`McpServer`] is an `rmcp` [`ServerHandler`]: it lists `run_python` (and, where the
//! backend keeps sessions, `create_session` and `close_session`; then `resume_run`, for a run
//! that stopped at a call waiting for a person's approval) with the descriptions and
//! schemas [`PythonTool`] generates, and maps each call onto it. A guest's failure, a limit,
//! bad input or a busy server is a tool result with `isError: true`, never a protocol error.
//!
//! A run that stops at a call waiting for a person's approval asks that person, never the
//! model: through MCP elicitation where the client supports it (an `elicitation/create`
//! request on protocols before 2026-07-28; an `input_required` result the client answers
//! and retries on 2026-07-28 and later), and the run goes on in the same tool call. Where
//! the client cannot ask, the model gets the run's id: it may deny the call with
//! `resume_run`, and approve it only with the one-time code the server showed the person
//! ([`PythonTool::with_approval_channel`]).
//! A long run sends `notifications/progress` when the client gave a progress token; a
//! client's `notifications/cancelled` stops the run at once and frees its slot.
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let tool = pycage_server::PythonTool::start(&pycage_server::ServerConfig::default()).await?;
//! pycage_server::mcp::serve_stdio(std::sync::Arc::new(tool)).await?;
//! # Ok(())
//! # }
//! ```

pub mod http;

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use pycage::{Decision, OutputFile};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, Implementation,
    InputRequest, InputRequiredResult, InputResponses, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ResourceContents, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::python::{
    CLOSE_SESSION, CREATE_SESSION, PendingApproval, Progress, PythonTool, RESUME_RUN, RUN_PYTHON,
    ToolOutput,
};
use crate::schema;

/// The key of the approval question in an `input_required` result's `inputRequests`.
const APPROVAL_INPUT: &str = "approval";

/// The URI scheme of a produced file's embedded resource: `pycage-file:///out/data.csv`.
pub const FILE_URI_PREFIX: &str = "pycage-file:///";

/// What a file's path escapes in its URI: everything but RFC 3986's unreserved characters
/// and `/`.
const PATH_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `run_python` and its session tools as an MCP server (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct McpServer {
    tool: Arc<PythonTool>,
    tools: Arc<Vec<Tool>>,
}

impl McpServer {
    /// The server over `tool`.
    pub fn new(tool: Arc<PythonTool>) -> Self {
        let mut tools = vec![
            Tool::new(
                RUN_PYTHON,
                tool.text().to_owned(),
                object(tool.input_schema().clone()),
            )
            .with_title("Run Python in a sandbox")
            .with_raw_output_schema(object(tool.output_schema().clone()))
            .with_annotations(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(false)
                    .open_world(false),
            ),
        ];
        if tool.sessions().is_some() {
            tools.push(Tool::new(
                CREATE_SESSION,
                "Starts a Python session for `run_python`: the calls that pass its \
                 `session_id` share global variables, imports and files. `limits` (optional) \
                 sets the session's own limits, within the server's maxima. Returns the id.",
                object(tool.create_session_schema()),
            ));
            tools.push(Tool::new(
                CLOSE_SESSION,
                "Destroys a session made by `create_session`: its interpreter, variables and \
                 files.",
                object(schema::close_session_input()),
            ));
        }
        tools.push(
            Tool::new(
                RESUME_RUN,
                "Finishes a `run_python` run that came back `suspended` because one of its \
                 tool calls waits for a person's approval. You may `deny` the call yourself \
                 (the code gets a ToolError of kind `denied`). Only the user may allow it: \
                 `approve` (the tool runs now) or `answer` (the code gets `answer` as the \
                 call's result) need `approval_code`, the code the pycage server showed the \
                 user, as they gave it to you. Returns the run's result, as `run_python` \
                 does.",
                object(schema::resume_run_input()),
            )
            .with_title("Resume a run after a person's decision")
            .with_raw_output_schema(object(tool.output_schema().clone()))
            .with_annotations(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(true)
                    .open_world(false),
            ),
        );
        McpServer {
            tool,
            tools: Arc::new(tools),
        }
    }

    /// The tool the server maps.
    pub fn tool(&self) -> &Arc<PythonTool> {
        &self.tool
    }

    async fn run_python(&self, input: Value, context: &RequestContext<RoleServer>) -> ToolOutput {
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let on_progress = |p: Progress| {
            let (token, peer) = (token.clone(), peer.clone());
            async move {
                let Some(token) = token else { return };
                let seconds = p.elapsed.as_secs_f64();
                let param = ProgressNotificationParam::new(token, seconds).with_message(format!(
                    "running for {seconds:.1} s; output so far: {} bytes on stdout, {} on stderr",
                    p.stdout_bytes, p.stderr_bytes
                ));
                // A client that has gone cannot be told; the run goes on until it is
                // cancelled or ends.
                if let Err(e) = peer.notify_progress(param).await {
                    tracing::debug!("a progress notification was not sent: {e}");
                }
            }
        };
        self.tool
            .run_for(client(context), &input, on_progress)
            .await
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("pycage", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "pycage runs Python code in a sandbox: call `run_python`; its description \
                 says what the code can do and every limit.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let call = async {
            // A retry after an `input_required` result: the client's answer to the approval
            // question, for the run its `requestState` names.
            if let Some(token) = &request.request_state {
                let decision = answered(request.input_responses.as_ref())?;
                let output = self.tool.decide_by_token(token, decision).await;
                return Ok(self.settle(output, &context).await);
            }
            let input = Value::Object(request.arguments.clone().unwrap_or_default());
            let output = match request.name.as_ref() {
                RUN_PYTHON => self.run_python(input, &context).await,
                RESUME_RUN => self.tool.resume(&input).await,
                CREATE_SESSION if self.tool.sessions().is_some() => {
                    self.tool.create_session(&input).await
                }
                CLOSE_SESSION if self.tool.sessions().is_some() => self.tool.close_session(&input),
                other => {
                    return Err(ErrorData::invalid_params(
                        format!("no tool `{}`", other.escape_debug()),
                        None,
                    ));
                }
            };
            Ok(self.settle(output, &context).await)
        };
        tokio::select! {
            response = call => response,
            // rmcp sends nothing for a cancelled request; dropping `call` stops the run and
            // frees its slot.
            () = context.ct.cancelled() => Err(ErrorData::internal_error("cancelled", None)),
        }
    }
}

/// How a client can put a question to its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asker {
    /// An `elicitation/create` request, answered within the tool call (before 2026-07-28).
    Request,
    /// An `input_required` result the client answers and retries with (2026-07-28 on).
    Retry,
    /// The client declared no form elicitation.
    None,
}

impl Asker {
    fn of(context: &RequestContext<RoleServer>) -> Self {
        let form = context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            // A capability naming neither mode means form (the 2025-06-18 shape).
            .is_some_and(|e| e.form.is_some() || e.url.is_none());
        match context.protocol_version() {
            _ if !form => Asker::None,
            Some(version) if !version.has_initialize() => Asker::Retry,
            _ => Asker::Request,
        }
    }
}

impl McpServer {
    /// A tool's output as the call's response: a run that waits for approval asks the
    /// person (see the [module docs](self)) and goes on with their decision, as often as it
    /// stops; one the client cannot ask about is returned with what the model may do.
    async fn settle(
        &self,
        mut output: ToolOutput,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        loop {
            let Some(pending) = output.pending.clone() else {
                return result(output).into();
            };
            match Asker::of(context) {
                Asker::Retry => {
                    // The state names the run and carries a one-time code, so a retry
                    // answers this question only.
                    let Some(token) = self.tool.approval_token(&pending.run_id) else {
                        self.tool.ask_out_of_band(&mut output);
                        return result(output).into();
                    };
                    let question = ElicitRequest::new(question(&pending));
                    let asks = BTreeMap::from([(
                        APPROVAL_INPUT.to_owned(),
                        InputRequest::Elicitation(question),
                    )]);
                    return InputRequiredResult::new(Some(asks), Some(token)).into();
                }
                Asker::Request => {
                    let asked = context
                        .peer
                        .create_elicitation_with_timeout(
                            question(&pending),
                            Some(self.tool.suspended_ttl()),
                        )
                        .await;
                    let decision = match asked {
                        Ok(answer) => decision(&answer),
                        Err(e) => {
                            // No answer is no approval.
                            tracing::info!("the approval question got no answer: {e}");
                            Decision::Deny
                        }
                    };
                    output = self.tool.decide(&pending.run_id, decision).await;
                }
                Asker::None => {
                    self.tool.ask_out_of_band(&mut output);
                    return result(output).into();
                }
            }
        }
    }
}

/// The client a call comes from, where the transport tells clients apart: the MCP session
/// of a call over streamable HTTP (its `Mcp-Session-Id`, which the server issued). A stdio
/// server has one client, and a stateless request names none.
fn client(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    let session = parts.headers.get("mcp-session-id")?.to_str().ok()?;
    Some(format!("mcp-session:{session}"))
}

/// The approval question for a person: the call, its tool and arguments; accepting it
/// allows the call, declining or dismissing it denies it.
fn question(pending: &PendingApproval) -> ElicitRequestParams {
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "{} Accept to run it; decline to refuse it (the code gets a ToolError).",
            pending.question()
        ),
        requested_schema: ElicitationSchema::new(BTreeMap::new()),
    }
}

/// A person's decision from their answer: only an explicit accept approves.
fn decision(answer: &ElicitResult) -> Decision {
    match answer.action {
        ElicitationAction::Accept => Decision::Approve,
        _ => Decision::Deny,
    }
}

/// The decision in a retried call's `inputResponses`.
fn answered(responses: Option<&InputResponses>) -> Result<Decision, ErrorData> {
    let answer = responses
        .and_then(|r| r.get(APPROVAL_INPUT))
        .ok_or_else(|| {
            ErrorData::invalid_params(
                format!("a retried call needs `inputResponses.{APPROVAL_INPUT}`"),
                None,
            )
        })?;
    let answer: ElicitResult = serde_json::from_value(answer.clone()).map_err(|e| {
        ErrorData::invalid_params(
            format!("`inputResponses.{APPROVAL_INPUT}` is not an elicitation result: {e}"),
            None,
        )
    })?;
    Ok(decision(&answer))
}

/// Serves `tool` over MCP on this process's stdin and stdout until the client closes stdin.
/// Logs must go to stderr: stdout carries protocol messages only.
///
/// # Errors
///
/// When the client's `initialize` fails or the transport breaks.
pub async fn serve_stdio(tool: Arc<PythonTool>) -> Result<(), Box<dyn std::error::Error>> {
    let running = McpServer::new(tool).serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// The MCP result for one call: the text, each produced file as an embedded resource (its
/// bytes where the run returned them), and the structured object.
fn result(output: ToolOutput) -> CallToolResult {
    let mut content = vec![ContentBlock::text(output.text)];
    content.extend(output.files.iter().filter_map(file_resource));
    let mut result = if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = Some(output.structured);
    result
}

/// A produced file as an embedded resource: text when it is UTF-8, base64 otherwise; `None`
/// for a file past the run's return budget (the text and the structured result list it).
fn file_resource(file: &OutputFile) -> Option<ContentBlock> {
    let bytes = file.bytes.as_ref()?;
    let path = percent_encoding::utf8_percent_encode(&file.path, PATH_ESCAPES);
    let uri = format!("{FILE_URI_PREFIX}{path}");
    let contents = match std::str::from_utf8(bytes) {
        Ok(text) => ResourceContents::text(text, uri),
        Err(_) => {
            ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(bytes), uri)
                .with_mime_type("application/octet-stream")
        }
    };
    Some(ContentBlock::resource(contents))
}

/// A schema as the JSON object `rmcp` takes (every schema here is one).
fn object(schema: Value) -> Arc<JsonObject> {
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

#[cfg(test)]
#[path = "mcp_tests.rs"]
mod tests;

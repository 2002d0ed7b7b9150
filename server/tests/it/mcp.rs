//! The MCP server driven by a real MCP client (rmcp's) over an in-process transport: tools
//! and their descriptions, the seed example, limits as tool errors, sessions, files,
//! progress, cancellation and the bound on concurrent runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pycage_server::mcp::McpServer;
use pycage_server::{ApprovalNotice, PythonTool, ServerConfig};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, ContentBlock, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, FormElicitationCapability, Implementation, InputResponses,
    ProgressNotificationParam, ProtocolVersion, Request, ResourceContents,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt as _, NotificationContext, PeerRequestOptions,
    RequestContext, RunningService,
};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// The seed example: five brokered `add` calls.
const SEED: &str = "total = 0\n\
                    for i in range(1, 6):\n    \
                        r = await add(a=str(total), b=str(i))\n    \
                        total = r['sum']\n\
                    return total";

/// A client that keeps the progress notifications it receives and, when it has a user to
/// ask (`answer`), declares form elicitation and gives that answer to every question.
#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    /// The user's answer to an elicitation; `None`: the client cannot ask (declares none).
    answer: Option<ElicitationAction>,
    /// The protocol the client asks for; `None`: rmcp's newest.
    protocol: Option<ProtocolVersion>,
    /// The questions its user was asked.
    asked: Arc<Mutex<Vec<String>>>,
}

impl Client {
    fn asking(answer: ElicitationAction, protocol: Option<ProtocolVersion>) -> Self {
        Client {
            answer: Some(answer),
            protocol,
            ..Client::default()
        }
    }
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams { message, .. } = request else {
            panic!("pycage asks with a form");
        };
        self.asked.lock().unwrap().push(message);
        let answer = self.answer.clone().expect("asked a client that cannot ask");
        Ok(ElicitResult::new(answer))
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.answer.is_some() {
            capabilities.elicitation =
                Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        }
        let config = ClientConfig::new(capabilities, Implementation::new("pycage-test", "0"));
        match &self.protocol {
            Some(version) => config.with_protocol_version(version.clone()),
            None => config,
        }
    }
}

struct Harness {
    tool: Arc<PythonTool>,
    client: RunningService<RoleClient, Client>,
    handler: Client,
    /// The approval codes the server showed its person.
    notices: Arc<Mutex<Vec<ApprovalNotice>>>,
}

async fn serve(toml: &str) -> Harness {
    serve_as(toml, Client::default(), false).await
}

/// A server on `toml` for `handler`'s client; with `codes`, the server can show its person an
/// approval code (as `pycage mcp` does on stderr).
async fn serve_as(toml: &str, handler: Client, codes: bool) -> Harness {
    let config = ServerConfig::from_toml(toml).unwrap();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut tool = PythonTool::start(&config).await.unwrap();
    if codes {
        let shown = notices.clone();
        tool = tool.with_approval_channel(move |n: &ApprovalNotice| {
            shown.lock().unwrap().push(n.clone());
        });
    }
    let tool = Arc::new(tool);
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = McpServer::new(tool.clone());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    // 2026-07-28 and later have no `initialize`: the client starts with `server/discover`.
    let client = match &handler.protocol {
        Some(version) if !version.has_initialize() => {
            let lifecycle = ClientLifecycleMode::Discover {
                preferred_versions: vec![version.clone()],
            };
            handler
                .clone()
                .serve_with_lifecycle(client_io, lifecycle)
                .await
        }
        _ => handler.clone().serve(client_io).await,
    };
    let client = client.unwrap();
    Harness {
        tool,
        client,
        handler,
        notices,
    }
}

fn params(name: &'static str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(name).with_arguments(arguments)
}

async fn call(h: &Harness, name: &'static str, arguments: Value) -> CallToolResult {
    h.client.call_tool(params(name, arguments)).await.unwrap()
}

fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

fn error_kind(r: &CallToolResult) -> Option<&str> {
    structured(r)["error"]["kind"].as_str()
}

const MATH: &str = "[policy]\nallow = [\"add\"]";

#[tokio::test]
async fn the_tools_and_a_description_that_states_every_limit() {
    let h = serve("[policy]\nallow = [\"add\"]\n[limits]\nwall_timeout = \"7s\"\n[maxima]\nwall_timeout = \"45s\"").await;
    let tools = h.client.list_all_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "run_python",
            "create_session",
            "close_session",
            "resume_run"
        ]
    );
    let run = &tools[0];
    let description = run.description.as_deref().unwrap();
    assert_eq!(description, h.tool.text());
    for needle in [
        "Wall time: 7s",
        "Memory: 256MiB",
        "async def add(",
        "`timeout_seconds` at most 45s",
        "create_session",
    ] {
        assert!(
            description.contains(needle),
            "{needle} not in:\n{description}"
        );
    }
    let input = Value::Object(run.input_schema.as_ref().clone());
    for key in [
        "code",
        "vars",
        "files",
        "files_base64",
        "limits",
        "session_id",
    ] {
        assert!(input["properties"].get(key).is_some(), "{key}: {input}");
    }
    assert_eq!(input["required"], json!(["code"]));
    let output = Value::Object(run.output_schema.as_deref().unwrap().clone());
    assert_eq!(output["type"], "object");
}

#[tokio::test]
async fn the_seed_example_through_a_real_client() {
    let h = serve(MATH).await;
    let r = call(&h, "run_python", json!({"code": SEED})).await;
    assert_eq!(r.is_error, Some(false), "{r:#?}");
    let s = structured(&r);
    assert_eq!(s["ok"], true);
    assert_eq!(s["value"], 15);
    assert_eq!(s["tool_calls"], 5);
    assert_eq!(s["backend"], "wasm");
    assert!(text(&r).starts_with("ok\n"), "{}", text(&r));
    assert!(text(&r).contains("\nvalue: 15\n"), "{}", text(&r));
}

#[tokio::test]
async fn limits_are_tool_errors_and_the_server_keeps_serving() {
    let h = serve("").await;
    let timeout = call(
        &h,
        "run_python",
        json!({"code": "while True: pass", "limits": {"timeout_seconds": 0.5}}),
    )
    .await;
    assert_eq!(timeout.is_error, Some(true));
    assert_eq!(error_kind(&timeout), Some("timeout"));
    assert_eq!(structured(&timeout)["timed_out"], true);
    let memory = call(
        &h,
        "run_python",
        json!({"code": "x = bytearray(1 << 30)", "limits": {"memory_mib": 64}}),
    )
    .await;
    assert_eq!(memory.is_error, Some(true));
    assert_eq!(error_kind(&memory), Some("memory_limit"));
    let after = call(&h, "run_python", json!({"code": "return 'alive'"})).await;
    assert_eq!(structured(&after)["value"], "alive");
}

#[tokio::test]
async fn bad_input_is_a_tool_error_naming_it_and_an_unknown_tool_a_protocol_error() {
    let h = serve("").await;
    for (arguments, needle) in [
        (json!({}), "needs `code`"),
        (json!({"code": "pass", "nope": 1}), "no field `nope`"),
        (
            json!({"code": "pass", "limits": {"timeout": 1}}),
            "no field `timeout`",
        ),
        (
            json!({"code": "pass", "session_id": 3}),
            "`session_id` must be a string",
        ),
        (
            json!({"code": "pass", "files": {"a": "!"}, "files_base64": true}),
            "base64",
        ),
    ] {
        let r = call(&h, "run_python", arguments.clone()).await;
        assert_eq!(r.is_error, Some(true), "{arguments}");
        assert_eq!(error_kind(&r), Some("invalid_input"), "{arguments}");
        let message = structured(&r)["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{arguments}: {message}");
    }
    let unknown = h.client.call_tool(params("run_ruby", json!({}))).await;
    assert!(unknown.is_err(), "{unknown:?}");
}

#[tokio::test]
async fn limits_above_the_maxima_are_lowered_and_the_result_says_so() {
    let h = serve("[maxima]\nwall_timeout = \"40s\"").await;
    let r = call(
        &h,
        "run_python",
        json!({"code": "return 1", "limits": {"timeout_seconds": 600}}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:#?}");
    let clamped = &structured(&r)["clamped"];
    assert_eq!(
        clamped,
        &json!([{"field": "timeout_seconds", "asked": 600, "got": 40.0}])
    );
    assert!(
        text(&r).contains("timeout_seconds 600 → 40"),
        "{}",
        text(&r)
    );
}

/// One input for both servers: the library's limit names, as HTTP takes them, work here.
#[tokio::test]
async fn limits_take_the_library_names_too() {
    let h = serve("[maxima]\nwall_timeout = \"40s\"").await;
    let r = call(
        &h,
        "run_python",
        json!({"code": "return 1", "limits": {"wall_timeout": "2m", "max_files": 3}}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:#?}");
    assert_eq!(
        structured(&r)["clamped"],
        json!([{"field": "wall_timeout", "asked": "2m", "got": "40s"}])
    );
    let r = call(
        &h,
        "run_python",
        json!({"code": "return 1", "limits": {"memory_mib": 100, "memory_bytes": 104857600}}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:#?}");
    assert!(text(&r).contains("names both"), "{}", text(&r));
}

#[tokio::test]
async fn a_session_keeps_state_across_three_calls_and_closes() {
    let h = serve("").await;
    let created = call(&h, "create_session", json!({})).await;
    assert_eq!(created.is_error, Some(false), "{created:#?}");
    let id = structured(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = call(
        &h,
        "run_python",
        json!({"code": "x = 40", "session_id": id}),
    )
    .await;
    assert_eq!(structured(&first)["ok"], true, "{first:#?}");
    call(
        &h,
        "run_python",
        json!({"code": "x += 1", "session_id": id}),
    )
    .await;
    let third = call(
        &h,
        "run_python",
        json!({"code": "return x + 1", "session_id": id}),
    )
    .await;
    assert_eq!(structured(&third)["value"], 42);
    assert_eq!(structured(&third)["session_id"], id.as_str());
    // A one-shot call does not see the session's globals.
    let fresh = call(&h, "run_python", json!({"code": "return 'x' in globals()"})).await;
    assert_eq!(structured(&fresh)["value"], false);
    let closed = call(&h, "close_session", json!({"session_id": id})).await;
    assert_eq!(closed.is_error, Some(false));
    let gone = call(
        &h,
        "run_python",
        json!({"code": "return x", "session_id": id}),
    )
    .await;
    assert_eq!(error_kind(&gone), Some("session_not_found"));
    let again = call(&h, "close_session", json!({"session_id": id})).await;
    assert_eq!(error_kind(&again), Some("session_not_found"));
}

#[tokio::test]
async fn a_session_past_the_live_bound_is_refused() {
    let h = serve("[sessions]\nmax_sessions = 1").await;
    let first = call(&h, "create_session", json!({})).await;
    assert_eq!(first.is_error, Some(false));
    let second = call(&h, "create_session", json!({})).await;
    assert_eq!(error_kind(&second), Some("too_many_sessions"));
}

#[tokio::test]
async fn files_go_in_as_text_or_base64_and_come_back_as_embedded_resources() {
    let h = serve("").await;
    let code = "import os\n\
                data = open('in.txt').read() + open('raw.bin', 'rb').read().hex()\n\
                os.makedirs('out', exist_ok=True)\n\
                open('out/report.txt', 'w').write(data.upper())\n\
                open('blob.bin', 'wb').write(bytes([0, 255]))\n\
                return data";
    let r = call(
        &h,
        "run_python",
        json!({"code": code, "files": {"in.txt": "hi ", "raw.bin": "AAE="}, "files_base64": false}),
    )
    .await;
    // Without the flag `raw.bin` is text; with it both are base64.
    assert_eq!(structured(&r)["value"], "hi 4141453d", "{r:#?}");
    let r = call(
        &h,
        "run_python",
        json!({"code": code, "files": {"in.txt": "aGkg", "raw.bin": "AAE="}, "files_base64": true}),
    )
    .await;
    assert_eq!(structured(&r)["value"], "hi 0001", "{r:#?}");
    let listed: Vec<_> = structured(&r)["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ["blob.bin", "out/report.txt"]);
    let mut resources = Vec::new();
    for content in &r.content {
        if let ContentBlock::Resource(embedded) = content {
            resources.push(embedded.resource.clone());
        }
    }
    assert_eq!(resources.len(), 2, "{:#?}", r.content);
    match &resources[0] {
        ResourceContents::BlobResourceContents { uri, blob, .. } => {
            assert_eq!(uri, "pycage-file:///blob.bin");
            assert_eq!(blob, "AP8=");
        }
        other => panic!("{other:?}"),
    }
    match &resources[1] {
        ResourceContents::TextResourceContents { uri, text, .. } => {
            assert_eq!(uri, "pycage-file:///out/report.txt");
            assert_eq!(text, "HI 0001");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_long_run_reports_progress() {
    let h = serve("[runs]\nprogress_interval = \"100ms\"").await;
    let r = call(
        &h,
        "run_python",
        json!({
            "code": "print('x' * 1234, flush=True)\nwhile True: pass",
            "limits": {"timeout_seconds": 2},
        }),
    )
    .await;
    assert_eq!(error_kind(&r), Some("timeout"), "{r:#?}");
    // The client handles notifications on a task of its own: one may land after the result.
    for _ in 0..500 {
        if !h.handler.progress.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let progress = h.handler.progress.lock().unwrap().clone();
    assert!(
        !progress.is_empty(),
        "no progress notification: {}",
        structured(&r)
    );
    let elapsed: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert!(elapsed.windows(2).all(|w| w[0] < w[1]), "{elapsed:?}");
    assert!(
        progress[0]
            .message
            .as_deref()
            .unwrap()
            .starts_with("running for")
    );
    // The output so far: the line (and its newline) printed before the loop.
    let last = progress.last().unwrap().message.as_deref().unwrap();
    assert!(
        last.ends_with("output so far: 1235 bytes on stdout, 0 on stderr"),
        "{last}"
    );
}

/// Starts a run that spins until its 20 s timeout, and waits until it holds a slot.
async fn start_spinning(h: &Harness) -> rmcp::service::RequestHandle<rmcp::RoleClient> {
    let request = ClientRequest::CallToolRequest(Request::new(params(
        "run_python",
        json!({"code": "while True: pass", "limits": {"timeout_seconds": 20}}),
    )));
    let handle = h
        .client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    for _ in 0..500 {
        if h.tool.runs_in_progress() == 1 {
            return handle;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the spinning run never took its slot");
}

#[tokio::test]
async fn beyond_the_concurrency_bound_a_call_is_busy_and_a_cancel_frees_the_slot() {
    // No slot within `queue_timeout`: busy then; no room to wait (`max_queued = 0`): busy at
    // once, long before the spinning run's 20 s (the admission path `pycage serve` shares).
    for runs in [
        "queue_timeout = \"300ms\"",
        "max_queued = 0\nqueue_timeout = \"60s\"",
    ] {
        beyond_the_bound(&format!("[runs]\nmax_concurrent = 1\n{runs}")).await;
    }
}

async fn beyond_the_bound(toml: &str) {
    let h = serve(toml).await;
    let spinning = start_spinning(&h).await;
    let busy = call(&h, "run_python", json!({"code": "return 1"})).await;
    assert_eq!(busy.is_error, Some(true));
    assert_eq!(error_kind(&busy), Some("busy"), "{busy:#?}");
    spinning.cancel(Some("test".into())).await.unwrap();
    // The slot is freed by the cancel, long before the spinning run's 20 s timeout.
    for _ in 0..500 {
        if h.tool.runs_in_progress() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.tool.runs_in_progress(),
        0,
        "the cancelled run kept its slot"
    );
    let after = call(&h, "run_python", json!({"code": "return 2"})).await;
    assert_eq!(structured(&after)["value"], 2, "{after:#?}");
}

#[tokio::test]
async fn a_cancelled_session_run_ends_its_session() {
    let h = serve("").await;
    let created = call(&h, "create_session", json!({})).await;
    let id = structured(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let request = ClientRequest::CallToolRequest(Request::new(params(
        "run_python",
        json!({"code": "while True: pass", "session_id": id}),
    )));
    let handle = h
        .client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    for _ in 0..500 {
        if h.tool.runs_in_progress() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.cancel(None).await.unwrap();
    let next = call(
        &h,
        "run_python",
        json!({"code": "return 1", "session_id": id}),
    )
    .await;
    assert_eq!(error_kind(&next), Some("session_ended"), "{next:#?}");
}

#[tokio::test]
async fn a_session_made_with_its_own_limits_keeps_them() {
    let h = serve("").await;
    let created = call(
        &h,
        "create_session",
        json!({"limits": {"memory_mib": 64, "timeout_seconds": 900}}),
    )
    .await;
    let s = structured(&created);
    assert_eq!(s["limits"]["memory_bytes"], 64 << 20, "{s}");
    // The default maxima are the limits: 30 s.
    assert_eq!(s["clamped"][0]["field"], "timeout_seconds", "{s}");
    let id = s["session_id"].as_str().unwrap().to_owned();
    let big = call(
        &h,
        "run_python",
        json!({"code": "x = bytearray(100 << 20)", "session_id": id}),
    )
    .await;
    assert_eq!(error_kind(&big), Some("memory_limit"), "{big:#?}");
    let bad = call(&h, "create_session", json!({"limit": {}})).await;
    assert_eq!(error_kind(&bad), Some("invalid_input"));
}

/// The code of the approval tests: `echo` waits for a person; it returns what echo gave, or
/// the kind of the ToolError the code got.
const GATED: &str = "r = await add(a=1, b=2)\ntry:\n    e = await echo(text=str(r['sum']))\n\
                     except ToolError as x:\n    e = x.kind\nreturn e";
const APPROVE_ECHO: &str = "[policy]\nallow = [\"add\", \"echo\"]\napprove = [\"echo\"]";

/// A client that cannot ask its user: the run comes back suspended; the model may deny it,
/// and approve it only with the code the server showed the person.
#[tokio::test]
async fn a_call_that_needs_approval_suspends_and_resume_run_finishes_it() {
    let h = serve_as(APPROVE_ECHO, Client::default(), true).await;
    let tools = h.client.list_all_tools().await.unwrap();
    let resume = tools.iter().find(|t| t.name == "resume_run").unwrap();
    assert_eq!(
        resume.annotations.as_ref().unwrap().destructive_hint,
        Some(true),
        "a client asks before an approval goes through"
    );
    let description = h.tool.text();
    assert!(
        description.contains("needs a person's approval"),
        "{description}"
    );
    let paused = call(&h, "run_python", json!({"code": GATED})).await;
    let s = structured(&paused);
    assert_eq!(s["status"], "suspended", "{s:#}");
    assert_eq!(s["pending"]["tool"], "text.echo");
    assert!(text(&paused).contains("approval_code"), "{}", text(&paused));
    let id = s["run_id"].as_str().unwrap().to_owned();
    let code = h.notices.lock().unwrap()[0].code.clone();
    assert!(
        !text(&paused).contains(&code),
        "the model never sees the code"
    );

    let done = call(&h, "resume_run", json!({"run_id": id, "decision": "deny"})).await;
    assert_eq!(done.is_error, Some(false), "{}", text(&done));
    assert_eq!(structured(&done)["value"], "denied");
    assert_eq!(structured(&done)["status"], "completed");
    let spent = call(
        &h,
        "resume_run",
        json!({"run_id": id, "decision": "approve", "approval_code": code}),
    )
    .await;
    assert_eq!(error_kind(&spent), Some("invalid_input"));

    let id = structured(&call(&h, "run_python", json!({"code": GATED})).await)["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let code = h.notices.lock().unwrap()[1].code.clone();
    let done = call(
        &h,
        "resume_run",
        json!({"run_id": id, "decision": "approve", "approval_code": code}),
    )
    .await;
    assert_eq!(
        structured(&done)["value"],
        json!({"text": "3"}),
        "{}",
        text(&done)
    );
}

/// Issue 37, hole 4: `resume_run` is a tool the model calls, so its own `approve` (or a
/// forged `answer`) must not go through: without the person's code it is refused and the
/// gated call never runs; a wrong code ends the run; a server with no channel to the person
/// can only deny.
#[tokio::test]
async fn the_model_cannot_approve_its_own_gated_call() {
    let gated = "await echo(text='secret')\nreturn 'echo ran'";
    for codes in [true, false] {
        let h = serve_as(APPROVE_ECHO, Client::default(), codes).await;
        let paused = call(&h, "run_python", json!({"code": gated})).await;
        let id = structured(&paused)["run_id"].as_str().unwrap().to_owned();
        for forged in [
            json!({"run_id": id, "decision": "approve"}),
            json!({"run_id": id, "decision": "answer", "answer": {"text": "forged"}}),
        ] {
            let r = call(&h, "resume_run", forged).await;
            assert_eq!(error_kind(&r), Some("capability_denied"), "{}", text(&r));
            assert_ne!(structured(&r)["value"], "echo ran");
        }
        if codes {
            // Without a code the run waits on; a wrong one ends it.
            let real = h.notices.lock().unwrap()[0].code.clone();
            let wrong = if real.starts_with('0') { "1" } else { "0" }.to_owned() + &real[1..];
            let r = call(
                &h,
                "resume_run",
                json!({"run_id": id, "decision": "approve", "approval_code": wrong}),
            )
            .await;
            assert_eq!(error_kind(&r), Some("capability_denied"), "{}", text(&r));
            let r = call(
                &h,
                "resume_run",
                json!({"run_id": id, "decision": "approve", "approval_code": real}),
            )
            .await;
            assert_eq!(error_kind(&r), Some("invalid_input"), "{}", text(&r));
        } else {
            assert!(
                text(&paused).contains("cannot be approved here"),
                "{}",
                text(&paused)
            );
            let r = call(&h, "resume_run", json!({"run_id": id, "decision": "deny"})).await;
            assert_ne!(structured(&r)["value"], "echo ran");
            assert!(
                text(&r).contains("denied"),
                "the code got the denial: {}",
                text(&r)
            );
        }
    }
}

/// A client that can ask its user puts the question to the person and the run finishes in
/// the same tool call: by `elicitation/create` on a protocol before 2026-07-28, by an
/// `input_required` result and a retry on 2026-07-28 (rmcp's client retries on its own).
#[tokio::test]
async fn a_client_that_can_ask_its_user_settles_the_call_in_one_tool_call() {
    for protocol in [
        Some(ProtocolVersion::V_2026_07_28),
        Some(ProtocolVersion::V_2025_11_25),
        Some(ProtocolVersion::V_2025_06_18),
    ] {
        for (answer, value) in [
            (ElicitationAction::Accept, json!({"text": "3"})),
            (ElicitationAction::Decline, json!("denied")),
            (ElicitationAction::Cancel, json!("denied")),
        ] {
            let client = Client::asking(answer.clone(), protocol.clone());
            let h = serve_as(APPROVE_ECHO, client, true).await;
            let done = call(&h, "run_python", json!({"code": GATED})).await;
            let s = structured(&done);
            assert_eq!(s["status"], "completed", "{protocol:?} {answer:?}: {s:#}");
            assert_eq!(s["value"], value, "{protocol:?} {answer:?}");
            let asked = h.handler.asked.lock().unwrap().clone();
            assert_eq!(asked.len(), 1, "{asked:?}");
            assert!(asked[0].contains("`text.echo`"), "{asked:?}");
            assert!(
                h.notices.lock().unwrap().is_empty(),
                "no code where the user is asked"
            );
        }
    }
}

/// A retry's `requestState` is the client's to send: one that names a run but not the
/// question's one-time code ends the run instead of approving it.
#[tokio::test]
async fn a_forged_retry_does_not_approve() {
    let client = Client::asking(
        ElicitationAction::Accept,
        Some(ProtocolVersion::V_2026_07_28),
    );
    let h = serve_as(APPROVE_ECHO, client, false).await;
    let first = h
        .client
        .call_tool_once(params("run_python", json!({"code": GATED})))
        .await
        .unwrap();
    let CallToolResponse::InputRequired(asked) = first else {
        panic!("expected input_required, got {first:?}");
    };
    let state = asked.request_state.unwrap();
    let (run_id, _code) = state.split_once('.').unwrap();
    let accept: InputResponses = [("approval".to_owned(), json!({"action": "accept"}))]
        .into_iter()
        .collect();
    let retry = |state: String| {
        params("run_python", json!({"code": GATED}))
            .with_input_responses(accept.clone())
            .with_request_state(state)
    };
    let forged = h
        .client
        .call_tool_once(retry(format!("{run_id}.AAAAA-AAAAA")))
        .await
        .unwrap();
    let CallToolResponse::Complete(forged) = forged else {
        panic!("expected a result, got {forged:?}");
    };
    assert_eq!(
        error_kind(&forged),
        Some("capability_denied"),
        "{}",
        text(&forged)
    );
    let late = h.client.call_tool_once(retry(state)).await.unwrap();
    let CallToolResponse::Complete(late) = late else {
        panic!("expected a result, got {late:?}");
    };
    assert_eq!(
        error_kind(&late),
        Some("invalid_input"),
        "the run is over: {}",
        text(&late)
    );
}

/// `[net]`: `run_python` takes `net_allow`, some of the configured hosts, in its schema and
/// narrows net.fetch to them for one call; a host the config lacks is bad input.
#[tokio::test]
async fn net_allow_narrows_fetch_for_one_call_and_cannot_widen_it() {
    let h = serve("[net]\nallow = [\"api.example.com\", \"data.example.org\"]").await;
    let tools = h.client.list_all_tools().await.unwrap();
    let run = tools.iter().find(|t| t.name == "run_python").unwrap();
    assert_eq!(
        run.input_schema["properties"]["net_allow"]["items"]["enum"],
        json!(["api.example.com", "data.example.org"])
    );
    // Narrowed to the other host: this one is refused by the allowlist before any lookup.
    let r = call(
        &h,
        "run_python",
        json!({
            "code": "return await fetch('https://api.example.com/')",
            "net_allow": ["data.example.org"],
        }),
    )
    .await;
    assert_eq!(error_kind(&r), Some("guest_exception"), "{}", text(&r));
    assert!(
        text(&r).contains("api.example.com:443 is not on the network allowlist"),
        "{}",
        text(&r)
    );
    let r = call(
        &h,
        "run_python",
        json!({"code": "return 1", "net_allow": ["evil.example"]}),
    )
    .await;
    assert_eq!(error_kind(&r), Some("invalid_input"), "{}", text(&r));
    assert!(text(&r).contains("`evil.example` is not one of the allowed hosts"));
}

/// Issue 37, holes 3 and 5 over MCP: a resumed run keeps the limits its call asked for, and
/// a run whose state is too big to keep fails as `tool_call_limit` instead of waiting.
#[tokio::test]
async fn a_resumed_run_keeps_its_limits_and_an_oversized_one_is_not_kept() {
    let h = serve_as(
        "[policy]\nallow = [\"add\", \"echo\"]\napprove = [\"echo\"]\n\
         [limits]\nmax_tool_calls = 50\n[suspended]\nmax_run_bytes = 100000\n",
        Client::default(),
        true,
    )
    .await;
    let code = "await echo(text='go')\nn = 0\n\
                try:\n    for _ in range(5):\n        await add(a=1, b=1)\n        n += 1\n\
                except ToolError:\n    pass\nreturn n";
    for (limits, expected) in [(json!({}), 5), (json!({"max_tool_calls": 3}), 2)] {
        let paused = call(&h, "run_python", json!({"code": code, "limits": limits})).await;
        let id = structured(&paused)["run_id"].as_str().unwrap().to_owned();
        let approval_code = h.notices.lock().unwrap().last().unwrap().code.clone();
        let done = call(
            &h,
            "resume_run",
            json!({"run_id": id, "decision": "approve", "approval_code": approval_code}),
        )
        .await;
        assert_eq!(structured(&done)["value"], expected, "{}", text(&done));
    }
    let big = "for _ in range(2):\n    await add(a=1, b=1)\n\
               await echo(text='x' * 120000)\nawait echo(text='again')";
    let r = call(&h, "run_python", json!({"code": big})).await;
    assert_eq!(error_kind(&r), Some("tool_call_limit"), "{}", text(&r));
}

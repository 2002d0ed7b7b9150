//! `pycage serve`: the HTTP API over one [`Runner`], as an axum [`Router`] a host can nest
//! into its own app.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/runs` | one run in a fresh sandbox: `{code, vars?, files?, limits?}` → the `RunResult` JSON |
//! | `POST /v1/runs/{id}/resume` | a run suspended at a call that waits for approval: `{decision: "approve"\|"deny"\|"answer", answer?}` → its result |
//! | `POST /v1/sessions` | a session: `{limits?}` → `{id, expires_in_seconds, limits}` |
//! | `POST /v1/sessions/{id}/runs` | a run in the session |
//! | `GET /v1/sessions/{id}` | its state |
//! | `DELETE /v1/sessions/{id}` | closes it |
//! | `GET /v1/description` | the model-facing description and input schema |
//! | `GET /healthz`, `GET /readyz` | alive; accepting runs |
//! | `GET /metrics` | Prometheus text: runs by outcome and kind, latency and fuel histograms, tool calls by tool and outcome, in-flight and queued runs, live sessions, rejections by reason |
//!
//! A run's body is the same object `run_python` takes ([`crate::input`]), except that
//! `files` holds base64 unless `files_base64` is false. `limits` takes the library's `Limits`
//! names (`{"wall_timeout": "5s", "memory_bytes": 268435456}`) or `timeout_seconds` and
//! `memory_mib` ([`crate::clamp`]), each over the server's defaults, lowered to the server's
//! maxima (the response's `clamped` lists what was). Errors
//! are `{"error": {"kind", "message"}}`: 400 bad input, 401 no or wrong token, 404 unknown
//! session, 409 session busy, 410 session ended, 413 body too large, 422 invalid limits,
//! 429 busy (with `Retry-After`), 503 draining. A guest failure is a 200 with `ok: false`:
//! the request succeeded, the code did not. Every result says its `status`: `completed`,
//! `failed`, or `suspended` (a call of a tool that needs approval is pending: the result has
//! a `run_id` and the `pending` call; resume it with the decision within a day).
//!
//! At most `[runs] max_concurrent` runs at once and `[runs] max_queued` more waiting for a
//! slot; a request beyond both is refused at once with 429, so nothing queues without bound.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pycage::{
    Description, ErrorKind, Limits, RunError, RunResult, Runner, SessionId, SessionManager,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clamp::{self, Clamped};
use crate::front_door;
use crate::input::{self, FilesAs, InputError, RunInput};
use crate::reply::Reply;
use crate::service::{Admission, Refusal, Service};
use crate::{ServerConfig, StartError};

mod metrics;
mod openapi;

/// The header naming a session: on every session response, and accepted by `POST /v1/runs`
/// in place of the path's id, so a load balancer can route a session's requests by it.
pub const SESSION_HEADER: &str = "pycage-session-id";

/// How long a client refused as busy is told to wait (`Retry-After`, seconds).
const RETRY_AFTER_SECONDS: u64 = 1;

/// The API's state: the runner, its sessions, the limits and the bounds. Share it behind an
/// `Arc` (see [`router`]).
#[derive(Debug)]
pub struct HttpApi {
    /// The runner, sessions, suspended runs and admission both servers share.
    service: Service,
    description: Description,
    metrics: Arc<metrics::Metrics>,
}

impl HttpApi {
    /// The API `config` describes (its backend, tools, policy, limits and maxima, sessions and
    /// bounds), described by a probe run.
    ///
    /// # Errors
    ///
    /// [`StartError`] naming what is unusable.
    pub async fn start(config: &ServerConfig) -> Result<Self, StartError> {
        let (runner, maxima) = crate::sandbox::start(config).await?;
        Self::with_runner(runner, config, maxima).await
    }

    /// The API over `runner` (its limits are each run's defaults), with `config`'s sessions
    /// and bounds and the given maxima.
    ///
    /// # Errors
    ///
    /// [`StartError`] naming what is unusable.
    pub async fn with_runner(
        runner: Runner,
        config: &ServerConfig,
        maxima: Limits,
    ) -> Result<Self, StartError> {
        let metrics = Arc::new(metrics::Metrics::new());
        let runner = runner.observed_by(metrics.clone());
        let service = Service::new(runner, config, maxima)?;
        let description = service
            .runner
            .description()
            .session(service.sessions.is_some())
            .build()
            .await
            .map_err(StartError::Describe)?;
        Ok(HttpApi {
            service,
            description,
            metrics,
        })
    }

    /// Stops admitting runs (each new one gets 503); those admitted finish.
    pub fn drain(&self) {
        self.service.drain();
    }

    /// True once [`drain`](Self::drain) was called.
    pub fn is_draining(&self) -> bool {
        self.service.is_draining()
    }

    /// Runs admitted now (running or waiting for a slot).
    pub fn runs_admitted(&self) -> usize {
        self.service.runs_admitted()
    }

    /// Admits one run (see [`Service::admit`]); the admission is held for the run's length.
    async fn admit(&self) -> Result<Admission, ApiError> {
        self.service.admit().await.map_err(ApiError::refused)
    }

    /// Counts a finished run in the metrics (a refusal is counted by the metrics layer).
    fn record(&self, result: &RunResult) {
        if !result.error.as_ref().is_some_and(|e| e.kind.is_refusal()) {
            self.metrics.ran(result);
        }
    }

    /// The metrics' text, with the gauges read now.
    fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let running = self.service.runs_running();
        let admitted = self.runs_admitted();
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.in_flight.set(gauge(running));
        self.metrics
            .queued
            .set(gauge(admitted.saturating_sub(running)));
        let live = self.service.sessions.as_ref().map_or(0, |s| s.len());
        self.metrics.sessions.set(gauge(live));
        self.metrics.encode()
    }

    fn sessions(&self) -> Result<&Arc<SessionManager>, ApiError> {
        self.service.sessions.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "unsupported",
                format!(
                    "the `{}` backend keeps no sessions",
                    self.service.runner.backend().name()
                ),
            )
        })
    }
}

/// A request's error: its status and the `{error: {kind, message}}` body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: String,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind: kind.into(),
            message: message.into(),
        }
    }

    fn internal(message: &str) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    fn bad_input(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    /// Bad input: 400 `invalid_input`, or 422 `invalid_limits` for its `limits`.
    fn of_input(error: InputError) -> Self {
        match error {
            InputError::Limits(why) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_limits", why)
            }
            other => Self::bad_input(other.message()),
        }
    }

    /// A refused admission: 503 while draining, else 429.
    fn refused(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::Draining => Self::new(StatusCode::SERVICE_UNAVAILABLE, "draining", message),
            _ => Self::new(StatusCode::TOO_MANY_REQUESTS, "busy", message),
        }
    }

    /// The status a refused run's error kind takes (one the request caused, not the code).
    fn of_run(error: &RunError) -> Self {
        let status = match error.kind {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::SessionNotFound => StatusCode::NOT_FOUND,
            ErrorKind::SessionBusy => StatusCode::CONFLICT,
            ErrorKind::SessionEnded => StatusCode::GONE,
            ErrorKind::TooManySessions | ErrorKind::Busy => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let kind = serde_json::to_value(error.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "internal".into());
        Self::new(status, kind, error.message.clone())
    }
}

/// Marks a response as a refusal, for the metrics layer to count by its kind.
#[derive(Debug, Clone)]
struct Rejected(String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"kind": self.kind, "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        response.extensions_mut().insert(Rejected(self.kind));
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// The body of `POST /v1/sessions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionBody {
    #[serde(default)]
    limits: Option<Value>,
}

/// A JSON body, or a 400 (413 when too large) saying what is wrong with it.
fn body<T>(parsed: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    parsed.map(|Json(b)| b).map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "body_too_large", rejection.body_text())
        } else {
            ApiError::bad_input(rejection.body_text())
        }
    })
}

/// A run's input ([`input::parse`], with `files` base64 unless `files_base64` is false); a
/// session is named by the path or the [`SESSION_HEADER`], not the body.
fn request(api: &HttpApi, body: &Value) -> Result<RunInput, ApiError> {
    let parsed = input::parse(&api.service, &api.description, body, FilesAs::Base64)
        .map_err(ApiError::of_input)?;
    if parsed.session.is_some() {
        return Err(ApiError::bad_input(format!(
            "`session_id` is not a body field here: run in a session with \
             `POST /v1/sessions/{{id}}/runs` or the `{SESSION_HEADER}` header"
        )));
    }
    Ok(parsed)
}

/// A run's response: a 200 with the result (ok or not) as [`Reply::body`], or the status
/// of an error the request caused before any code ran. A suspended run is kept for its
/// resume, under the `run_id` the body gives.
fn respond(
    api: &HttpApi,
    result: RunResult,
    clamped: Vec<Clamped>,
    session: Option<&SessionId>,
    replacements: Vec<Arc<dyn pycage_tools::Tool>>,
) -> Response {
    if let Some(error) = &result.error
        && error.kind.is_refusal()
    {
        return ApiError::of_run(error).into_response();
    }
    let settled = Reply::settle(
        &api.service.suspended,
        result,
        clamped,
        session.cloned(),
        replacements,
        // One token: the API cannot tell its clients apart (SuspendedConfig).
        None,
    );
    let reply = match settled {
        Ok(reply) => reply,
        Err(busy) => return ApiError::of_run(&busy).into_response(),
    };
    let mut response = Json(Value::Object(reply.body(true))).into_response();
    if let Some(id) = session {
        name_session(&mut response, id);
    }
    response
}

/// Adds the [`SESSION_HEADER`] naming `id`.
fn name_session(response: &mut Response, id: &SessionId) {
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
}

#[utoipa::path(
    post,
    path = "/v1/runs",
    request_body = openapi::RunInput,
    params(("pycage-session-id" = Option<String>, Header, description = "run in this session instead")),
    responses(
        (status = 200, description = "the run's result, ok or not", body = openapi::RunResult),
        (status = 400, description = "bad input", body = openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = openapi::ErrorBody),
        (status = 403, description = "a foreign Host or Origin", body = openapi::ErrorBody),
        (status = 408, description = "the body did not arrive in time", body = openapi::ErrorBody),
        (status = 404, description = "no such session", body = openapi::ErrorBody),
        (status = 413, description = "body too large", body = openapi::ErrorBody),
        (status = 422, description = "invalid limits", body = openapi::ErrorBody),
        (status = 429, description = "busy; see Retry-After", body = openapi::ErrorBody),
        (status = 503, description = "draining", body = openapi::ErrorBody),
    )
)]
async fn run(
    State(api): State<Arc<HttpApi>>,
    headers: axum::http::HeaderMap,
    parsed: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    if let Some(id) = headers.get(SESSION_HEADER) {
        let id = id
            .to_str()
            .map_err(|_| ApiError::bad_input(format!("`{SESSION_HEADER}` is not text")))?
            .to_owned();
        return in_session(&api, &id, parsed).await;
    }
    let run = request(&api, &body(parsed)?)?;
    let _permits = api.admit().await?;
    let result = api.service.runner.run_request(run.request).await;
    api.record(&result);
    Ok(respond(&api, result, run.clamped, None, run.replacements))
}

/// The body of `POST /v1/runs/{id}/resume`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeBody {
    decision: String,
    #[serde(default)]
    answer: Option<Value>,
}

#[utoipa::path(
    post,
    path = "/v1/runs/{id}/resume",
    request_body = openapi::ResumeInput,
    params(("id" = String, Path, description = "the suspended run's `run_id`")),
    responses(
        (status = 200, description = "the resumed run's result (it may be suspended again, under a new run_id)", body = openapi::RunResult),
        (status = 400, description = "bad decision", body = openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = openapi::ErrorBody),
        (status = 403, description = "a foreign Host or Origin", body = openapi::ErrorBody),
        (status = 408, description = "the body did not arrive in time", body = openapi::ErrorBody),
        (status = 404, description = "no suspended run has that id", body = openapi::ErrorBody),
        (status = 429, description = "busy; see Retry-After", body = openapi::ErrorBody),
        (status = 503, description = "draining", body = openapi::ErrorBody),
    )
)]
async fn resume(
    State(api): State<Arc<HttpApi>>,
    Path(id): Path<String>,
    parsed: Result<Json<ResumeBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = body(parsed)?;
    let decision = crate::suspended::decision(Some(&body.decision), body.answer.as_ref())
        .map_err(|e| ApiError::of_run(&e))?;
    let run = api.service.suspended.take(&id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no suspended run has that id (it was resumed, expired or never existed)",
        )
    })?;
    let resumed = api.service.resume(id, run, decision).await;
    let (result, replacements) = resumed.map_err(ApiError::refused)?;
    api.record(&result);
    Ok(respond(&api, result, Vec::new(), None, replacements))
}

#[utoipa::path(
    post,
    path = "/v1/sessions",
    request_body(content = Option<openapi::SessionInput>),
    responses(
        (status = 201, description = "the session", body = openapi::SessionCreated),
        (status = 422, description = "invalid limits", body = openapi::ErrorBody),
        (status = 429, description = "too many sessions", body = openapi::ErrorBody),
        (status = 501, description = "the backend keeps no sessions", body = openapi::ErrorBody),
        (status = 503, description = "draining", body = openapi::ErrorBody),
    )
)]
async fn create_session(
    State(api): State<Arc<HttpApi>>,
    parsed: Option<Json<SessionBody>>,
) -> Result<Response, ApiError> {
    let sessions = api.sessions()?;
    let asked = parsed.map(|Json(b)| b).unwrap_or_default();
    let (limits, clamped) = clamp::apply(
        api.service.runner.limits(),
        &api.service.maxima,
        asked.limits.as_ref(),
    )
    .map_err(ApiError::of_input)?;
    if api.is_draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the server is shutting down and opens no sessions",
        ));
    }
    let id = sessions
        .create_with(limits.clone())
        .await
        .map_err(|e| ApiError::of_run(&e))?;
    let config = sessions.config();
    let body = json!({
        "id": id.as_str(),
        "expires_in_seconds": config.idle_timeout.as_secs_f64(),
        "max_lifetime_seconds": config.max_lifetime.as_secs_f64(),
        "limits": limits,
        "clamped": clamped,
    });
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/sessions/{}", id.as_str())) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    name_session(&mut response, &id);
    Ok(response)
}

fn session_id(api: &HttpApi, id: &str) -> Result<(SessionId, Arc<pycage::Session>), ApiError> {
    let sessions = api.sessions()?;
    let id = SessionId::from(id);
    let session = sessions.get(&id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!(
                "no session `{}` here (closed, expired, or on another replica)",
                id.as_str()
            ),
        )
    })?;
    Ok((id, session))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/runs",
    params(("id" = String, Path, description = "the session's id")),
    request_body = openapi::RunInput,
    responses(
        (status = 200, description = "the run's result, ok or not", body = openapi::RunResult),
        (status = 400, description = "bad input", body = openapi::ErrorBody),
        (status = 404, description = "no such session", body = openapi::ErrorBody),
        (status = 409, description = "the session is running another run", body = openapi::ErrorBody),
        (status = 422, description = "invalid limits", body = openapi::ErrorBody),
        (status = 429, description = "busy; see Retry-After", body = openapi::ErrorBody),
    )
)]
async fn session_run(
    State(api): State<Arc<HttpApi>>,
    Path(id): Path<String>,
    parsed: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    in_session(&api, &id, parsed).await
}

async fn in_session(
    api: &HttpApi,
    id: &str,
    parsed: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (id, _) = session_id(api, id)?;
    let run = request(api, &body(parsed)?)?;
    let _permits = api.admit().await?;
    let result = api.sessions()?.run(&id, run.request).await;
    api.record(&result);
    Ok(respond(
        api,
        result,
        run.clamped,
        Some(&id),
        run.replacements,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "the session's id")),
    responses(
        (status = 200, description = "its state", body = openapi::SessionState),
        (status = 404, description = "no such session", body = openapi::ErrorBody),
    )
)]
async fn session_state(
    State(api): State<Arc<HttpApi>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (id, session) = session_id(&api, &id)?;
    let ended = session.ended();
    Ok(Json(json!({
        "id": id.as_str(),
        "state": if ended.is_some() { "ended" } else if session.is_busy() { "running" } else { "idle" },
        "runs": session.runs(),
        "ended": ended,
        "limits": session.limits(),
    }))
    .into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "the session's id")),
    responses(
        (status = 204, description = "closed"),
        (status = 404, description = "no such session", body = openapi::ErrorBody),
    )
)]
async fn close_session(
    State(api): State<Arc<HttpApi>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (id, _) = session_id(&api, &id)?;
    api.sessions()?.close(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(
    get,
    path = "/v1/description",
    responses((status = 200, description = "what a model is told", body = openapi::DescriptionBody))
)]
async fn description(State(api): State<Arc<HttpApi>>) -> Json<Value> {
    Json(json!({
        "name": api.description.name(),
        "description": api.description.text(),
        "input_schema": api.description.input_schema(),
        "limits": api.service.runner.limits(),
        "maxima": api.service.maxima,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    responses((status = 200, description = "this document"))
)]
async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    use utoipa::OpenApi as _;
    Json(openapi::ApiDoc::openapi())
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(api): State<Arc<HttpApi>>) -> Response {
    if api.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn metrics(State(api): State<Arc<HttpApi>>) -> Response {
    match api.metrics_text() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => ApiError::internal("the metrics do not encode").into_response(),
    }
}

/// Counts every refused request by its kind (the [`Rejected`] mark an [`ApiError`] leaves).
async fn count_rejections(
    State(api): State<Arc<HttpApi>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if let Some(Rejected(kind)) = response.extensions().get::<Rejected>() {
        api.metrics.rejected(kind);
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// The API's routes over `api`: every request's `Host` and `Origin` checked (`localhost`,
/// an IP address or one of `config.allowed_hosts`; no `Origin`, a loopback one or one of
/// `config.allowed_origins`; 403 otherwise, against DNS rebinding and cross-site requests), its body read whole within
/// `config.body_read_timeout` and at most `config.max_body_bytes` (408, 413), and, when
/// `token` is given, every request but `/healthz`, `/readyz` and `/metrics` required to
/// carry it as a bearer token (a scraper inside the cluster reads the metrics without it).
pub fn router(api: Arc<HttpApi>, config: &crate::HttpConfig, token: Option<String>) -> Router {
    let v1 = Router::new()
        .route("/v1/runs", post(run))
        .route("/v1/runs/{id}/resume", post(resume))
        .route("/v1/sessions", post(create_session))
        .route(
            "/v1/sessions/{id}",
            get(session_state).delete(close_session),
        )
        .route("/v1/sessions/{id}/runs", post(session_run))
        .route("/v1/description", get(description))
        .route("/v1/openapi.json", get(openapi_json))
        .fallback(not_found);
    let v1 = match token {
        Some(token) => v1.layer(axum::middleware::from_fn_with_state(
            front_door::Token::new(token, api_refusal),
            front_door::require_token,
        )),
        None => v1,
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(v1)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            crate::listener::BodyLimits::of(config, api_refusal),
            crate::listener::body_deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(
            front_door::Guard::of(config, api_refusal),
            front_door::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            count_rejections,
        ))
        .with_state(api)
}

/// A refusal of the request body as this API's JSON error.
fn api_refusal((status, kind, message): crate::listener::BodyRefusal) -> Response {
    ApiError::new(status, kind, message).into_response()
}

/// Serves the API on `listener` until `stop` completes; then it drains: the listener closes
/// (`/readyz` and runs answer 503 on connections already open), and the requests in flight
/// may finish for up to `config.shutdown_grace`. Those still running then are cancelled
/// (their clients' connections close), and this returns.
///
/// A client must send a request's headers within `config.header_read_timeout` (an idle
/// kept-alive connection is closed after it) and its whole body within
/// `config.body_read_timeout`; at most `config.max_connections` are open at once (see
/// [`router`]).
///
/// # Errors
///
/// When serving fails.
pub async fn serve(
    api: Arc<HttpApi>,
    config: &crate::HttpConfig,
    token: Option<String>,
    listener: tokio::net::TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(api.clone(), config, token);
    crate::listener::serve(app, listener, config, stop, || api.drain()).await
}

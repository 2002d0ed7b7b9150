//! `pycage serve`'s HTTP API over a real socket: the router served on a loopback port, driven
//! by a real HTTP client (reqwest): every route, every error status, the concurrency bound,
//! sessions, auth and drain.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use pycage_server::ServerConfig;
use pycage_server::http::{self, HttpApi};
use reqwest::StatusCode;
use serde_json::{Value, json};

struct Served {
    api: Arc<HttpApi>,
    base: String,
    client: reqwest::Client,
}

async fn serve(toml: &str, token: Option<&str>) -> Served {
    let config = ServerConfig::from_toml(toml).unwrap();
    let api = Arc::new(HttpApi::start(&config).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (api_, token) = (api.clone(), token.map(str::to_owned));
    tokio::spawn(async move {
        http::serve(api_, &config.http, token, listener, std::future::pending())
            .await
            .unwrap()
    });
    Served {
        api,
        base,
        client: client(),
    }
}

impl Served {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (r.status(), r.text().await.unwrap())
    }
}

fn out_file_returned(body: &Value, path: &str) -> Value {
    let files = body["files"].as_array().unwrap();
    files.iter().find(|f| f["path"] == path).unwrap()["returned"].clone()
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or("")
}

const ADD: &str = "[policy]\nallow = [\"add\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_returns_the_result_with_files_and_what_was_clamped() {
    let s = serve(&format!("{ADD}[limits]\nwall_timeout = \"10s\"\n"), None).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let (status, r) = s
        .post(
            "/v1/runs",
            json!({
                "code": "print(open('in.txt').read())\nopen('out.bin', 'wb').write(b'\\x00\\xff')\n\
                         return await add(a=n, b=1)",
                "vars": {"n": 41},
                "files": {"in.txt": b64.encode("hello")},
                "limits": {"wall_timeout": "1h", "memory_bytes": 134217728},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    assert_eq!(r["ok"], json!(true), "{r:#}");
    assert_eq!(r["value"], json!({"sum": 42}));
    assert_eq!(r["stdout"], json!("hello\n"));
    assert_eq!(r["tool_calls"], json!(1));
    let clamped = r["clamped"].as_array().unwrap();
    assert_eq!(clamped.len(), 1, "{r:#}");
    assert_eq!(
        (&clamped[0]["field"], &clamped[0]["asked"]),
        (&json!("wall_timeout"), &json!("1h")),
        "{r:#}"
    );
    assert!(!clamped[0]["got"].is_null(), "{r:#}");
    assert_eq!(out_file_returned(&r, "out.bin"), json!(true));
    let out = r["files"].as_array().unwrap();
    let out = out.iter().find(|f| f["path"] == json!("out.bin")).unwrap();
    assert_eq!(
        b64.decode(out["bytes"].as_str().unwrap()).unwrap(),
        [0, 255]
    );

    // The code's own failure is a 200: the request succeeded, the code did not.
    let (status, r) = s.post("/v1/runs", json!({"code": "1 / 0"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["ok"], json!(false));
    assert_eq!(r["error"]["kind"], json!("guest_exception"));
    let (status, r) = s
        .post(
            "/v1/runs",
            json!({"code": "while True: pass", "limits": {"wall_timeout": "200ms"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["error"]["kind"], json!("timeout"), "{r:#}");
}

/// What a deterministic run prints: the clock and random bytes it sees.
const CLOCK_AND_RANDOM: &str = "import random, time\nprint(time.time(), random.random())";

/// One input for both servers: `run_python`'s spellings work over HTTP too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_takes_the_same_input_run_python_takes() {
    let s = serve("[maxima]\nwall_timeout = \"30s\"\n", None).await;
    let (status, r) = s
        .post(
            "/v1/runs",
            json!({
                "code": "return open('in.txt').read()",
                "files": {"in.txt": "plain text"},
                "files_base64": false,
                "limits": {"timeout_seconds": 600, "memory_mib": 100},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    assert_eq!(r["value"], json!("plain text"), "{r:#}");
    assert_eq!(
        r["clamped"],
        json!([{"field": "timeout_seconds", "asked": 600, "got": 30.0}]),
        "{r:#}"
    );
    // Null is absent for every optional field, `net_allow` too (this server has no [net]).
    let (status, r) = s
        .post(
            "/v1/runs",
            json!({"code": "return 1", "net_allow": null, "limits": null, "vars": null}),
        )
        .await;
    assert_eq!((status, &r["value"]), (StatusCode::OK, &json!(1)), "{r:#}");
    for (body, status, kind) in [
        (
            json!({"code": "1", "limits": {"timeout_seconds": 5, "wall_timeout": "5s"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limits",
        ),
        (
            json!({"code": "1", "session_id": "abc"}),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
        (
            json!({"code": "1", "files_base64": "yes"}),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
    ] {
        let (got, r) = s.post("/v1/runs", body.clone()).await;
        assert_eq!((got, self::kind(&r)), (status, kind), "{body}: {r:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_seed_gives_every_run_and_session_the_same_clock_and_random_bytes() {
    let s = serve("seed = 42\n", None).await;
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let (status, r) = s.post("/v1/runs", json!({"code": CLOCK_AND_RANDOM})).await;
        assert_eq!(status, StatusCode::OK, "{r:#}");
        outputs.push(r["stdout"].as_str().unwrap().to_owned());
    }
    let r = s
        .client
        .post(format!("{}/v1/sessions", s.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/runs"),
            json!({"code": CLOCK_AND_RANDOM}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    outputs.push(r["stdout"].as_str().unwrap().to_owned());
    assert!(outputs.iter().all(|o| *o == outputs[0]), "{outputs:?}");
    // The virtual clock starts at 2000-01-01, not at the host's time.
    let now: f64 = outputs[0]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((946_684_800.0..946_771_200.0).contains(&now), "{outputs:?}");

    // Without a seed, the host's clock and entropy.
    let s = serve("", None).await;
    let (_, a) = s.post("/v1/runs", json!({"code": CLOCK_AND_RANDOM})).await;
    let (_, b) = s.post("/v1/runs", json!({"code": CLOCK_AND_RANDOM})).await;
    assert_ne!(a["stdout"], b["stdout"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_a_json_error() {
    let s = serve("[http]\nmax_body_bytes = 65536\n", None).await;
    let cases = [
        (json!({"code": 1}), StatusCode::BAD_REQUEST, "invalid_input"),
        (json!({}), StatusCode::BAD_REQUEST, "invalid_input"),
        (
            json!({"code": "1", "cod": 2}),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
        (
            json!({"code": "1", "files": {"a.txt": "not base64!"}}),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
        (
            json!({"code": "1", "files": {"../escape": ""}}),
            StatusCode::BAD_REQUEST,
            "invalid_input",
        ),
        (
            json!({"code": "1", "limits": {"wal_timeout": "1s"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limits",
        ),
        (
            json!({"code": "1", "limits": {"memory_bytes": "lots"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limits",
        ),
        (
            json!({"code": "1", "limits": []}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limits",
        ),
        (
            json!({"code": "x".repeat(70_000)}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
    ];
    for (body, want, want_kind) in cases {
        let (status, r) = s.post("/v1/runs", body.clone()).await;
        assert_eq!(status, want, "{body:.100}: {r:#}");
        assert_eq!(kind(&r), want_kind, "{body:.100}: {r:#}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let r = s
        .client
        .post(format!("{}/v1/runs", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let (status, body) = s.get("/v1/nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("not_found"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_state_across_runs_until_it_is_closed() {
    let s = serve("", None).await;
    let r = s
        .client
        .post(format!("{}/v1/sessions", s.base))
        .json(&json!({"limits": {"memory_bytes": 134217728}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let created: Value = r.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/v1/sessions/{id}"));
    assert_eq!(created["limits"]["memory_bytes"], json!(134217728));
    let runs = format!("/v1/sessions/{id}/runs");
    for (code, want) in [
        ("x = 40", Value::Null),
        ("x += 1", Value::Null),
        ("return x + 1", json!(42)),
    ] {
        let (status, r) = s.post(&runs, json!({"code": code})).await;
        assert_eq!(status, StatusCode::OK, "{r:#}");
        assert_eq!(r["value"], want, "{code}: {r:#}");
        assert_eq!(r["session_id"], json!(id));
    }
    // The same session through its header on /v1/runs (what a load balancer routes by).
    let r = s
        .client
        .post(format!("{}/v1/runs", s.base))
        .header("pycage-session-id", &id)
        .json(&json!({"code": "return x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["pycage-session-id"], id.as_str());
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["value"], json!(41), "{r:#}");
    let (status, state) = s.get(&location).await;
    assert_eq!(status, StatusCode::OK);
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["runs"], json!(4), "{state:#}");
    assert_eq!(state["state"], json!("idle"));
    let r = s
        .client
        .delete(format!("{}{location}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, r) = s.post(&runs, json!({"code": "return x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(kind(&r), "session_not_found");
    let (status, _) = s.get("/v1/sessions/nosuchsession").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A run that ends its session is a result (200, its own error); a run sent after it is
/// refused with 410, as nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_an_ended_session_is_410() {
    let s = serve("", None).await;
    let (status, created) = s.post("/v1/sessions", json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created:#}");
    let runs = format!("/v1/sessions/{}/runs", created["id"].as_str().unwrap());
    let spin = json!({"code": "while True: pass", "limits": {"fuel": 20_000_000}});
    let (status, r) = s.post(&runs, spin).await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    assert_eq!(r["error"]["kind"], json!("fuel_exhausted"), "{r:#}");
    assert_eq!(r["session_ended"], json!(true), "{r:#}");
    let (status, r) = s.post(&runs, json!({"code": "return 1"})).await;
    assert_eq!(
        (status, kind(&r)),
        (StatusCode::GONE, "session_ended"),
        "{r:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_runs_and_the_queue_a_request_gets_429_with_retry_after() {
    // No room to wait: refused at once; room, but no slot within `queue_timeout`: refused
    // then (the admission path `pycage mcp` shares).
    for runs in [
        "max_queued = 0\n",
        "max_queued = 4\nqueue_timeout = \"300ms\"\n",
    ] {
        beyond_the_runs(&format!("[runs]\nmax_concurrent = 1\n{runs}")).await;
    }
}

async fn beyond_the_runs(toml: &str) {
    let s = Arc::new(serve(toml, None).await);
    let held = s.clone();
    let spinning = tokio::spawn(async move {
        held.post(
            "/v1/runs",
            json!({"code": "while True: pass", "limits": {"wall_timeout": "3s"}}),
        )
        .await
    });
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while s.api.runs_admitted() == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the spinning run was admitted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = s
        .client
        .post(format!("{}/v1/runs", s.base))
        .json(&json!({"code": "return 1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(kind(&body), "busy");
    let (status, r) = spinning.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["error"]["kind"], json!("timeout"));
    // The slot is free again.
    let (status, r) = s.post("/v1/runs", json!({"code": "return 1"})).await;
    assert_eq!((status, &r["value"]), (StatusCode::OK, &json!(1)), "{r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_required_except_for_health_and_draining_refuses_runs() {
    let s = serve("", Some("s3cret")).await;
    let run = |token: Option<&str>| {
        let mut r = s
            .client
            .post(format!("{}/v1/runs", s.base))
            .json(&json!({"code": "return 1"}));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let refused = run(None).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(kind(&body), "unauthorized");
    assert_eq!(
        run(Some("wrong")).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(run(Some("s3cret")).await.unwrap().status(), StatusCode::OK);
    let description = s
        .client
        .get(format!("{}/v1/description", s.base))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    let description: Value = description.json().await.unwrap();
    assert!(
        description["description"]
            .as_str()
            .unwrap()
            .contains("Wall time"),
        "{description:#}"
    );
    assert_eq!(description["input_schema"]["type"], json!("object"));
    assert_eq!(s.get("/healthz").await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(s.get("/readyz").await.0, StatusCode::OK);

    s.api.drain();
    assert_eq!(s.get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let r = run(Some("s3cret")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(kind(&body), "draining");
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
}

/// Issue 37, hole 1: a foreign `Host` (DNS rebinding) or `Origin` (a cross-site request)
/// gets 403 on every route, the token-free ones included, before the token is looked at and
/// before anything runs; `allowed_hosts` and `allowed_origins` let a named one in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_or_origin_gets_403_on_every_route() {
    let s = serve(
        "[http]\nallowed_hosts = [\"pycage.svc\"]\nallowed_origins = [\"https://app.example\"]\n",
        Some("s3cret"),
    )
    .await;
    let routes = [
        ("POST", "/v1/runs"),
        ("POST", "/v1/runs/abc/resume"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions/abc"),
        ("DELETE", "/v1/sessions/abc"),
        ("POST", "/v1/sessions/abc/runs"),
        ("GET", "/v1/description"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/no/such/route"),
    ];
    let send = |method: &str, path: &str, host: &str, origin: Option<&str>| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = s
            .client
            .request(method, format!("{}{path}", s.base))
            .header(reqwest::header::HOST, host)
            .bearer_auth("s3cret");
        if let Some(origin) = origin {
            r = r.header(reqwest::header::ORIGIN, origin);
        }
        r.send()
    };
    for (method, path) in routes {
        for (host, origin, expected) in [
            ("attacker.example:8080", None, "forbidden_host"),
            (
                "attacker.example",
                Some("http://attacker.example"),
                "forbidden_host",
            ),
            (
                "localhost",
                Some("http://attacker.example:8080"),
                "forbidden_origin",
            ),
            ("localhost", Some("null"), "forbidden_origin"),
            (
                "pycage.svc",
                Some("https://app.example:8443"),
                "forbidden_origin",
            ),
        ] {
            let r = send(method, path, host, origin).await.unwrap();
            let what = format!("{method} {path} Host {host} Origin {origin:?}");
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{what}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(kind(&body), expected, "{what}: {body}");
        }
    }
    // The refusal is as the OpenAPI document says.
    let doc = send("GET", "/v1/openapi.json", "localhost", None)
        .await
        .unwrap();
    let doc: Value = doc.json().await.unwrap();
    let r = send("POST", "/v1/runs", "attacker.example", None)
        .await
        .unwrap();
    let status = r.status();
    conforms(&doc, "/v1/runs", "post", status, &r.json().await.unwrap());
    // None of that ran code or opened a session; each refusal was counted.
    let metrics = s.get("/metrics").await.1;
    assert_eq!(sample(&metrics, "pycage_sessions_live"), 0.0);
    assert!(!metrics.contains("pycage_runs_total{"), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "pycage_requests_rejected_total{reason=\"forbidden_host\"}"
        ),
        25.0
    );
    // A listed host, an address, a loopback page and a listed page are served.
    for (host, origin) in [
        ("pycage.svc:8080", None),
        ("10.0.0.7:8080", None),
        ("localhost", Some("http://localhost:3000")),
        ("pycage.svc", Some("https://app.example")),
    ] {
        let r = send("GET", "/v1/description", host, origin).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "Host {host} Origin {origin:?}");
    }
}

/// The value of the sample `name` (with its labels, as exposed) in the metrics text, or 0.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_runs_tool_calls_and_rejections() {
    let s = serve(ADD, None).await;
    let (status, before) = s.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let add_ok = "pycage_tool_calls_total{tool=\"math.add\",outcome=\"ok\"}";
    assert_eq!(sample(&before, add_ok), 0.0, "{before}");
    for _ in 0..2 {
        let (status, _) = s
            .post("/v1/runs", json!({"code": "return await add(a=1, b=2)"}))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    // A call the tool refuses, and one to a name nothing exposes (counted without its name).
    let (status, _) = s
        .post(
            "/v1/runs",
            json!({"code": "for name in ['add', 'secret.tool']:\n    try: call_tool(name, a=[])\n    except ToolError: pass"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    s.post("/v1/runs", json!({"code": "1 / 0"})).await;
    s.post("/v1/runs", json!({"code": "1", "limits": {"nope": 1}}))
        .await;
    let (_, after) = s.get("/metrics").await;
    assert_eq!(
        sample(&after, "pycage_runs_total{outcome=\"ok\",kind=\"\"}"),
        3.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "pycage_runs_total{outcome=\"error\",kind=\"guest_exception\"}"
        ),
        1.0,
        "{after}"
    );
    assert!(
        after.contains("# TYPE pycage_tool_calls counter"),
        "{after}"
    );
    assert_eq!(sample(&after, add_ok), 2.0, "{after}");
    let refused = "pycage_tool_calls_total{tool=\"math.add\",outcome=\"invalid-arguments\"}";
    assert_eq!(sample(&after, refused), 1.0, "{after}");
    let unknown = "pycage_tool_calls_total{tool=\"\",outcome=\"not-found\"}";
    assert_eq!(sample(&after, unknown), 1.0, "{after}");
    assert!(!after.contains("secret"), "{after}");
    assert_eq!(
        sample(
            &after,
            "pycage_requests_rejected_total{reason=\"invalid_limits\"}"
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "pycage_run_duration_seconds_count"),
        4.0,
        "{after}"
    );
    assert_eq!(sample(&after, "pycage_runs_in_flight"), 0.0, "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_run() {
    let s = serve("[runs]\nmax_concurrent = 1\n", None).await;
    let gone = s
        .client
        .post(format!("{}/v1/runs", s.base))
        .json(&json!({"code": "while True: pass", "limits": {"wall_timeout": "30s"}}))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(gone.is_err_and(|e| e.is_timeout()));
    // The run's slot is freed long before its 30 s limit would have ended it.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while s.api.runs_admitted() != 0 {
        assert!(
            std::time::Instant::now() < until,
            "the run outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, r) = s.post("/v1/runs", json!({"code": "return 1"})).await;
    assert_eq!((status, &r["value"]), (StatusCode::OK, &json!(1)), "{r:#}");
    let (_, text) = s.get("/metrics").await;
    assert!(!text.contains("kind=\"timeout\""), "{text}");
}

/// The schema the served OpenAPI document gives the JSON response of `method path` with
/// `status`, as a validator (its `$ref`s resolved within the document).
fn response_schema(doc: &Value, path: &str, method: &str, status: u16) -> jsonschema::Validator {
    let operation = &doc["paths"][path][method];
    assert!(
        operation.is_object(),
        "{method} {path} is not in the document"
    );
    let schema =
        &operation["responses"][status.to_string()]["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} has no JSON schema for {status}"
    );
    let mut root = schema.as_object().unwrap().clone();
    root.insert("components".into(), doc["components"].clone());
    jsonschema::validator_for(&Value::Object(root)).unwrap()
}

fn conforms(doc: &Value, path: &str, method: &str, status: StatusCode, body: &Value) {
    let validator = response_schema(doc, path, method, status.as_u16());
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: {errors:?}\n{body:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_server_answers_as_its_openapi_document_says() {
    let s = serve(ADD, None).await;
    let (status, doc) = s.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{doc:#}"
    );
    for path in [
        "/v1/runs",
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/runs",
        "/v1/description",
        "/v1/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let (status, r) = s
        .post(
            "/v1/runs",
            json!({
                "code": "open('o.txt', 'w').write('x')\nreturn await add(a=1, b=2)",
                "files": {"i.txt": b64.encode("in")},
                "limits": {"wall_timeout": "1h"},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    conforms(&doc, "/v1/runs", "post", status, &r);
    // The schemas do constrain: a missing field or an undocumented one fails them.
    let result = response_schema(&doc, "/v1/runs", "post", 200);
    assert!(!result.is_valid(&json!({"ok": true})));
    let mut extra = r.clone();
    extra["surprise"] = json!(1);
    assert!(!result.is_valid(&extra));
    let (status, r) = s.post("/v1/runs", json!({"code": "1 / 0"})).await;
    conforms(&doc, "/v1/runs", "post", status, &r);
    let (status, r) = s
        .post("/v1/runs", json!({"code": "1", "limits": {"x": 1}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    conforms(&doc, "/v1/runs", "post", status, &r);
    let (status, r) = s.post("/v1/runs", json!({"cod": "1"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    conforms(&doc, "/v1/runs", "post", status, &r);

    let (status, created) = s.post("/v1/sessions", json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    conforms(&doc, "/v1/sessions", "post", status, &created);
    let id = created["id"].as_str().unwrap();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/runs"),
            json!({"code": "x = 1\nreturn x"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    conforms(&doc, "/v1/sessions/{id}/runs", "post", status, &r);
    let (status, state) = s.get(&format!("/v1/sessions/{id}")).await;
    conforms(
        &doc,
        "/v1/sessions/{id}",
        "get",
        status,
        &serde_json::from_str(&state).unwrap(),
    );
    let (status, missing) = s.get("/v1/sessions/none").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    conforms(
        &doc,
        "/v1/sessions/{id}",
        "get",
        status,
        &serde_json::from_str(&missing).unwrap(),
    );
    let (status, description) = s.get("/v1/description").await;
    conforms(
        &doc,
        "/v1/description",
        "get",
        status,
        &serde_json::from_str(&description).unwrap(),
    );
}

/// What the server sends on `stream` until it closes the connection; panics with `what` when it
/// has not closed it within 20 s.
async fn until_closed(stream: &mut tokio::net::TcpStream, what: &str) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "{what}");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_mid_body_is_cut_off() {
    use tokio::io::AsyncWriteExt as _;
    let s = serve("[http]\nbody_read_timeout = \"500ms\"\n", None).await;
    let addr = s.base.strip_prefix("http://").unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A request that promises 100 bytes of body and sends 10.
    stream
        .write_all(
            b"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"code\": \"",
        )
        .await
        .unwrap();
    let answer = until_closed(&mut stream, "the stalled request was never ended").await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{answer}"
    );
}

/// Issue 37, hole 7: the body deadline counts from the request's start; a 1-byte trickle
/// does not restart it (one lived 12.5 s with a 2 s limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_a_byte_at_a_time_is_ended_at_the_deadline() {
    let s = serve("[http]\nbody_read_timeout = \"1s\"\n", None).await;
    let addr = s.base.strip_prefix("http://").unwrap();
    let head = "POST /v1/runs HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n\
                content-length: 1000\r\n\r\n";
    let (held, answer) = crate::slow_client::trickle(addr, head).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{held:?}: {answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(held < Duration::from_secs(20), "{held:?}");
}

/// Issue 37, hole 7: at most `max_connections` are open; the next waits until one closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_until_one_closes() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let s = serve("[http]\nmax_connections = 2\n", None).await;
    let addr = s.base.strip_prefix("http://").unwrap();
    let first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _second = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early = tokio::time::timeout(Duration::from_secs(1), third.read_to_end(&mut answer)).await;
    assert!(early.is_err(), "served past the cap: {answer:?}");
    drop(first);
    let read = tokio::time::timeout(Duration::from_secs(20), third.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "never served after a connection closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    use tokio::io::AsyncWriteExt as _;
    let s = serve("[http]\nheader_read_timeout = \"500ms\"\n", None).await;
    let addr = s.base.strip_prefix("http://").unwrap();
    // Half a request line, then nothing (slowloris).
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /healthz HT").await.unwrap();
    let answer = until_closed(&mut stream, "the stalled headers were never cut off").await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    // A kept-alive connection is closed once idle for as long; a prompt request is served.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut idle, "the idle connection was never closed").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_swept_without_another_request_for_sessions() {
    let s = serve("[sessions]\nidle_timeout = 1\n", None).await;
    let (status, _) = s.post("/v1/sessions", json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let live = |text: &str| sample(text, "pycage_sessions_live");
    assert_eq!(live(&s.get("/metrics").await.1), 1.0);
    // The server's sweeper (every 10 s) ends it; nothing here asks for a session again.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while live(&s.get("/metrics").await.1) != 0.0 {
        assert!(
            std::time::Instant::now() < until,
            "the idle session was never swept"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_approval_suspends_the_run_and_its_resume_finishes_it() {
    let s = serve(
        "[policy]\nallow = [\"add\", \"echo\"]\napprove = [\"echo\"]\n",
        None,
    )
    .await;
    let (_, doc) = s.get("/v1/openapi.json").await;
    let doc: Value = serde_json::from_str(&doc).unwrap();
    let code = "r = await add(a=1, b=2)\ntry:\n    e = await echo(text=str(r['sum']))\n\
                except ToolError as x:\n    e = x.kind\nprint('got', e)\nreturn e";
    let suspend = || s.post("/v1/runs", json!({"code": code}));

    let (status, r) = suspend().await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    conforms(&doc, "/v1/runs", "post", status, &r);
    assert_eq!(r["status"], "suspended", "{r:#}");
    assert_eq!(r["error"]["kind"], "suspended");
    assert_eq!(r["pending"]["tool"], "text.echo");
    assert_eq!(r["pending"]["args"], json!({"text": "3"}));
    let id = r["run_id"].as_str().unwrap().to_owned();
    let resume = |id: String, body: Value| {
        let s = &s;
        async move { s.post(&format!("/v1/runs/{id}/resume"), body).await }
    };

    let (status, done) = resume(id.clone(), json!({"decision": "approve"})).await;
    assert_eq!(status, StatusCode::OK, "{done:#}");
    conforms(&doc, "/v1/runs/{id}/resume", "post", status, &done);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["value"], json!({"text": "3"}));
    assert_eq!(done["stdout"], "got {'text': '3'}\n");
    assert_eq!(done["tool_calls"], 2);
    // Resumed once: the id is spent.
    let (status, again) = resume(id, json!({"decision": "approve"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(kind(&again), "not_found");
    conforms(&doc, "/v1/runs/{id}/resume", "post", status, &again);

    let id = suspend().await.1["run_id"].as_str().unwrap().to_owned();
    let (status, bad) = resume(id.clone(), json!({"decision": "maybe"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(kind(&bad), "invalid_input");
    // A refused decision leaves the run waiting.
    let (_, denied) = resume(id, json!({"decision": "deny"})).await;
    assert_eq!(denied["value"], "denied", "{denied:#}");

    let id = suspend().await.1["run_id"].as_str().unwrap().to_owned();
    let (_, answered) = resume(id, json!({"decision": "answer", "answer": "by hand"})).await;
    assert_eq!(answered["value"], "by hand", "{answered:#}");
    assert_eq!(answered["status"], "completed");
}

/// Issue 37, hole 5: a resumed run keeps its request's limits and its `net_allow` narrowing
/// (they were lost: after approval a run narrowed to `localhost` fetched 127.0.0.1 and made
/// 5 tool calls with `max_tool_calls: 2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_keeps_its_limits_and_its_net_allow() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "reached" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let s = serve(
        &format!(
            "[net]\nallow = [\"127.0.0.1:{port}\", \"localhost:{port}\"]\n\
             allow_addresses = [\"127.0.0.1/32\"]\n\
             [policy]\nallow = [\"add\", \"echo\", \"net.fetch\"]\napprove = [\"echo\"]\n\
             [limits]\nmax_tool_calls = 50\n"
        ),
        None,
    )
    .await;
    let code = format!(
        "await echo(text='go')\n\
         try:\n    r = fetch_sync('http://127.0.0.1:{port}/')['body']\n\
         except ToolError as e:\n    r = e.kind\n\
         n = 0\n\
         try:\n    for _ in range(5):\n        await add(a=1, b=1)\n        n += 1\n\
         except ToolError as e:\n    pass\n\
         return [r, n]"
    );
    let approved = |body: Value| {
        let s = &s;
        async move {
            let (_, r) = s.post("/v1/runs", body).await;
            assert_eq!(r["status"], "suspended", "{r:#}");
            let id = r["run_id"].as_str().unwrap().to_owned();
            let resume = format!("/v1/runs/{id}/resume");
            s.post(&resume, json!({"decision": "approve"})).await.1
        }
    };
    // Unnarrowed and with the server's limits, the same run reaches the host and adds 5 times.
    let done = approved(json!({"code": code})).await;
    assert_eq!(done["value"], json!(["reached", 5]), "{done:#}");
    // Narrowed to localhost, with at most 3 calls: approval lifts neither.
    let done = approved(json!({
        "code": code,
        "net_allow": [format!("localhost:{port}")],
        "limits": {"max_tool_calls": 3},
    }))
    .await;
    // echo, the refused fetch, one add: the ceiling of 3; the next add is refused.
    assert_eq!(done["value"], json!(["denied", 1]), "{done:#}");
}

/// Issue 37, hole 3: a suspended run's state is bounded in bytes: one too big fails as
/// `tool_call_limit` (and is not kept), and the store's total is bounded (429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_runs_are_bounded_in_bytes() {
    let s = serve(
        "[policy]\nallow = [\"echo\", \"add\"]\napprove = [\"add\"]\n\
         [suspended]\nmax_run_bytes = 200000\nmax_total_bytes = 500000\n",
        None,
    )
    .await;
    let code = |kib: usize| {
        format!(
            "for _ in range(3):\n    await echo(text='x' * {kib} * 1024)\nreturn await add(a=1, b=2)"
        )
    };
    // 3 calls of 100 KiB, each kept with its argument and its result: over 200,000 bytes.
    let (status, r) = s.post("/v1/runs", json!({"code": code(100)})).await;
    assert_eq!(status, StatusCode::OK, "{r:#}");
    assert_eq!(r["status"], "failed", "{r:#}");
    assert_eq!(r["error"]["kind"], "tool_call_limit", "{r:#}");
    assert!(r["run_id"].is_null(), "{r:#}");
    // 3 of 20 KiB (about 120,000 bytes) are kept; the store holds four such, not five.
    for n in 0..4 {
        let (status, r) = s.post("/v1/runs", json!({"code": code(20)})).await;
        assert_eq!(
            (status, &r["status"]),
            (StatusCode::OK, &json!("suspended")),
            "{n}: {r:#}"
        );
    }
    let (status, r) = s.post("/v1/runs", json!({"code": code(20)})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{r:#}");
    assert_eq!(kind(&r), "busy");
}

/// A reqwest client; the process's TLS provider installed first (the workspace's reqwest has
/// `rustls-no-provider`, see `pycage_tools::net::install_crypto_provider`).
fn client() -> reqwest::Client {
    pycage_tools::net::install_crypto_provider();
    reqwest::Client::new()
}

//! `pycage serve` as a process: it says where it listens, serves runs, refuses to listen
//! beyond loopback without a token, and on SIGTERM drains: the run in flight finishes with
//! its result, and the process exits 0. Unix only: the drain is driven by SIGTERM.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The bearer token the tests' servers are started with; [`client`] sends it.
const TOKEN: &str = "serve-cli-test-token";

/// Kills the server when the test ends, however it ends (and then removes its token file).
struct Server(
    Child,
    #[expect(
        dead_code,
        reason = "held, not read: the token file lives as long as the server"
    )]
    Option<tempfile::TempDir>,
);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `pycage serve` on a free loopback port; the child and its base URL.
fn start(args: &[&str]) -> (Server, String) {
    start_command(Command::new(env!("CARGO_BIN_EXE_pycage")), args)
}

/// As [`start`], with `command` (the pycage executable, its environment set) to start from.
/// The server needs [`TOKEN`].
fn start_command(mut command: Command, args: &[&str]) -> (Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("pycage serve said where it listens")
            .unwrap();
        if let Some(rest) = line.strip_prefix("pycage: serving the HTTP API at ") {
            break rest.trim_end_matches("/v1/").to_owned();
        }
    };
    // Keep reading stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Server(child, Some(dir)), base)
}

/// Sends the server SIGTERM.
fn terminate(server: &Server) {
    let pid = server.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
}

/// Waits (off the runtime's threads) for the server to exit.
async fn exit_status(mut server: Server) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || server.0.wait())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pycage_serve_runs_code_and_drains_on_sigterm() {
    let (server, base) = start(&["--allow", "add"]);
    let client = client();
    let r = post_run(&base, json!({"code": "return await add(a=2, b=3)"})).await;
    assert_eq!(r["value"], json!({"sum": 5}), "{r:#}");

    // A run that takes a while, then SIGTERM while it runs.
    let slow = tokio::spawn({
        let client = client.clone();
        let url = format!("{base}/v1/runs");
        async move {
            client
                .post(url)
                .json(&json!({
                    "code": "import time\nt = time.monotonic()\n\
                             while time.monotonic() - t < 2: pass\nreturn 'finished'",
                }))
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    terminate(&server);
    let r: Value = slow.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(
        r["value"],
        json!("finished"),
        "the run in flight finishes: {r:#}"
    );
    let status = exit_status(server).await;
    assert_eq!(
        status.code(),
        Some(0),
        "pycage serve exits 0 after draining"
    );
}

/// `pycage serve --listen ADDR` without a token: it must exit 2 at once; its stderr.
fn refused_without_a_token(addr: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["serve", "--listen", addr])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn pycage_serve_will_not_listen_beyond_loopback_without_a_token() {
    let stderr = refused_without_a_token("0.0.0.0:0");
    assert!(stderr.contains("token_file"), "{stderr}");
}

/// Issue 37, hole 1: on loopback too, no token and no opt-out is no server, and the message
/// says how to make a token.
#[test]
fn pycage_serve_on_loopback_without_a_token_refuses_to_start_and_says_how_to_set_one() {
    let stderr = refused_without_a_token("127.0.0.1:0");
    for said in [
        "even on loopback",
        "--token-file token",
        "/dev/urandom",
        "--insecure-no-auth",
    ] {
        assert!(stderr.contains(said), "{said:?} not in {stderr}");
    }
    assert!(!stderr.contains("serving the HTTP API"), "{stderr}");
}

/// Issue 37, hole 1, end to end: the server a web page would reach by DNS rebinding (a
/// foreign `Host`) or by a cross-site request (a foreign `Origin`) answers 403 and runs
/// nothing, on a run, a session and a health route alike; the same requests from a loopback
/// page, with the token, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pycage_serve_turns_away_a_foreign_host_or_origin() {
    let (_server, base) = start(&[]);
    let port = base.rsplit(':').next().unwrap().to_owned();
    let client = client();
    let foreign_host = format!("attacker.example:{port}");
    let foreign_origin = format!("http://attacker.example:{port}");
    for (host, origin) in [
        (foreign_host.as_str(), None),
        (foreign_host.as_str(), Some(foreign_origin.as_str())),
        ("localhost", Some(foreign_origin.as_str())),
    ] {
        for (method, path) in [
            (reqwest::Method::POST, "/v1/runs"),
            (reqwest::Method::POST, "/v1/sessions"),
            (reqwest::Method::GET, "/healthz"),
        ] {
            let mut request = client
                .request(method.clone(), format!("{base}{path}"))
                .header(reqwest::header::HOST, host);
            if let Some(origin) = origin {
                request = request.header(reqwest::header::ORIGIN, origin);
            }
            if path == "/v1/runs" {
                request = request.json(&json!({"code": "return 1"}));
            }
            let r = request.send().await.unwrap();
            assert_eq!(
                r.status(),
                403,
                "{method} {path} Host {host} Origin {origin:?}"
            );
            let body: Value = r.json().await.unwrap();
            let kind = body["error"]["kind"].as_str().unwrap();
            assert!(kind.starts_with("forbidden_"), "{body}");
        }
    }
    let metrics = text_of(client.get(format!("{base}/metrics"))).await;
    assert!(
        !metrics.contains("pycage_runs_total{"),
        "a refused request ran: {metrics}"
    );
    assert!(metrics.contains("pycage_sessions_live 0"), "{metrics}");
    // A page on this machine, with the token, is served.
    let r = client
        .post(format!("{base}/v1/runs"))
        .header(reqwest::header::ORIGIN, "http://localhost:3000")
        .json(&json!({"code": "return 1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["value"], json!(1), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_makes_the_servers_runs_deterministic_and_needs_the_wasm_backend() {
    let (_server, base) = start(&["--seed", "9"]);
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let code = "import random, time\nreturn [time.time(), random.random()]";
        let r = post_run(&base, json!({ "code": code })).await;
        assert_eq!(r["ok"], json!(true), "{r:#}");
        outputs.push(r["value"].clone());
    }
    assert_eq!(outputs[0], outputs[1]);
    let clock = outputs[0][0].as_f64().unwrap();
    assert!(
        (946_684_800.0..946_771_200.0).contains(&clock),
        "{outputs:?}"
    );

    for command in ["serve", "mcp"] {
        let out = Command::new(env!("CARGO_BIN_EXE_pycage"))
            .args([command, "--deterministic", "--backend", "bubblewrap"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("needs backend = \"wasm\""),
            "{command}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_the_shutdown_grace_is_cancelled_and_the_server_exits() {
    let (server, base) = start(&["--shutdown-grace", "1s"]);
    let client = client();
    let spinning = tokio::spawn({
        let url = format!("{base}/v1/runs");
        async move {
            client
                .post(url)
                .json(&json!({"code": "while True: pass", "limits": {"wall_timeout": "60s"}}))
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    terminate(&server);
    let status = exit_status(server).await;
    assert_eq!(status.code(), Some(0));
    // The run did not get its 60 s: its connection closed when the grace ran out.
    let answer = tokio::time::timeout(Duration::from_secs(30), spinning)
        .await
        .expect("the client heard the end")
        .unwrap();
    assert!(answer.is_err(), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_no_auth_serves_beyond_loopback_without_a_token_and_says_so() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["serve", "--listen", "0.0.0.0:0", "--insecure-no-auth"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let _server = Server(child, None);
    let mut warned = false;
    let port = loop {
        let line = lines
            .next()
            .expect("pycage serve said where it listens")
            .unwrap();
        warned |= line.contains("serving without a token");
        if let Some(rest) = line.strip_prefix("pycage: serving the HTTP API at http://0.0.0.0:") {
            break rest.trim_end_matches("/v1/").to_owned();
        }
    };
    assert!(warned, "no warning about serving without a token");
    std::thread::spawn(move || for _ in lines {});
    let r = post_run(
        &format!("http://127.0.0.1:{port}"),
        json!({"code": "return 7"}),
    )
    .await;
    assert_eq!(r["value"], json!(7), "{r:#}");
}

/// `[net]` in the config: the HTTP API's runs reach the allowed host through `net.fetch`,
/// with the secret put in there, and the secret's value is in no response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_net_table_exposes_fetch_with_its_secret() {
    use axum::http::HeaderMap;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let noted = seen.clone();
    let app = axum::Router::new().route(
        "/auth",
        axum::routing::get(move |h: HeaderMap| async move {
            let auth = h
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            *noted.lock().unwrap() = auth.clone();
            format!("you sent: {auth}")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pycage.toml");
    std::fs::write(
        &config,
        format!(
            "[net]\n\
             allow = [\"127.0.0.1:{port}\"]\n\
             allow_addresses = [\"127.0.0.1/32\"]\n\
             [[net.secrets]]\n\
             name = \"TOKEN\"\n\
             env = \"PYCAGE_SERVE_TEST_TOKEN\"\n\
             hosts = [\"127.0.0.1:{port}\"]\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pycage"));
    child.env("PYCAGE_SERVE_TEST_TOKEN", "tok-c0ffee");
    let (_server, base) = start_command(child, &["--config", config.to_str().unwrap()]);
    let code = format!(
        "r = fetch_sync('http://127.0.0.1:{port}/auth', \
         headers={{'Authorization': 'Bearer PYCAGE_SECRET_TOKEN'}})\nreturn r['body']"
    );
    let text = text_of(
        client()
            .post(format!("{base}/v1/runs"))
            .json(&json!({ "code": code })),
    )
    .await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        r["value"],
        json!("you sent: Bearer PYCAGE_SECRET_TOKEN"),
        "{r}"
    );
    assert_eq!(*seen.lock().unwrap(), "Bearer tok-c0ffee");
    assert!(!text.contains("tok-c0ffee"), "{text}");

    // A run narrows the allowlist: to nothing here, so the same request is refused; a host
    // the config does not allow cannot be added.
    let r = post_run(&base, json!({ "code": code, "net_allow": [] })).await;
    assert_eq!(r["error"]["kind"], json!("guest_exception"), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not on the network allowlist"),
        "{r}"
    );
    let r = post_run(&base, json!({ "code": code, "net_allow": ["example.com"] })).await;
    assert_eq!(r["error"]["kind"], json!("invalid_input"), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`example.com` is not one of the allowed hosts"),
        "{r}"
    );
}

/// The text of the response to `request`.
async fn text_of(request: reqwest::RequestBuilder) -> String {
    request.send().await.unwrap().text().await.unwrap()
}

/// `body` posted to `{base}/v1/runs`; the response's JSON.
async fn post_run(base: &str, body: Value) -> Value {
    client()
        .post(format!("{base}/v1/runs"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A reqwest client that sends [`TOKEN`]; the process's TLS provider installed first (the
/// workspace's reqwest has `rustls-no-provider`, see
/// `pycage_tools::net::install_crypto_provider`).
fn client() -> reqwest::Client {
    pycage_tools::net::install_crypto_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {TOKEN}");
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&bearer).unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

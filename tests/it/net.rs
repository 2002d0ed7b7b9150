//! `net.fetch` from the CLI, against a loopback server of the test's own that counts the
//! connections it accepts: allowed requests go, refused ones never connect, and a secret's
//! value reaches the server only, never the code, its output or the logs.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use tokio::net::{TcpListener, TcpStream};

use crate::os_support;

/// A listener that counts the connections it accepts.
struct Counting {
    inner: TcpListener,
    accepted: Arc<AtomicUsize>,
}

impl axum::serve::Listener for Counting {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Ok(pair) = self.inner.accept().await {
                self.accepted.fetch_add(1, Ordering::SeqCst);
                return pair;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

struct Server {
    port: u16,
    accepted: Arc<AtomicUsize>,
    /// The last `Authorization` header the server saw.
    seen: Arc<std::sync::Mutex<String>>,
}

async fn server() -> Server {
    server_on("127.0.0.1".parse().unwrap()).await
}

async fn server_on(ip: std::net::IpAddr) -> Server {
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let noted = seen.clone();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/auth",
            get(move |h: HeaderMap| {
                let noted = noted.clone();
                async move {
                    let auth = h
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    *noted.lock().unwrap() = auth.clone();
                    format!("you sent: {auth}")
                }
            }),
        );
    let inner = TcpListener::bind((ip, 0)).await.unwrap();
    let port = inner.local_addr().unwrap().port();
    let listener = Counting {
        inner,
        accepted: accepted.clone(),
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server {
        port,
        accepted,
        seen,
    }
}

fn pycage(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pycage"));
    cmd.args(args).env("PYCAGE_LOG", "pycage::audit=info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `pycage run -c code` with `--net-allow allow` and loopback let through, off the runtime's
/// threads (the test's server runs on them).
async fn run_allowing_loopback(allow: String, code: String) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        pycage(
            &[
                "run",
                "--net-allow",
                &allow,
                "--net-allow-address",
                "127.0.0.1/32",
                "-c",
                &code,
            ],
            &[],
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_reaches_an_allowed_host_and_nothing_else() {
    let s = server().await;
    let allow = format!("127.0.0.1:{}", s.port);
    let code = format!(
        "got = await fetch('http://127.0.0.1:{p}/hello')\n\
         sent = await fetch(url='http://127.0.0.1:{p}/echo', method='POST', body='ping')\n\
         again = fetch_sync('http://127.0.0.1:{p}/echo', method='POST', body='pong')\n\
         return [got['status'], got['body'], sent['body'], again['body']]",
        p = s.port
    );
    let out = run_allowing_loopback(allow, code).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"[200,"hello","ping","pong"]"#
    );
    let before = s.accepted.load(Ordering::SeqCst);
    assert!(before >= 1);

    // Another host: refused by the policy, no connection made.
    let code = format!(
        "return await fetch(url='http://localhost:{}/hello')",
        s.port
    );
    let out = tokio::task::spawn_blocking(move || {
        pycage(&["run", "--net-allow", "example.com", "-c", &code], &[])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not on the network allowlist"),
        "{stderr}"
    );
    assert_eq!(s.accepted.load(Ordering::SeqCst), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_reaches_its_host_only() {
    let s = server().await;
    let allow = format!("127.0.0.1:{}", s.port);
    let secret = format!("TOKEN=PYCAGE_TEST_TOKEN@127.0.0.1:{}", s.port);
    let code = format!(
        "r = await fetch(url='http://127.0.0.1:{p}/auth', headers={{'Authorization': 'Bearer PYCAGE_SECRET_TOKEN'}})\n\
         print(r['body'])\n\
         try:\n    await fetch(url='http://example.com/', headers={{'Authorization': 'PYCAGE_SECRET_TOKEN'}})\n\
         except ToolError as e:\n    print('refused:', e.kind, e)\n\
         return r",
        p = s.port
    );
    let out = tokio::task::spawn_blocking(move || {
        pycage(
            &[
                "run",
                "--json",
                "--net-allow",
                &allow,
                "--net-allow",
                "example.com",
                "--net-allow-address",
                "127.0.0.1/32",
                "--secret",
                &secret,
                "-c",
                &code,
            ],
            &[("PYCAGE_TEST_TOKEN", "tok-9f8e7d")],
        )
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(*s.seen.lock().unwrap(), "Bearer tok-9f8e7d");
    assert!(
        stdout.contains("you sent: Bearer PYCAGE_SECRET_TOKEN"),
        "{stdout}"
    );
    assert!(
        stdout.contains("refused: denied secret TOKEN may not be sent to example.com:80"),
        "{stdout}"
    );
    assert!(
        stderr.contains("network request"),
        "the audit log: {stderr}"
    );
    for text in [&stdout, &stderr] {
        assert!(!text.contains("tok-9f8e7d"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn urllib_goes_through_fetch_unchanged() {
    let s = server().await;
    let allow = format!("127.0.0.1:{}", s.port);
    let code = format!(
        "import urllib.request, urllib.error\n\
         with urllib.request.urlopen('http://127.0.0.1:{p}/hello') as r:\n    got = [r.status, r.read().decode()]\n\
         sent = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{p}/echo', data=b'ping')).read().decode()\n\
         try:\n    urllib.request.urlopen('http://127.0.0.1:{p}/missing')\n\
         except urllib.error.HTTPError as e:\n    missing = e.code\n\
         try:\n    urllib.request.urlopen('https://example.com/')\n\
         except urllib.error.URLError as e:\n    refused = str(e.reason)\n\
         return [got, sent, missing, refused]",
        p = s.port
    );
    let out = run_allowing_loopback(allow, code).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"[[200,"hello"],"ping",404,"example.com:443 is not on the network allowlist"]"#
    );
}

/// Code that opens a TCP connection itself, no tool involved.
fn connect_code(ip: std::net::IpAddr, port: u16) -> String {
    format!(
        "import socket\n\
         socket.create_connection(('{ip}', {port}), timeout=5).close()\n\
         return 'connected'"
    )
}

/// `--allow-network` off: the OS backend's guest reaches nothing, not even a server on an
/// address it could route to; on: the server sees the guest's connection.
async fn allow_network_on(backend: &'static str, ip: std::net::IpAddr) {
    if os_support::subject(backend).is_none() {
        return;
    }
    let s = server_on(ip).await;
    let code = connect_code(ip, s.port);
    let off = {
        let code = code.clone();
        tokio::task::spawn_blocking(move || {
            pycage(&["run", "--backend", backend, "-c", &code], &[])
        })
        .await
        .unwrap()
    };
    let stderr = String::from_utf8_lossy(&off.stderr);
    assert_eq!(off.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("OSError") || stderr.contains("Error"),
        "{stderr}"
    );
    assert_eq!(s.accepted.load(Ordering::SeqCst), 0, "{stderr}");

    let on = tokio::task::spawn_blocking(move || {
        pycage(
            &["run", "--backend", backend, "--allow-network", "-c", &code],
            &[],
        )
    })
    .await
    .unwrap();
    assert!(on.status.success(), "{on:?}");
    assert_eq!(String::from_utf8_lossy(&on.stdout).trim(), r#""connected""#);
    assert_eq!(s.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_network_gives_a_bubblewrap_guest_the_hosts_network() {
    allow_network_on("bubblewrap", "127.0.0.1".parse().unwrap()).await;
}

/// A container on the bridge reaches the host at the bridge's gateway address (the host's
/// loopback is the container's own), so the server listens there.
#[tokio::test(flavor = "multi_thread")]
async fn allow_network_puts_a_docker_guest_on_the_bridge() {
    let out = Command::new(pycage::os::docker::DOCKER)
        .args([
            "network",
            "inspect",
            "bridge",
            "--format",
            "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
        ])
        .output();
    let gateway = match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        other => {
            os_support::skip(&format!("no docker bridge here: {other:?}"));
            return;
        }
    };
    allow_network_on("docker", gateway.parse().unwrap()).await;
}

#[test]
fn allow_network_is_refused_where_there_is_no_network_to_give() {
    for backend in ["wasm", "wasm+bubblewrap"] {
        let out = pycage(
            &["run", "--backend", backend, "--allow-network", "-c", "1"],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("cannot give its sandbox the network")
                && stderr.contains("--net-allow"),
            "{stderr}"
        );
    }
}

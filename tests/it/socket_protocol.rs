//! The OS backends' socket transport, against the real server: tokens, frame caps,
//! malformed and hostile peers, the end of a run, concurrency. The transport is Unix-only.
#![cfg(unix)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use common::Spy;
use pycage::os::protocol::{self, Response, WireErrorKind};
use pycage::os::{RunDir, SocketServer};
use pycage::{Broker, Limits, ToolPolicy};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

struct Fixture {
    spy: Spy,
    broker: Arc<Broker>,
    server: SocketServer,
}

impl Fixture {
    fn new(limits: Limits) -> Fixture {
        let spy = Spy::new();
        let exposed = ToolPolicy::new()
            .namespace("spy")
            .resolve(&spy.registry)
            .unwrap();
        let broker = Arc::new(Broker::new("socket-test", exposed, &limits));
        let dir = RunDir::create().unwrap();
        let server = SocketServer::start(dir, broker.clone(), &limits).unwrap();
        Fixture {
            spy,
            broker,
            server,
        }
    }

    fn token(&self) -> &str {
        self.server.token().as_str()
    }

    async fn connect(&self) -> UnixStream {
        UnixStream::connect(self.server.dir().socket_path())
            .await
            .expect("the server accepts")
    }

    /// A valid call of `spy.add`.
    fn call(&self, id: u64) -> Vec<u8> {
        self.frame(json!({"id": id, "method": "call", "name": "add", "namespace": "spy", "arguments": {"a": 1}}))
    }

    /// `fields` with the right token, as a frame.
    fn frame(&self, mut fields: Value) -> Vec<u8> {
        fields["token"] = self.token().into();
        protocol::frame(fields.to_string().as_bytes())
    }

    /// A working call on a fresh connection: the server is alive.
    async fn assert_alive(&self) {
        let mut s = self.connect().await;
        s.write_all(&self.call(999)).await.unwrap();
        match read_response(&mut s).await {
            Some(Response::Ok { id: 999, .. }) => {}
            other => panic!("the server should still answer: {other:?}"),
        }
    }
}

/// Reads one response; `None` when the server closed the connection.
async fn read_response(s: &mut UnixStream) -> Option<Response> {
    let mut header = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut header))
        .await
        .expect("the server answers in time")
        .ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(protocol::decode_response(&body).expect("the server sends valid responses"))
}

#[track_caller]
fn assert_error(r: Option<Response>, kind: WireErrorKind, needle: &str) -> Option<u64> {
    match r {
        Some(Response::Err {
            id,
            kind: k,
            message,
        }) => {
            assert_eq!(k, kind, "{message}");
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
            id
        }
        other => panic!("expected {kind}, got {other:?}"),
    }
}

async fn assert_closed(s: &mut UnixStream) {
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
        .await
        .expect("the server closes in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection should be closed");
}

#[tokio::test]
async fn the_directory_and_socket_are_private_and_removed_after_the_run() {
    let f = Fixture::new(Limits::default());
    let dir = f.server.dir().path().to_owned();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&f.server.dir().socket_path()), 0o600);
    assert_eq!(f.token().len(), 64);
    drop(f);
    assert!(!dir.exists(), "the run directory is removed");
}

#[tokio::test]
async fn a_valid_call_reaches_the_broker() {
    let f = Fixture::new(Limits::default());
    let mut s = f.connect().await;
    s.write_all(&f.call(1)).await.unwrap();
    match read_response(&mut s).await {
        Some(Response::Ok { id: 1, result_json }) => {
            assert!(result_json.contains("CANARY-SPY-RESULT"))
        }
        other => panic!("{other:?}"),
    }
    // The qualified name without a namespace field works too.
    s.write_all(&f.frame(json!({"id": 2, "method": "call", "name": "spy.add", "arguments": {}})))
        .await
        .unwrap();
    assert!(matches!(
        read_response(&mut s).await,
        Some(Response::Ok { id: 2, .. })
    ));
    // Refusals carry the broker's kinds.
    s.write_all(&f.frame(json!({"id": 3, "method": "call", "name": "nope", "arguments": {}})))
        .await
        .unwrap();
    assert_eq!(
        assert_error(
            read_response(&mut s).await,
            WireErrorKind::NotFound,
            "not available"
        ),
        Some(3)
    );
    assert_eq!(f.spy.calls(), 2);
    assert_eq!(f.broker.executed(), 2);
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_nothing_runs() {
    let f = Fixture::new(Limits::default());
    let mut s = f.connect().await;
    let mut wrong = f.token().to_owned();
    wrong.replace_range(..1, if wrong.starts_with('a') { "b" } else { "a" });
    for token in [Value::from(wrong), Value::from(""), Value::Null, json!(1)] {
        let mut s = f.connect().await;
        let body = json!({"token": token, "id": 1, "method": "call", "name": "add", "namespace": "spy", "arguments": {}});
        s.write_all(&protocol::frame(body.to_string().as_bytes()))
            .await
            .unwrap();
        let id = assert_error(
            read_response(&mut s).await,
            WireErrorKind::Unauthorized,
            "token",
        );
        assert_eq!(id, None, "nothing of the frame is read before the token");
        assert_closed(&mut s).await;
    }
    // No token at all, with an otherwise perfect call.
    let body =
        json!({"id": 1, "method": "call", "name": "add", "namespace": "spy", "arguments": {}});
    s.write_all(&protocol::frame(body.to_string().as_bytes()))
        .await
        .unwrap();
    assert_error(
        read_response(&mut s).await,
        WireErrorKind::Unauthorized,
        "token",
    );
    assert_eq!(f.spy.calls(), 0, "an unauthorized call executed");
    assert_eq!(f.broker.executed(), 0);
    f.assert_alive().await;
}

#[tokio::test]
async fn an_oversized_frame_is_refused_before_its_body_is_read() {
    let f = Fixture::new(Limits::default());
    let cap = f.server.max_frame_bytes();
    let mut s = f.connect().await;
    // Claim 1 GiB and send nothing more: the answer comes without the body.
    s.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
    let id = assert_error(
        read_response(&mut s).await,
        WireErrorKind::LimitExceeded,
        &format!("1073741824 bytes; the limit is {cap}"),
    );
    assert_eq!(id, None);
    assert_closed(&mut s).await;
    // Just over the cap is refused as well; the cap itself is not a magic number.
    let mut s = f.connect().await;
    s.write_all(&u32::try_from(cap + 1).unwrap().to_be_bytes())
        .await
        .unwrap();
    assert_error(
        read_response(&mut s).await,
        WireErrorKind::LimitExceeded,
        "the limit is",
    );
    f.assert_alive().await;
    assert_eq!(f.spy.calls(), 1, "only the liveness call ran");
}

#[tokio::test]
async fn malformed_frames_get_clean_errors_and_the_connection_goes_on() {
    let f = Fixture::new(Limits::default());
    let mut s = f.connect().await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            f.frame(json!({"id": 1, "method": "frobnicate"})),
            "unknown method `frobnicate`",
        ),
        (
            f.frame(json!({"id": 2, "method": "call", "name": 42, "arguments": {}})),
            "`name` must be a string",
        ),
        (
            f.frame(json!({"id": 3, "method": "call", "name": "add", "arguments": [1, 2]})),
            "`arguments` must be an object",
        ),
        (
            f.frame(json!({"id": 4, "method": "call", "name": "add", "arguments": "{}"})),
            "`arguments` must be an object",
        ),
        (
            f.frame(
                json!({"id": 5, "method": "call", "name": "add", "namespace": 7, "arguments": {}}),
            ),
            "`namespace` must be a string",
        ),
        (
            f.frame(json!({"id": 6, "method": "call", "name": "add"})),
            "`arguments` is missing",
        ),
        (f.frame(json!({"id": 7})), "`method` is missing"),
        (f.frame(json!({"method": "call"})), "`id` is missing"),
        (protocol::frame(b"{this is not json"), "not valid JSON"),
        (protocol::frame(b"[\"an\", \"array\"]"), "not a JSON object"),
        (protocol::frame(&[0xff, 0xfe, 0x00]), "not valid JSON"),
        (protocol::frame(b""), "not valid JSON"),
    ];
    for (frame, needle) in cases {
        s.write_all(&frame).await.unwrap();
        assert_error(
            read_response(&mut s).await,
            WireErrorKind::BadRequest,
            needle,
        );
    }
    // The same connection still works.
    s.write_all(&f.call(100)).await.unwrap();
    assert!(matches!(
        read_response(&mut s).await,
        Some(Response::Ok { id: 100, .. })
    ));
    assert_eq!(f.spy.calls(), 1, "no malformed frame executed anything");
}

#[tokio::test]
async fn a_truncated_frame_drops_only_that_connection() {
    let f = Fixture::new(Limits::default());
    let mut s = f.connect().await;
    let call = f.call(1);
    s.write_all(&call[..call.len() / 2]).await.unwrap();
    s.shutdown().await.unwrap();
    assert_closed(&mut s).await;
    f.assert_alive().await;
    assert_eq!(f.spy.calls(), 1);
}

#[tokio::test]
async fn a_call_after_the_result_is_refused() {
    let f = Fixture::new(Limits::default());
    let mut s = f.connect().await;
    s.write_all(
        &f.frame(json!({"id": 1, "method": "result", "outcome": {"ok": true, "value_json": "15"}})),
    )
    .await
    .unwrap();
    assert!(matches!(
        read_response(&mut s).await,
        Some(Response::Ok { id: 1, .. })
    ));
    assert!(f.server.finished());
    s.write_all(&f.call(2)).await.unwrap();
    assert_eq!(
        assert_error(
            read_response(&mut s).await,
            WireErrorKind::Denied,
            "the run has finished"
        ),
        Some(2)
    );
    // On another connection too, and a second result is refused.
    let mut t = f.connect().await;
    t.write_all(&f.call(3)).await.unwrap();
    assert_error(
        read_response(&mut t).await,
        WireErrorKind::Denied,
        "finished",
    );
    t.write_all(
        &f.frame(json!({"id": 4, "method": "result", "outcome": {"ok": true, "value_json": "16"}})),
    )
    .await
    .unwrap();
    assert_error(
        read_response(&mut t).await,
        WireErrorKind::Denied,
        "already sent",
    );
    assert_eq!(f.spy.calls(), 0);
    let outcome = f.server.take_outcome().expect("the first result is kept");
    assert_eq!(outcome.value, Ok("15".to_owned()));
}

#[tokio::test]
async fn concurrent_calls_are_counted_exactly() {
    let limits = Limits::builder().max_tool_calls(100).build().unwrap();
    let f = Arc::new(Fixture::new(limits));
    // 150 calls: 10 connections pipelining 10 each, and 50 connections with one each.
    let mut tasks = Vec::new();
    for c in 0..60u64 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let per = if c < 10 { 10 } else { 1 };
            let mut s = f.connect().await;
            let mut frames = Vec::new();
            for i in 0..per {
                frames.extend(f.call(c * 100 + i));
            }
            s.write_all(&frames).await.unwrap();
            let mut ok = 0u32;
            let mut limited = 0u32;
            for _ in 0..per {
                match read_response(&mut s).await {
                    Some(Response::Ok { .. }) => ok += 1,
                    Some(Response::Err {
                        kind: WireErrorKind::LimitExceeded,
                        ..
                    }) => limited += 1,
                    other => panic!("{other:?}"),
                }
            }
            (ok, limited)
        }));
    }
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let (o, l) = t.await.unwrap();
        ok += o;
        limited += l;
    }
    assert_eq!(ok + limited, 150);
    assert_eq!(ok, 100, "exactly the ceiling executed");
    assert_eq!(f.spy.calls(), 100);
    assert_eq!(f.broker.executed(), 100);
    assert!(f.broker.ceiling_hit());
}

#[tokio::test]
async fn hostile_peers_do_not_crash_the_host() {
    let f = Fixture::new(Limits::default());
    // Garbage, cut headers, cut bodies, length prefixes of nonsense, abrupt closes.
    let garbage: Vec<Vec<u8>> = vec![
        vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3],
        vec![0, 0],
        vec![0, 0, 0, 50, b'{'],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        [&u32::MAX.to_be_bytes()[..], &[0u8; 64][..]].concat(),
        (0..=255u8).cycle().take(100_000).collect(),
    ];
    for bytes in garbage {
        let mut s = f.connect().await;
        let _ = s.write_all(&bytes).await;
        drop(s);
    }
    // Many connections opened and dropped at once (more than the server's slots).
    let mut held = Vec::new();
    for _ in 0..100 {
        if let Ok(s) = UnixStream::connect(f.server.dir().socket_path()).await {
            held.push(s);
        }
    }
    drop(held);
    // Deeply nested JSON in a frame: the frame decodes without recursing, and the broker
    // refuses the arguments by its depth bound.
    let mut s = f.connect().await;
    let nested = format!(
        "{{\"token\":\"{}\",\"id\":1,\"method\":\"call\",\"name\":\"add\",\"arguments\":{{\"x\":{}1{}}}}}",
        f.token(),
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    s.write_all(&protocol::frame(nested.as_bytes()))
        .await
        .unwrap();
    assert_error(
        read_response(&mut s).await,
        WireErrorKind::InvalidArguments,
        "nest deeper than 200 levels",
    );
    f.assert_alive().await;
    assert_eq!(f.spy.calls(), 1);
}

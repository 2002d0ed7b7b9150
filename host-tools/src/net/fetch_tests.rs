use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap as Headers, StatusCode as Status, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};

use super::*;
use crate::net::{HostPattern, Secret};

/// A server of the test's own on loopback, counting the requests it sees.
struct Server {
    port: u16,
    requests: Arc<AtomicUsize>,
}

async fn server() -> Server {
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/auth",
            get(|h: Headers| async move {
                h.get(header::AUTHORIZATION)
                    .map(|v| v.to_str().unwrap_or("").to_owned())
                    .unwrap_or_default()
            }),
        )
        .route(
            "/to-hello",
            get(|| async { (Status::FOUND, [(header::LOCATION, "/hello")]) }),
        )
        .route(
            "/to-outside",
            get(|| async { (Status::FOUND, [(header::LOCATION, "http://outside.test/x")]) }),
        )
        .route(
            "/to-localhost",
            get(|| async { (Status::FOUND, [(header::LOCATION, "/auth")]) }),
        )
        .route(
            "/to-port",
            get(
                |axum::extract::Query(q): axum::extract::Query<
                    std::collections::HashMap<String, String>,
                >| async move {
                    let to = format!(
                        "http://127.0.0.1:{}/auth",
                        q.get("port").cloned().unwrap_or_default()
                    );
                    (Status::FOUND, [(header::LOCATION, to)])
                },
            ),
        )
        .route("/big", get(|| async { vec![b'x'; 3 << 20] }))
        .route(
            "/binary",
            get(|| async { vec![0xffu8, 0x00, 0xfe].into_response() }),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server { port, requests }
}

fn loopback_policy() -> NetPolicy {
    NetPolicy::new()
        .allow("127.0.0.1".parse().unwrap())
        .allow_address("127.0.0.1/32".parse().unwrap())
}

fn tool(policy: NetPolicy, secrets: Secrets) -> FetchTool {
    FetchTool::new(policy, secrets, FetchLimits::default()).unwrap()
}

fn args(value: Value) -> Args {
    match value {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

async fn call(tool: &FetchTool, value: Value) -> Result<Value, ToolError> {
    tool.call(args(value)).await
}

#[tokio::test]
async fn a_get_and_a_post_to_an_allowed_host() {
    let s = server().await;
    let t = tool(loopback_policy(), Secrets::new());
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/hello", s.port)}),
    )
    .await
    .unwrap();
    assert_eq!(r["status"], 200);
    assert_eq!(r["body"], "hello");
    assert_eq!(r["headers"]["content-type"], "text/plain; charset=utf-8");
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/echo", s.port), "method": "post", "body": "ping"}),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "ping");
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/binary", s.port)}),
    )
    .await
    .unwrap();
    assert_eq!(r["body_base64"], "/wD+");
}

#[tokio::test]
async fn a_host_not_allowed_is_refused_before_any_connection() {
    let s = server().await;
    let t = tool(
        NetPolicy::new().allow("example.com".parse().unwrap()),
        Secrets::new(),
    );
    for url in [
        format!("http://127.0.0.1:{}/hello", s.port),
        format!("http://2130706433:{}/hello", s.port),
        format!("http://[::ffff:127.0.0.1]:{}/hello", s.port),
        format!("http://example.com@127.0.0.1:{}/hello", s.port),
    ] {
        let e = call(&t, json!({"url": url})).await.unwrap_err();
        assert!(matches!(e, ToolError::Denied(_)), "{url}: {e}");
    }
    assert_eq!(s.requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_unless_its_range_is_allowed() {
    let s = server().await;
    let by_name = NetPolicy::new().allow("localhost".parse().unwrap());
    let t = tool(by_name.clone(), Secrets::new());
    let e = call(
        &t,
        json!({"url": format!("http://localhost:{}/hello", s.port)}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, ToolError::Denied(m) if m.contains("not reachable from the sandbox")),
        "{e}"
    );
    assert_eq!(s.requests.load(Ordering::SeqCst), 0);
    let t = tool(
        by_name
            .allow_address("127.0.0.0/8".parse().unwrap())
            .allow_address("::1/128".parse().unwrap()),
        Secrets::new(),
    );
    let r = call(
        &t,
        json!({"url": format!("http://localhost:{}/hello", s.port)}),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "hello");
}

#[tokio::test]
async fn redirects_are_followed_and_each_is_checked() {
    let s = server().await;
    let t = tool(loopback_policy(), Secrets::new());
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/to-hello", s.port)}),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "hello");
    assert_eq!(r["url"], format!("http://127.0.0.1:{}/hello", s.port));
    let e = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/to-outside", s.port)}),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("outside.test:80 is not on the network allowlist"),
        "{e}"
    );
}

#[tokio::test]
async fn an_oversized_response_is_cut_with_a_clear_error() {
    let s = server().await;
    let limits = FetchLimits {
        max_response_bytes: 1 << 20,
        ..FetchLimits::default()
    };
    let t = FetchTool::new(loopback_policy(), Secrets::new(), limits).unwrap();
    let e = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/big", s.port)}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.to_string(), "the response body is over 1048576 bytes");
}

#[tokio::test]
async fn a_secret_goes_only_to_its_host_and_never_comes_back() {
    let s = server().await;
    let secret = Secret::new(
        "TOKEN",
        "s3cr3t-value",
        vec!["127.0.0.1".parse::<HostPattern>().unwrap()],
    )
    .unwrap();
    let policy = loopback_policy().allow("example.com".parse().unwrap());
    let t = tool(policy, Secrets::new().with(secret));
    // The server sees the value, the guest sees the placeholder again.
    let r = call(
        &t,
        json!({
            "url": format!("http://127.0.0.1:{}/auth", s.port),
            "headers": {"Authorization": "Bearer PYCAGE_SECRET_TOKEN"},
        }),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "Bearer PYCAGE_SECRET_TOKEN");
    assert!(!r.to_string().contains("s3cr3t"));
    // To a host it is not bound to: refused, without the value in the error.
    let e = call(
        &t,
        json!({
            "url": "http://example.com/",
            "headers": {"Authorization": "Bearer PYCAGE_SECRET_TOKEN"},
        }),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("secret TOKEN may not be sent to example.com:80"),
        "{e}"
    );
    assert!(!e.to_string().contains("s3cr3t"));
}

#[tokio::test]
async fn bad_arguments_are_refused_by_name() {
    let t = tool(loopback_policy(), Secrets::new());
    for (value, says) in [
        (json!({}), "`url` must be a string"),
        (
            json!({"url": "http://127.0.0.1/", "method": "TRACE"}),
            "`method` must be one of",
        ),
        (
            json!({"url": "http://127.0.0.1/", "headers": {"X-A": "a\r\nX-Injected: 1"}}),
            "holds characters a header cannot",
        ),
        (
            json!({"url": "http://127.0.0.1/", "headers": {"Host": "example.com"}}),
            "header `host` is set from the request itself",
        ),
        (
            json!({"url": "http://127.0.0.1/", "extra": 1}),
            "unknown argument `extra`",
        ),
        (
            // Past ~24,000 entries the `http` crate's header map panics: refused well before.
            json!({"url": "http://127.0.0.1/", "headers": (0..30_000)
                .map(|i| (format!("x{i}"), json!("")))
                .collect::<serde_json::Map<_, _>>()}),
            "a request may carry at most 100",
        ),
        (
            json!({"url": "http://127.0.0.1/", "headers": {"X-Big": "a".repeat(70_000)}}),
            "the limit is 65536",
        ),
        (
            json!({"url": "http://127.0.0.1/", "body": "a", "body_base64": "YQ=="}),
            "not both",
        ),
    ] {
        let e = call(&t, value.clone()).await.unwrap_err();
        assert!(
            matches!(&e, ToolError::InvalidArguments(m) if m.contains(says)),
            "{value}: {e}"
        );
    }
}

#[tokio::test]
async fn credentials_are_dropped_on_a_redirect_to_another_origin() {
    let (a, b) = (server().await, server().await);
    let t = tool(loopback_policy(), Secrets::new());
    let auth = json!({"Authorization": "Bearer abc"});
    // The same origin keeps them; another port is another origin.
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/to-port?port={}", a.port, a.port), "headers": auth}),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "Bearer abc");
    let r = call(
        &t,
        json!({"url": format!("http://127.0.0.1:{}/to-port?port={}", a.port, b.port), "headers": auth}),
    )
    .await
    .unwrap();
    assert_eq!(r["body"], "");
    assert_eq!(b.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_run_narrows_the_allowlist_and_cannot_widen_it() {
    let s = server().await;
    let local: HostPattern = format!("127.0.0.1:{}", s.port).parse().unwrap();
    let other: HostPattern = "example.com".parse().unwrap();
    let t = tool(
        NetPolicy::new()
            .allow(local.clone())
            .allow(other.clone())
            .allow_address("127.0.0.1/32".parse().unwrap()),
        Secrets::new(),
    );
    let hello = json!({"url": format!("http://127.0.0.1:{}/hello", s.port)});
    let kept = t.narrowed(std::slice::from_ref(&local)).unwrap();
    assert_eq!(call(&kept, hello.clone()).await.unwrap()["body"], "hello");
    assert!(kept.description().contains(&local.to_string()));
    assert!(!kept.description().contains("example.com"));

    let dropped = t.narrowed(&[other]).unwrap();
    let e = call(&dropped, hello).await.unwrap_err();
    assert!(
        matches!(&e, ToolError::Denied(m) if m.contains("is not on the network allowlist")),
        "{e}"
    );
    assert_eq!(s.requests.load(Ordering::SeqCst), 1);

    let wider = t.narrowed(&["evil.example".parse().unwrap()]).unwrap_err();
    assert!(
        wider.contains("`evil.example` is not one of the allowed hosts"),
        "{wider}"
    );
}

/// A loopback server that reflects what a request carried, for the redaction tests: `/reflect`
/// answers the `Authorization` header it got, gzip-labelled when asked for gzip and partial
/// when asked for a range; `/encoded` and `/partial` answer so whatever was asked;
/// `/leak?port=P` redirects to port P with the `Authorization` value in the URL. Each request's
/// `Accept-Encoding` and `Range` are noted in `seen`.
async fn reflecting_server(seen: Arc<std::sync::Mutex<Vec<String>>>) -> u16 {
    let note = move |h: &Headers| {
        let get = |n: header::HeaderName| {
            h.get(n)
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .unwrap_or_default()
        };
        seen.lock().unwrap().push(format!(
            "accept-encoding={} range={}",
            get(header::ACCEPT_ENCODING),
            get(header::RANGE)
        ));
        get(header::AUTHORIZATION)
    };
    let (n1, n2, n3, n4) = (note.clone(), note.clone(), note.clone(), note);
    let app = Router::new()
        .route(
            "/reflect",
            get(move |h: Headers| async move {
                let auth = n1(&h);
                let gzip = h
                    .get(header::ACCEPT_ENCODING)
                    .is_some_and(|v| v.to_str().unwrap_or("").contains("gzip"));
                if gzip {
                    // Stands for gzip: the value, not as it is.
                    let hidden: String = auth.chars().rev().collect();
                    return ([(header::CONTENT_ENCODING, "gzip")], hidden).into_response();
                }
                if h.contains_key(header::RANGE) {
                    return (Status::PARTIAL_CONTENT, auth[..auth.len() / 2].to_owned())
                        .into_response();
                }
                auth.into_response()
            }),
        )
        .route(
            "/encoded",
            get(move |h: Headers| async move {
                let auth: String = n2(&h).chars().rev().collect();
                ([(header::CONTENT_ENCODING, "gzip")], auth)
            }),
        )
        .route(
            "/partial",
            get(move |h: Headers| async move {
                let auth = n3(&h);
                (Status::PARTIAL_CONTENT, auth[..auth.len() / 2].to_owned())
            }),
        )
        .route(
            "/leak",
            get(
                move |h: Headers,
                      axum::extract::Query(q): axum::extract::Query<
                    std::collections::HashMap<String, String>,
                >| async move {
                    let auth = n4(&h);
                    let to = format!(
                        "http://127.0.0.1:{}/hello?k={}",
                        q.get("port").cloned().unwrap_or_default(),
                        auth.trim_start_matches("Bearer ")
                    );
                    (Status::FOUND, [(header::LOCATION, to)])
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Issue 37, hole 2: asking the bound host for gzip or a range no longer gets the secret
/// back unredacted: the request goes plain and whole, and an answer that is not fails.
#[tokio::test]
async fn a_bound_hosts_answer_must_be_plain_and_whole_for_redaction() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let port = reflecting_server(seen.clone()).await;
    let secret = Secret::new(
        "TOKEN",
        "s3cr3t-value",
        vec![format!("127.0.0.1:{port}").parse::<HostPattern>().unwrap()],
    )
    .unwrap();
    let t = tool(loopback_policy(), Secrets::new().with(secret));
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    for headers in [
        json!({"Authorization": "Bearer PYCAGE_SECRET_TOKEN", "Accept-Encoding": "gzip"}),
        json!({"Authorization": "Bearer PYCAGE_SECRET_TOKEN", "Range": "bytes=0-9", "If-Range": "x"}),
    ] {
        let r = call(&t, json!({"url": url("/reflect"), "headers": headers}))
            .await
            .unwrap();
        assert_eq!(r["status"], 200, "{r}");
        assert_eq!(r["body"], "Bearer PYCAGE_SECRET_TOKEN", "{r}");
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "accept-encoding=identity range=",
            "accept-encoding=identity range="
        ]
    );
    for path in ["/encoded", "/partial"] {
        let e = call(
            &t,
            json!({"url": url(path), "headers": {"Authorization": "Bearer PYCAGE_SECRET_TOKEN"}}),
        )
        .await
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("so the secret can be redacted"),
            "{path}: {text}"
        );
        assert!(
            !text.contains("s3cr3t") && !text.contains("eulav-t3rc3s"),
            "{text}"
        );
    }
}

/// Issue 37, hole 6: a redirect whose `Location` holds the value the bound host got does
/// not carry it to a host the secret is not bound to.
#[tokio::test]
async fn a_secret_in_a_redirects_location_does_not_follow_it_to_another_host() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let bound = reflecting_server(seen).await;
    let other = server().await;
    let secret = Secret::new(
        "TOKEN",
        "s3cr3t-value",
        vec![format!("127.0.0.1:{bound}").parse::<HostPattern>().unwrap()],
    )
    .unwrap();
    let t = tool(loopback_policy(), Secrets::new().with(secret));
    let e = call(
        &t,
        json!({
            "url": format!("http://127.0.0.1:{bound}/leak?port={}", other.port),
            "headers": {"Authorization": "Bearer PYCAGE_SECRET_TOKEN"},
        }),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("may not be sent to"), "{e}");
    assert!(!e.to_string().contains("s3cr3t"), "{e}");
    assert_eq!(
        other.requests.load(Ordering::SeqCst),
        0,
        "the other host was reached"
    );
}

//! What both servers' HTTP listeners share: the connection loop and the request-body deadline.
//!
//! * [`serve`] drives each connection with hyper's HTTP/1 server and tokio's timer, so a
//!   client must send a request's headers within [`HttpConfig::header_read_timeout`] (an idle
//!   kept-alive connection is closed after as long), and holds at most
//!   [`HttpConfig::max_connections`] connections: past them it stops accepting (new ones wait
//!   in the kernel's backlog) until one closes. On `stop` it closes the listener, lets the
//!   requests in flight finish for up to [`HttpConfig::shutdown_grace`], then ends the rest.
//! * [`body_deadline`] reads a request's whole body within
//!   [`HttpConfig::body_read_timeout`], counted from the request's start (a client that
//!   trickles a byte at a time does not restart it), and at most
//!   [`HttpConfig::max_body_bytes`] of it; past either the request is answered 408 or 413.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use crate::config::HttpConfig;

/// A refusal of the body: its status, its kind and what the client is told.
pub(crate) type BodyRefusal = (StatusCode, &'static str, String);

/// The deadline and size a request body is read within, and how a refusal is rendered (in
/// the server's own error shape).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    timeout: Duration,
    max_bytes: usize,
    refuse: fn(BodyRefusal) -> Response,
}

impl BodyLimits {
    pub(crate) fn of(config: &HttpConfig, refuse: fn(BodyRefusal) -> Response) -> Self {
        BodyLimits {
            timeout: config.body_read_timeout,
            max_bytes: config.max_body_bytes,
            refuse,
        }
    }
}

/// Middleware: reads the request's body within its [`BodyLimits`] (see the
/// [module docs](self)), then hands the request on with the body read.
pub(crate) async fn body_deadline(
    State(limits): State<BodyLimits>,
    request: Request,
    next: Next,
) -> Response {
    let refuse = limits.refuse;
    let (parts, body) = request.into_parts();
    let read =
        tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, limits.max_bytes)).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            // `to_bytes` fails on the cap or on a broken connection; hyper's length-limit
            // error says which.
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if too_large {
                refuse((
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "the request body is over the {} bytes this server takes",
                        limits.max_bytes
                    ),
                ))
            } else {
                refuse((
                    StatusCode::BAD_REQUEST,
                    "invalid_input",
                    format!("the request body could not be read: {e}"),
                ))
            };
        }
        Err(_) => {
            return refuse((
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body took longer than {} to arrive",
                    pycage_tools::units::format_duration(limits.timeout)
                ),
            ));
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A refusal as plain text (the MCP listener's shape, as rmcp's own refusals are).
pub(crate) fn plain_refusal((status, _, message): BodyRefusal) -> Response {
    (status, message).into_response()
}

/// Serves `app` on `listener` until `stop` completes (see the [module docs](self)); `on_stop`
/// runs when it does, before the connections are told to finish.
///
/// # Errors
///
/// None yet: a failed accept is logged and retried. The `Result` is for the callers' API.
pub(crate) async fn serve(
    app: Router,
    listener: tokio::net::TcpListener,
    config: &HttpConfig,
    stop: impl Future<Output = ()> + Send,
    on_stop: impl FnOnce(),
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt as _;

    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    let builder = Arc::new(builder);
    let open = Arc::new(Semaphore::new(config.max_connections));
    let (shutdown, on_shutdown) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // A connection slot first: at the cap, nothing more is accepted until one closes.
        let slot = tokio::select! {
            () = &mut stop => break,
            slot = open.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset before it was taken:
                        // wait a moment (so a full table does not spin), then go on.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = hyper::service::service_fn({
                    let app = app.clone();
                    move |request: axum::http::Request<hyper::body::Incoming>| {
                        app.clone().oneshot(request.map(Body::new))
                    }
                });
                let builder = builder.clone();
                let mut on_shutdown = on_shutdown.clone();
                connections.spawn(async move {
                    let _slot = slot;
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    let mut connection = std::pin::pin!(connection);
                    tokio::select! {
                        _ = connection.as_mut() => return,
                        _ = on_shutdown.changed() => connection.as_mut().graceful_shutdown(),
                    }
                    let _ = connection.await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    on_stop();
    let _ = shutdown.send(true);
    let grace = config.shutdown_grace;
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "the shutdown grace of {grace:?} is over: cancelling the requests still in flight"
        );
        connections.shutdown().await;
    }
    Ok(())
}

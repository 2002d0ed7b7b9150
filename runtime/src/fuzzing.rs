//! Property checks shared by the fuzz targets (`fuzz/`) and the regression tests that replay
//! what the fuzzers found. Not a stable API.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a broken property is reported by panicking, which is what a fuzzer catches"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use pycage_tools::ToolRegistry;
use pycage_tools::json::MAX_DEPTH;
use serde_json::json;
use serde_json::value::RawValue;

use crate::os::Token;
use crate::os::protocol::{self, Request};
use crate::{Broker, CallError, Limits, ToolPolicy};

const CEILING: u32 = 3;
const MAX_RESULT: u64 = 1024;

/// Feeds hostile calls to a broker and panics if any of its promises breaks.
///
/// `data` is `name 0xFF args [0xFF name 0xFF args ...]`, each pair one call, against the
/// built-in tools with namespace `math` exposed, a registered but hidden `vault.secret`, a
/// ceiling of 3 calls, a 256-byte argument cap and a 1 KiB result cap. Checked: only exact
/// exposed names run; refused calls are not counted; the ceiling holds; results are JSON within
/// the cap; messages stay short; the hidden tool never runs.
pub async fn broker_calls(data: &[u8]) {
    let secret_calls = Arc::new(AtomicU32::new(0));
    let mut registry = ToolRegistry::with_builtins();
    let calls = secret_calls.clone();
    registry
        .register_fn(
            "vault",
            "secret",
            "never exposed",
            json!({"type": "object"}),
            move |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok(json!("secret")) }
            },
        )
        .expect("a valid tool");
    let exposed = ToolPolicy::new()
        .namespace("math")
        .resolve(&registry)
        .expect("math resolves");
    let limits = Limits::builder()
        .max_tool_calls(CEILING)
        .max_tool_args_bytes(256)
        .max_tool_result_bytes(MAX_RESULT)
        .build()
        .expect("valid limits");
    let broker = Broker::new("fuzz", exposed.clone(), &limits);
    let parts: Vec<&[u8]> = data.split(|b| *b == 0xff).collect();
    for pair in parts.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let args = pair
            .get(1)
            .map(|a| String::from_utf8_lossy(a))
            .unwrap_or_default();
        let before = broker.executed();
        let outcome = broker.call(&name, &args).await;
        let executed = broker.executed() - before;
        match &outcome {
            Ok(text) => {
                assert!(
                    exposed.lookup(&name).is_some(),
                    "an unexposed name ran: {name:?}"
                );
                assert!(text.len() as u64 <= MAX_RESULT);
                serde_json::from_str::<serde_json::Value>(text).expect("results are JSON");
                assert_eq!(executed, 1);
            }
            Err(CallError::NotFound(_)) => {
                assert!(exposed.lookup(&name).is_none());
                assert_eq!(executed, 0, "a refused call was counted");
            }
            Err(CallError::InvalidArguments(_) | CallError::LimitExceeded(_)) => {}
            Err(CallError::Failed(_)) => assert_eq!(executed, 1),
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
        if let Err(e) = &outcome {
            assert!(e.message().len() < 512, "a long message: {e:?}");
        }
    }
    assert!(broker.executed() <= CEILING, "the ceiling was exceeded");
    assert_eq!(
        secret_calls.load(Ordering::SeqCst),
        0,
        "the hidden tool ran"
    );
}

/// The token the frame fuzz target plants wherever its input says `@T@`, so inputs reach past
/// the token check.
const FUZZ_TOKEN: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// Feeds a hostile peer's bytes to the socket protocol's decoders and panics if a promise
/// breaks.
///
/// `data` is a 4-byte length prefix, a 4-byte cap, then a frame body in which `@T@` becomes the
/// run's token. Checked: the length check never lets a frame over the cap through; decoding
/// never panics; without the token nothing decodes; a decoded call's arguments are a JSON
/// object and its name is what the guest sent; every error message stays short; a call the
/// host encodes decodes back to itself; and arguments the broker would accept write back as
/// the same text (no number changes on the way).
pub fn socket_frames(data: &[u8]) {
    let Some((header, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let Some((cap, body)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let cap = u64::from(u32::from_be_bytes(*cap));
    if let Ok(len) = protocol::check_frame_len(*header, cap) {
        assert!(len as u64 <= cap, "a frame over the cap passed");
    }

    let token = Token::known(FUZZ_TOKEN);
    let body = replace(body, b"@T@", FUZZ_TOKEN.as_bytes());
    match protocol::decode_request(&body, &token) {
        Ok(Request::Call(call)) => {
            assert!(
                contains(&body, FUZZ_TOKEN.as_bytes()),
                "decoded without the token"
            );
            let raw: &RawValue =
                serde_json::from_str(&call.arguments).expect("the arguments are one JSON value");
            assert!(raw.get().starts_with('{'), "the arguments are an object");
            let again = protocol::encode_call(
                FUZZ_TOKEN,
                call.id,
                &call.name,
                call.namespace.as_deref(),
                raw,
            );
            match protocol::decode_request(&again, &token) {
                Ok(Request::Call(back)) => assert_eq!(back, call, "a call does not round-trip"),
                other => panic!("a re-encoded call does not decode: {other:?}"),
            }
            // What the broker reads of the arguments writes back as the same text: every
            // number it accepts is exact.
            if let Ok(args) = pycage_tools::json::parse(raw.get().as_bytes(), MAX_DEPTH) {
                let text = args.to_string();
                let back = pycage_tools::json::parse(text.as_bytes(), MAX_DEPTH)
                    .expect("re-encoded arguments parse");
                assert_eq!(back.to_string(), text, "a value does not round-trip");
            }
        }
        Ok(Request::Result { .. } | Request::Next { .. }) => {
            assert!(
                contains(&body, FUZZ_TOKEN.as_bytes()),
                "decoded without the token"
            );
        }
        Err(e) => {
            let text = format!("{:?}", e.response());
            assert!(text.len() < 1024, "a long protocol error: {text}");
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

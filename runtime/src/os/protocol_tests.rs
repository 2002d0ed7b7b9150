use serde_json::json;

use super::*;

fn token() -> Token {
    Token::generate().unwrap()
}

fn body(t: &Token, mut v: Value) -> Vec<u8> {
    v["token"] = t.as_str().into();
    v.to_string().into_bytes()
}

fn decode(t: &Token, v: Value) -> Result<Request, ProtocolError> {
    decode_request(&body(t, v), t)
}

#[track_caller]
fn assert_bad(result: Result<Request, ProtocolError>, needle: &str) {
    let e = result.expect_err("a malformed frame is refused");
    assert_eq!(e.kind, WireErrorKind::BadRequest, "{e}");
    assert!(e.message.contains(needle), "{e}");
}

#[test]
fn a_call_decodes_with_its_arguments_as_text() {
    let t = token();
    let r = decode(
        &t,
        json!({"id": 7, "method": "call", "name": "add", "namespace": "math", "arguments": {"a": 1,  "b": [1, 2]}}),
    )
    .unwrap();
    let Request::Call(call) = r else {
        panic!("a call")
    };
    assert_eq!(call.id, 7);
    assert_eq!(call.tool_name(), "math.add");
    assert_eq!(call.arguments, r#"{"a":1,"b":[1,2]}"#);
    let r = decode(
        &t,
        json!({"id": 8, "method": "call", "name": "add", "arguments": {}}),
    )
    .unwrap();
    assert_eq!(r.id(), 8);
    let Request::Call(call) = r else {
        panic!("a call")
    };
    assert_eq!(call.tool_name(), "add");
}

#[test]
fn the_token_is_checked_before_anything_else() {
    let t = token();
    let other = token();
    for frame in [
        json!({"id": 1, "method": "call", "name": "add", "arguments": {}}),
        json!({"id": "x", "method": "nope"}),
        json!({}),
    ] {
        let e = decode_request(&body(&other, frame.clone()), &t).unwrap_err();
        assert_eq!(e.kind, WireErrorKind::Unauthorized);
        assert_eq!(e.id, None, "the id is not read before the token");
        let mut missing = frame.clone();
        missing.as_object_mut().unwrap().remove("token");
        let e = decode_request(missing.to_string().as_bytes(), &t).unwrap_err();
        assert_eq!(e.kind, WireErrorKind::Unauthorized);
    }
    let e = decode_request(
        json!({"token": 5, "id": 1, "method": "call"})
            .to_string()
            .as_bytes(),
        &t,
    )
    .unwrap_err();
    assert_eq!(e.kind, WireErrorKind::Unauthorized);
}

#[test]
fn malformed_frames_are_bad_requests() {
    let t = token();
    assert_bad(decode_request(b"{not json", &t), "not valid JSON");
    assert_bad(decode_request(b"", &t), "not valid JSON");
    assert_bad(decode_request(b"[1, 2]", &t), "not a JSON object");
    assert_bad(decode_request(&[0xff, 0xfe], &t), "not valid JSON");
    assert_bad(decode(&t, json!({"method": "call"})), "`id` is missing");
    assert_bad(decode(&t, json!({"id": -1, "method": "call"})), "`id`");
    assert_bad(decode(&t, json!({"id": 1.5, "method": "call"})), "`id`");
    assert_bad(decode(&t, json!({"id": 1})), "`method` is missing");
    assert_bad(
        decode(&t, json!({"id": 1, "method": 3})),
        "`method` must be",
    );
    assert_bad(
        decode(&t, json!({"id": 1, "method": "frobnicate"})),
        "unknown method `frobnicate`",
    );
    let call = |extra: Value| {
        let mut v = json!({"id": 1, "method": "call", "name": "add", "arguments": {}});
        for (k, x) in extra.as_object().unwrap() {
            if x.is_null() {
                v.as_object_mut().unwrap().remove(k);
            } else {
                v[k] = x.clone();
            }
        }
        decode(&t, v)
    };
    assert_bad(call(json!({"name": 5})), "`name` must be a string");
    assert_bad(call(json!({"name": null})), "`name` is missing");
    assert_bad(
        call(json!({"namespace": 5})),
        "`namespace` must be a string",
    );
    assert_bad(
        call(json!({"namespace": ["m"]})),
        "`namespace` must be a string",
    );
    assert_bad(
        call(json!({"arguments": [1]})),
        "`arguments` must be an object",
    );
    assert_bad(
        call(json!({"arguments": "{}"})),
        "`arguments` must be an object",
    );
    assert_bad(call(json!({"arguments": null})), "`arguments` is missing");
    assert_bad(call(json!({"extra": 1})), "unknown field `extra`");
    // The id is echoed once it could be read.
    let e = call(json!({"name": 5})).unwrap_err();
    assert_eq!(e.id, Some(1));
}

#[test]
fn outcomes_decode_and_round_trip() {
    let t = token();
    let ok = Outcome {
        value: Ok("15".into()),
        report: None,
    };
    let fail = Outcome {
        value: Err(RunError {
            kind: ErrorKind::GuestException,
            message: "ZeroDivisionError: division by zero".into(),
            traceback: Some("Traceback ...".into()),
            exception: Some("ZeroDivisionError".into()),
        }),
        report: Some(WorkerReport {
            stdout: "out".into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: true,
            fuel_consumed: Some(3),
            files: vec![crate::OutputFile {
                path: "out/a.bin".into(),
                size: 3,
                bytes: Some(vec![0, 255, 7]),
            }],
        }),
    };
    for outcome in [ok, fail] {
        let body = encode_result(t.as_str(), 9, &outcome);
        assert_eq!(
            decode_request(&body, &t).unwrap(),
            Request::Result { id: 9, outcome }
        );
    }
    let r = decode(
        &t,
        json!({"id": 2, "method": "result", "outcome": {"ok": false, "kind": "syntax-error", "message": "m"}}),
    )
    .unwrap();
    let Request::Result { outcome, .. } = r else {
        panic!("a result")
    };
    assert_eq!(outcome.value.unwrap_err().kind, ErrorKind::SyntaxError);
}

#[test]
fn malformed_outcomes_are_bad_requests() {
    let t = token();
    let result = |o: Value| decode(&t, json!({"id": 2, "method": "result", "outcome": o}));
    assert_bad(
        decode(&t, json!({"id": 2, "method": "result"})),
        "`outcome` is missing",
    );
    assert_bad(result(json!("ok")), "`outcome` must be an object");
    assert_bad(result(json!({})), "`outcome.ok`");
    assert_bad(result(json!({"ok": true})), "value_json");
    assert_bad(result(json!({"ok": true, "value_json": 15})), "value_json");
    assert_bad(
        result(json!({"ok": false, "kind": "explode", "message": "m"})),
        "unknown failure kind",
    );
    assert_bad(
        result(json!({"ok": false, "kind": "timeout"})),
        "`outcome.message`",
    );
    assert_bad(
        result(json!({"ok": false, "kind": "timeout", "message": "m", "traceback": 1})),
        "traceback",
    );
    assert_bad(
        result(json!({"ok": true, "value_json": "1", "report": {"stdout": 1}})),
        "report",
    );
    assert_bad(
        result(json!({"ok": true, "value_json": "1", "bonus": 1})),
        "unknown field `bonus`",
    );
}

#[test]
fn every_error_kind_has_a_wire_name_that_round_trips() {
    for kind in [
        ErrorKind::Timeout,
        ErrorKind::FuelExhausted,
        ErrorKind::MemoryLimit,
        ErrorKind::StackOverflow,
        ErrorKind::ToolCallLimit,
        ErrorKind::ValueTooLarge,
        ErrorKind::GuestException,
        ErrorKind::SyntaxError,
        ErrorKind::InvalidInput,
        ErrorKind::CapabilityDenied,
        ErrorKind::BackendError,
    ] {
        let wire = kind_to_wire(kind);
        assert_eq!(wire, kind.as_str().replace('_', "-"));
        assert_eq!(kind_from_wire(wire), Some(kind));
    }
    assert_eq!(kind_from_wire("guest_exception"), None);
}

#[test]
fn responses_round_trip() {
    let responses = [
        Response::Ok {
            id: 1,
            result_json: r#"{"sum":3}"#.into(),
        },
        Response::Err {
            id: Some(2),
            kind: WireErrorKind::LimitExceeded,
            message: "tool call limit reached (2 calls)".into(),
        },
        Response::Err {
            id: None,
            kind: WireErrorKind::Unauthorized,
            message: "no".into(),
        },
    ];
    for r in responses {
        assert_eq!(decode_response(&encode_response(&r)).unwrap(), r);
    }
    for kind in ["unauthorized", "bad-request", "not-found", "limit-exceeded"] {
        assert_eq!(WireErrorKind::parse(kind).unwrap().as_str(), kind);
    }
    assert!(decode_response(b"{\"ok\": true}").is_err());
    assert!(decode_response(b"nope").is_err());
}

#[test]
fn frame_lengths_are_checked_against_the_cap() {
    assert_eq!(check_frame_len(10u32.to_be_bytes(), 10).unwrap(), 10);
    let e = check_frame_len((1u32 << 30).to_be_bytes(), 1 << 20).unwrap_err();
    assert_eq!(e.kind, WireErrorKind::LimitExceeded);
    assert!(e.message.contains("1073741824"), "{e}");
    let f = frame(b"{}");
    assert_eq!(f, [0, 0, 0, 2, b'{', b'}']);
}

#[test]
fn the_frame_cap_fits_calls_and_results() {
    let limits = Limits::default();
    let cap = max_frame_bytes(&limits);
    assert!(cap >= limits.max_tool_args_bytes() + FRAME_SLACK_BYTES);
    assert!(cap >= 2 * limits.max_value_bytes() + FRAME_SLACK_BYTES);
    assert!(cap < 1 << 30, "a 1 GiB frame is refused by default");
    let huge = Limits::builder()
        .max_output_bytes(u64::MAX)
        .build()
        .unwrap();
    assert_eq!(max_frame_bytes(&huge), u64::from(u32::MAX));
}

#[test]
fn peer_text_in_messages_is_escaped_and_short() {
    let t = token();
    let method = format!("a\n\u{1b}{}", "x".repeat(500));
    let e = decode(&t, json!({"id": 1, "method": method})).unwrap_err();
    assert!(!e.message.contains('\n') && !e.message.contains('\u{1b}'));
    assert!(e.message.len() < 200, "{}", e.message);
}

#[test]
fn deeply_nested_frames_decode_without_recursing() {
    let t = token();
    let args = format!(r#"{{"x":{}1{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    let frame = format!(
        r#"{{"token":"{}","id":1,"method":"call","name":"a","arguments":{args}}}"#,
        t.as_str(),
    );
    // On a small stack: splitting a frame into fields does not recurse into them. The
    // arguments go to the broker as they are, which refuses them by its depth bound.
    let decoded = std::thread::Builder::new()
        .stack_size(128 * 1024)
        .spawn(move || decode_request(frame.as_bytes(), &t))
        .unwrap()
        .join()
        .unwrap();
    let Ok(Request::Call(call)) = decoded else {
        panic!("{decoded:?}")
    };
    assert_eq!(call.arguments, args);
    let t = token();
    let deep_outcome = format!(
        r#"{{"token":"{}","id":1,"method":"result","outcome":{{"ok":true,"value_json":"1","x":{}{}}}}}"#,
        t.as_str(),
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_bad(
        decode_request(deep_outcome.as_bytes(), &t),
        "in `outcome`, arrays and objects nest deeper than 4 levels",
    );
}

#[test]
fn arguments_cross_as_the_guest_wrote_them() {
    // No number is parsed and re-encoded on the way: floats the default parser rounds wrongly
    // and integers past 64 bits arrive as text, for the broker to read by its rules.
    let t = token();
    let args = r#"{"x": -7.312715117751976e-237, "n": 1180591620717411303424, "z": -0.0}"#;
    let frame = format!(
        r#"{{"token":"{}","id":3,"method":"call","name":"echo","arguments":{args}}}"#,
        t.as_str()
    );
    let Request::Call(call) = decode_request(frame.as_bytes(), &t).unwrap() else {
        panic!("a call")
    };
    assert_eq!(call.arguments, args);
    let raw: &RawValue = serde_json::from_str(args).unwrap();
    let again = encode_call(t.as_str(), 3, "echo", None, raw);
    assert_eq!(decode_request(&again, &t).unwrap(), Request::Call(call));
}

#[test]
fn fuzz_regressions_replay() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/frame");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the regression corpus exists") {
        crate::fuzzing::socket_frames(&std::fs::read(entry.unwrap().path()).unwrap());
        replayed += 1;
    }
    assert!(replayed > 0, "no regression inputs in {}", dir.display());
}

#[test]
fn a_next_request_decodes_and_refuses_extra_fields() {
    let t = token();
    let r = decode(&t, json!({"id": 4, "method": "next"})).unwrap();
    assert_eq!(r, Request::Next { id: 4 });
    assert_eq!(r.id(), 4);
    assert_bad(
        decode(&t, json!({"id": 4, "method": "next", "code": "x"})),
        "unknown field `code`",
    );
    let e = decode_request(&body(&t, json!({"id": 4, "method": "next"})), &token()).unwrap_err();
    assert_eq!(e.kind, WireErrorKind::Unauthorized);
}

#[test]
fn a_session_job_round_trips_as_text() {
    let job = SessionJob {
        code: "x = \"\u{e9}\"\n".into(),
        request_json: r#"{"session":true}"#.into(),
        max_args_bytes: 1 << 20,
        marker: "m".into(),
    };
    let text = job.encode();
    assert_eq!(serde_json::from_str::<SessionJob>(&text).unwrap(), job);
}

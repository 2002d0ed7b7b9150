use serde_json::{Map, Value, json};

use super::*;
use crate::Limits;

#[test]
fn the_guests_stdin_is_one_header_line_then_the_code() {
    let limits = Limits::builder().max_tool_args_bytes(4096).build().unwrap();
    let mut vars = Map::new();
    vars.insert("x".into(), json!(1));
    let job = Job {
        code: "print('é')\nx + 1\n".into(),
        vars,
        limits,
        tools: Vec::new(),
        files: Vec::new(),
        output_meter: None,
    };
    let token = Token::known("t0k");
    for socket in ["/run/pycage/broker.sock", r"\\.\pipe\pycage-0123abcd-42"] {
        let stdin = guest_stdin(socket, None, &token, &job);
        let newline = stdin.iter().position(|&b| b == b'\n').unwrap();
        let header: Value = serde_json::from_slice(&stdin[..newline]).unwrap();
        assert_eq!(
            header,
            json!({
                "socket": socket,
                "token": "t0k",
                "request_json": request_json(&job),
                "max_args_bytes": 4096,
            })
        );
        assert_eq!(&stdin[newline + 1..], job.code.as_bytes());
    }
    let request: Value = serde_json::from_str(&request_json(&job)).unwrap();
    assert_eq!(request["vars"], json!({"x": 1}));
}

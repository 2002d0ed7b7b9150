//! What the servers tell a client about their tools: the library's description of the
//! sandbox with what a call may add (a session, its own limits), and the schemas of the
//! tools' inputs and `run_python`'s structured output.

use std::fmt::Write as _;

use pycage::{Description, Limits};
use pycage_tools::units::{format_duration, format_size};
use serde_json::{Value, json};

use crate::clamp;

/// The library's text, and a section on what a call may ask for.
pub fn description_text(description: &Description, maxima: &Limits, sessions: bool) -> String {
    let mut text = description.text().to_owned();
    let _ = writeln!(text, "\n## What a call may ask for\n");
    let _ = writeln!(
        text,
        "- `limits` lowers (or, up to the maxima, raises) this call's limits: \
         `timeout_seconds` at most {}, `memory_mib` at most {}, `max_output_bytes` at most {}, \
         `max_tool_calls` at most {}{}. A value above its maximum is lowered to it and the \
         result says so.",
        format_duration(maxima.wall_timeout()),
        maxima.memory_bytes() >> 20,
        maxima.max_output_bytes(),
        maxima.max_tool_calls(),
        match maxima.fuel() {
            Some(fuel) => format!(", `fuel` at most {fuel}"),
            None => ", `fuel`".into(),
        },
    );
    if description.environment().input_files {
        let _ = writeln!(
            text,
            "- `files` values are UTF-8 text; set `files_base64: true` to pass them as base64 \
             bytes instead. Input files at most {} together.",
            format_size(description.limits().max_input_bytes())
        );
    }
    if sessions {
        let _ = writeln!(
            text,
            "- `session_id` runs the call in a session made by `create_session` (which may \
             set the session's own `limits`, within the same maxima; its memory and file \
             budgets hold for the whole session). `close_session` destroys one."
        );
    }
    text
}

/// `run_python`'s input: the library's schema with `limits`, and `session_id` and
/// `files_base64` where they apply.
pub fn run_input(
    description: &Description,
    maxima: &Limits,
    sessions: bool,
    net_hosts: Option<&[String]>,
) -> Value {
    let mut schema = description.input_schema().clone();
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        properties.insert("limits".into(), clamp::schema(maxima));
        if let Some(hosts) = net_hosts {
            properties.insert(
                "net_allow".into(),
                json!({
                    "type": "array",
                    "items": {"type": "string", "enum": hosts},
                    "description": "Narrow net.fetch to these of its hosts for this run \
                                    (it cannot be widened); without it, every host listed.",
                }),
            );
        }
        if description.environment().input_files {
            properties.insert(
                "files_base64".into(),
                json!({
                    "type": "boolean",
                    "description": "The `files` values are base64 bytes, not text.",
                }),
            );
        }
        if sessions {
            properties.insert(
                "session_id".into(),
                json!({
                    "type": "string",
                    "description": "Run in this session (from `create_session`): state and \
                                    files persist between the calls that pass it.",
                }),
            );
        }
    }
    schema
}

/// `create_session`'s input.
pub fn create_session_input(maxima: &Limits) -> Value {
    json!({
        "type": "object",
        "properties": { "limits": clamp::schema(maxima) },
        "additionalProperties": false,
    })
}

/// `close_session`'s input.
pub fn close_session_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string", "description": "The session to destroy."},
        },
        "required": ["session_id"],
        "additionalProperties": false,
    })
}

/// The input of `resume_run`.
pub fn resume_run_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "description": "The `run_id` of the suspended result."},
            "decision": {
                "enum": ["approve", "deny", "answer"],
                "description": "What the person decided: the tool runs now (`approve`), the code gets a ToolError of kind `denied` (`deny`), or the code gets `answer` as the call's result (`answer`). Only `deny` may be your own decision.",
            },
            "answer": {"description": "With `decision: \"answer\"`: the call's result, any JSON."},
            "approval_code": {"type": "string", "description": "With `approve` or `answer`: the approval code the person read from the pycage server and gave you. Never guess it: a wrong code ends the run."},
        },
        "required": ["run_id", "decision"],
        "additionalProperties": false,
    })
}

/// The JSON schema of `run_python`'s structured output.
pub fn run_output() -> Value {
    let nullable = |t: &str| json!({"type": [t, "null"]});
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean", "description": "The code ran to the end and its value crossed back."},
            "value": {"description": "The code's return value, as JSON."},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "error": {
                "type": ["object", "null"],
                "properties": {
                    "kind": {"type": "string"},
                    "message": {"type": "string"},
                    "traceback": nullable("string"),
                    "exception": nullable("string"),
                },
                "required": ["kind", "message"],
            },
            "tool_calls": {"type": "integer"},
            "fuel_consumed": nullable("integer"),
            "duration": {"type": "number", "description": "Milliseconds, from the call to the result."},
            "timed_out": {"type": "boolean"},
            "backend": {"type": "string"},
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "size": {"type": "integer"},
                        "returned": {"type": "boolean"},
                    },
                    "required": ["path", "size", "returned"],
                },
            },
            "session_id": nullable("string"),
            "session_ended": {"type": "boolean"},
            "status": {
                "enum": ["completed", "failed", "suspended"],
                "description": "`suspended`: a tool call waits for a person's approval (see the text for what you may do).",
            },
            "run_id": nullable("string"),
            "pending": {
                "type": ["object", "null"],
                "description": "A suspended run's pending call.",
                "properties": {
                    "position": {"type": "integer"},
                    "tool": {"type": "string"},
                    "args": {"type": "object"},
                    "reason": {"type": "string"},
                },
            },
            "clamped": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "asked": {},
                        "got": {},
                    },
                },
            },
        },
        "required": ["ok", "value", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "error", "tool_calls", "fuel_consumed", "duration", "timed_out", "backend", "files", "session_id", "session_ended", "status", "run_id", "pending", "clamped"],
    })
}

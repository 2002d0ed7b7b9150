//! Printing a run's result: human-readable, or one JSON object.

use std::io::Write;

use pycage::RunResult;

/// The whole result as one JSON object on stdout.
pub fn json(result: &RunResult) {
    let mut out = std::io::stdout().lock();
    let text = serde_json::to_string(result).unwrap_or_else(|e| {
        format!("{{\"ok\":false,\"error\":{{\"kind\":\"backend_error\",\"message\":\"result not serializable: {e}\"}}}}")
    });
    let _ = writeln!(out, "{text}");
}

/// The guest's stdout and stderr passed through, the value on stdout, the error on stderr.
pub fn human(result: &RunResult) {
    {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(result.stdout.as_bytes());
        if !result.value.is_null() {
            let _ = writeln!(out, "{}", result.value);
        }
        let _ = out.flush();
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(result.stderr.as_bytes());
    if let Some(error) = &result.error {
        if let Some(tb) = &error.traceback {
            let _ = write!(err, "{tb}");
            if !tb.ends_with('\n') {
                let _ = writeln!(err);
            }
        }
        let _ = writeln!(err, "pycage: {}: {}", error.kind, error.message);
    }
    if result.stdout_truncated || result.stderr_truncated {
        let _ = writeln!(err, "pycage: output was over the cap; its middle was cut");
    }
}

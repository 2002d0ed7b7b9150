//! Runs suspended at a call that waits for a person's approval, kept by a server until a
//! client resumes them (`POST /v1/runs/{id}/resume`, MCP `resume_run`) or they expire.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pycage::{Decision, ErrorKind, RunError, Suspended};
use serde_json::Value;

/// How long a suspended run waits for its decision by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The most suspended runs a server keeps by default.
pub const DEFAULT_MAX: usize = 256;

/// The suspended runs of one server, by run id. Each is resumed at most once: taking it
/// removes it, so two clients resuming one run cannot both run its approved call.
#[derive(Debug)]
pub struct SuspendedRuns {
    runs: Mutex<HashMap<String, (Instant, Suspended)>>,
    ttl: Duration,
    max: usize,
}

impl Default for SuspendedRuns {
    fn default() -> Self {
        Self::new(DEFAULT_TTL, DEFAULT_MAX)
    }
}

impl SuspendedRuns {
    /// A store keeping at most `max` runs, each for `ttl`.
    pub fn new(ttl: Duration, max: usize) -> Self {
        SuspendedRuns {
            runs: Mutex::new(HashMap::new()),
            ttl,
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Suspended)>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `state` and gives its run id.
    ///
    /// # Errors
    ///
    /// `busy` when the store holds as many live runs as it may (expired ones are dropped
    /// first); `backend_error` when no id can be made.
    pub fn keep(&self, state: Suspended) -> Result<String, RunError> {
        let mut runs = self.lock();
        let now = Instant::now();
        runs.retain(|_, (expires, _)| *expires > now);
        if runs.len() >= self.max {
            return Err(RunError::new(
                ErrorKind::Busy,
                format!(
                    "the run stopped for approval, but the server already keeps {} suspended \
                     runs; resume or let some expire, then run it again",
                    self.max
                ),
            ));
        }
        let id = new_id()?;
        runs.insert(id.clone(), (now + self.ttl, state));
        Ok(id)
    }

    /// Takes the run `id` out of the store, to resume it; `None` when no live suspended run
    /// has that id (it was resumed, expired or never existed).
    pub fn take(&self, id: &str) -> Option<Suspended> {
        let mut runs = self.lock();
        match runs.remove(id) {
            Some((expires, state)) if expires > Instant::now() => Some(state),
            _ => None,
        }
    }

    /// Puts a taken run back, when its resume was refused before anything ran (busy, say).
    pub fn put_back(&self, id: String, state: Suspended) {
        self.lock().insert(id, (Instant::now() + self.ttl, state));
    }

    /// How many runs wait now (expired ones included until the next `keep`).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long a run waits for its decision.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// A fresh run id: 128 random bits, hex.
fn new_id() -> Result<String, RunError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        RunError::new(
            ErrorKind::BackendError,
            format!("no id for the suspended run: the random source failed: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A result's `status` on the servers: `suspended` when it stopped at a call that waits for
/// approval, else `completed` or `failed`.
pub fn status(suspended: bool, ok: bool) -> &'static str {
    match (suspended, ok) {
        (true, _) => "suspended",
        (false, true) => "completed",
        (false, false) => "failed",
    }
}

/// The decision a resume request carries, from its `decision` (`"approve"`, `"deny"` or
/// `"answer"`) and, with `"answer"`, its `answer` (any JSON).
///
/// # Errors
///
/// `invalid_input` naming what is wrong.
pub fn decision(decision: Option<&str>, answer: Option<&Value>) -> Result<Decision, RunError> {
    let invalid = |m: &str| RunError::new(ErrorKind::InvalidInput, m);
    match decision {
        Some("approve") if answer.is_none() => Ok(Decision::Approve),
        Some("deny") if answer.is_none() => Ok(Decision::Deny),
        Some("answer") => answer
            .cloned()
            .map(Decision::Answer)
            .ok_or_else(|| invalid("`decision: \"answer\"` needs `answer`, the call's result")),
        Some("approve" | "deny") => Err(invalid("`answer` goes only with `decision: \"answer\"`")),
        _ => Err(invalid(
            "`decision` must be \"approve\", \"deny\" or \"answer\" (with `answer`)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state() -> Suspended {
        Suspended::from_json(
            &json!({
                "version": 1, "code": "x", "vars": {}, "seed": null, "calls": [],
                "pending": {"position": 0, "tool": "a.b", "args": {}, "reason": "r"},
                "mac": ""
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn a_kept_run_is_taken_once_and_the_store_is_bounded() {
        let store = SuspendedRuns::new(Duration::from_secs(60), 2);
        let a = store.keep(state()).unwrap();
        let b = store.keep(state()).unwrap();
        assert_ne!(a, b);
        assert_eq!(store.keep(state()).unwrap_err().kind, ErrorKind::Busy);
        assert!(store.take(&a).is_some());
        assert!(store.take(&a).is_none(), "taken once");
        store.keep(state()).unwrap();
        let expired = SuspendedRuns::new(Duration::ZERO, 2);
        let id = expired.keep(state()).unwrap();
        assert!(expired.take(&id).is_none(), "an expired run is gone");
    }

    #[test]
    fn decisions_parse_and_bad_ones_say_why() {
        let parse = |v: Value| decision(v["decision"].as_str(), v.get("answer"));
        assert_eq!(
            parse(json!({"decision": "approve"})).unwrap(),
            Decision::Approve
        );
        assert_eq!(parse(json!({"decision": "deny"})).unwrap(), Decision::Deny);
        assert_eq!(
            parse(json!({"decision": "answer", "answer": {"a": 1}})).unwrap(),
            Decision::Answer(json!({"a": 1}))
        );
        for bad in [
            json!({}),
            json!({"decision": "maybe"}),
            json!({"decision": "answer"}),
            json!({"decision": "deny", "answer": 1}),
        ] {
            assert_eq!(parse(bad).unwrap_err().kind, ErrorKind::InvalidInput);
        }
    }
}

//! Runs suspended at a call that waits for a person's approval, kept by a server until a
//! client resumes them (`POST /v1/runs/{id}/resume`, MCP `resume_run`) or they expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pycage::{Decision, ErrorKind, RunError, Suspended};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use subtle::ConstantTimeEq as _;

/// How many suspended runs a server keeps, how big, and for how long (`[suspended]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SuspendedConfig {
    /// How long a suspended run waits for its decision (default 1 h).
    #[serde(with = "pycage_tools::units::duration_text")]
    pub ttl: Duration,
    /// The most suspended runs kept at once (default 64).
    pub max_runs: usize,
    /// The largest state one run may leave (its code, inputs, and every call's arguments and
    /// result so far), in bytes (default 4 MiB): a run past it fails as `tool_call_limit`.
    pub max_run_bytes: usize,
    /// The most bytes all kept runs may hold together (default 64 MiB): past it a run that
    /// stops for approval is refused as `busy`.
    pub max_total_bytes: usize,
    /// The most suspended runs one client may have kept at once (default 16, a quarter of
    /// `max_runs`), so that one client cannot take every slot. A client is what the server
    /// can tell apart: an MCP session over streamable HTTP. Runs of clients it cannot tell
    /// apart (`pycage serve`'s, which share one token; a stdio server's one client) count
    /// only against the totals.
    pub max_runs_per_client: usize,
    /// The most bytes one client's kept runs may hold together (default 16 MiB).
    pub max_bytes_per_client: usize,
}

impl Default for SuspendedConfig {
    fn default() -> Self {
        SuspendedConfig {
            ttl: Duration::from_secs(60 * 60),
            max_runs: 64,
            max_run_bytes: 4 << 20,
            max_total_bytes: 64 << 20,
            max_runs_per_client: 16,
            max_bytes_per_client: 16 << 20,
        }
    }
}

/// A run suspended at a call that waits for approval, with what it ran with beyond its
/// signed state: the tools that served it in place of exposed ones (`net_allow`'s narrowed
/// `net.fetch`), so its resume is no wider than the run.
#[derive(Clone)]
pub struct SuspendedRun {
    /// The signed state (its limits are in it).
    pub state: Suspended,
    /// The run's replacement tools ([`pycage::RunRequest::replace_tool`]).
    pub replacements: Vec<Arc<dyn pycage_tools::Tool>>,
    /// The one-time code a person was given to approve the run through a channel the model
    /// also speaks on (MCP's `resume_run`; see [`SuspendedRuns::issue_code`]); `None` until
    /// one is issued, and then such a channel can only deny.
    pub approval_code: Option<String>,
    /// The client whose run it is, where the server can tell clients apart (see
    /// [`SuspendedConfig::max_runs_per_client`]); a resume that stops again keeps it.
    pub client: Option<String>,
}

impl SuspendedRun {
    /// A run to keep, with no approval code yet.
    pub fn new(state: Suspended, replacements: Vec<Arc<dyn pycage_tools::Tool>>) -> Self {
        SuspendedRun {
            state,
            replacements,
            approval_code: None,
            client: None,
        }
    }

    /// The same run, counted against `client`'s share.
    #[must_use]
    pub fn for_client(mut self, client: Option<String>) -> Self {
        self.client = client;
        self
    }
}

impl std::fmt::Debug for SuspendedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tools: Vec<String> = self
            .replacements
            .iter()
            .map(|t| format!("{}.{}", t.namespace(), t.name()))
            .collect();
        f.debug_struct("SuspendedRun")
            .field("state", &self.state)
            .field("replacements", &tools)
            .field("approval_code", &self.approval_code.as_ref().map(|_| "…"))
            .field("client", &self.client)
            .finish()
    }
}

#[derive(Debug)]
struct Entry {
    expires: Instant,
    bytes: usize,
    run: SuspendedRun,
}

/// The suspended runs of one server, by run id. Each is resumed at most once: taking it
/// removes it, so two clients resuming one run cannot both run its approved call. Bounded
/// in count, in bytes per run and in bytes in all ([`SuspendedConfig`]).
#[derive(Debug)]
pub struct SuspendedRuns {
    runs: Mutex<HashMap<String, Entry>>,
    config: SuspendedConfig,
}

impl Default for SuspendedRuns {
    fn default() -> Self {
        Self::new(SuspendedConfig::default())
    }
}

impl SuspendedRuns {
    /// A store bounded by `config`.
    pub fn new(config: SuspendedConfig) -> Self {
        SuspendedRuns {
            runs: Mutex::new(HashMap::new()),
            config,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `run` and gives its run id.
    ///
    /// # Errors
    ///
    /// `tool_call_limit` when the run's state is larger than a run may keep; `busy` when
    /// the store holds as many live runs, or as many bytes, as it may, in all or for the
    /// run's client (expired ones are dropped first); `backend_error` when no id can be
    /// made.
    pub fn keep(&self, run: SuspendedRun) -> Result<String, RunError> {
        // The state's size as JSON: what it holds of the calls' arguments and results.
        let bytes = serde_json::to_vec(&run.state).map_or(usize::MAX, |v| v.len());
        let limits = &self.config;
        if bytes > limits.max_run_bytes {
            return Err(RunError::new(
                ErrorKind::ToolCallLimit,
                format!(
                    "the run stopped for approval, but its state ({bytes} bytes: its code, \
                     inputs and the calls so far) is over the {} bytes a server keeps for one \
                     run; keep the calls before an approved one smaller",
                    limits.max_run_bytes
                ),
            ));
        }
        let mut runs = self.lock();
        let now = Instant::now();
        runs.retain(|_, entry| entry.expires > now);
        let held: usize = runs.values().map(|e| e.bytes).sum();
        if runs.len() >= limits.max_runs || held.saturating_add(bytes) > limits.max_total_bytes {
            return Err(RunError::new(
                ErrorKind::Busy,
                format!(
                    "the run stopped for approval, but the server already keeps {} suspended \
                     runs ({held} bytes; it keeps at most {} runs, {} bytes); resume or let \
                     some expire, then run it again",
                    runs.len(),
                    limits.max_runs,
                    limits.max_total_bytes
                ),
            ));
        }
        if let Some(client) = &run.client {
            let (count, bytes_held) = runs
                .values()
                .filter(|e| e.run.client.as_ref() == Some(client))
                .fold((0, 0usize), |(n, b), e| (n + 1, b.saturating_add(e.bytes)));
            if count >= limits.max_runs_per_client
                || bytes_held.saturating_add(bytes) > limits.max_bytes_per_client
            {
                return Err(RunError::new(
                    ErrorKind::Busy,
                    format!(
                        "the run stopped for approval, but this client already has {count} \
                         suspended runs kept ({bytes_held} bytes; one client may keep at most \
                         {} runs, {} bytes); resume or deny some, then run it again",
                        limits.max_runs_per_client, limits.max_bytes_per_client
                    ),
                ));
            }
        }
        let id = new_id()?;
        let entry = Entry {
            expires: now + limits.ttl,
            bytes,
            run,
        };
        runs.insert(id.clone(), entry);
        Ok(id)
    }

    /// Takes the run `id` out of the store, to resume it; `None` when no live suspended run
    /// has that id (it was resumed, expired or never existed).
    pub fn take(&self, id: &str) -> Option<SuspendedRun> {
        let mut runs = self.lock();
        match runs.remove(id) {
            Some(entry) if entry.expires > Instant::now() => Some(entry.run),
            _ => None,
        }
    }

    /// Puts a taken run back, when its resume was refused before anything ran (busy, say).
    pub fn put_back(&self, id: String, run: SuspendedRun) {
        let bytes = serde_json::to_vec(&run.state).map_or(0, |v| v.len());
        let entry = Entry {
            expires: Instant::now() + self.config.ttl,
            bytes,
            run,
        };
        self.lock().insert(id, entry);
    }

    /// Gives the live run `id` a fresh one-time approval code and returns it, for the server
    /// to show the person (never the model); `None` when no live run has that id.
    ///
    /// # Errors
    ///
    /// `backend_error` when the random source fails.
    pub fn issue_code(&self, id: &str) -> Result<Option<String>, RunError> {
        let code = approval_code()?;
        let mut runs = self.lock();
        Ok(match runs.get_mut(id) {
            Some(entry) if entry.expires > Instant::now() => {
                entry.run.approval_code = Some(code.clone());
                Some(code)
            }
            _ => None,
        })
    }

    /// Takes the run `id` for a decision that came through a channel the model may speak on
    /// (MCP's `resume_run`, or a client's retry carrying the code back). `deny` needs nothing: the model may always refuse a call. `approve`
    /// and `answer` need the run's approval code as the person was given it; a wrong one
    /// ends the run (one try: a code cannot be guessed), and a run given no code cannot be
    /// approved this way at all.
    ///
    /// # Errors
    ///
    /// `invalid_input` when no live run has that id; `capability_denied` when the decision
    /// needs a code the call lacks or gets wrong.
    pub fn take_with_code(
        &self,
        id: &str,
        decision: &Decision,
        code: Option<&str>,
    ) -> Result<SuspendedRun, RunError> {
        let denied = |why: &str| RunError::new(ErrorKind::CapabilityDenied, why);
        let gone = || {
            RunError::new(
                ErrorKind::InvalidInput,
                "no suspended run has that `run_id` (it was resumed, expired or never existed)",
            )
        };
        let mut runs = self.lock();
        let live = runs.get(id).filter(|e| e.expires > Instant::now());
        let Some(entry) = live else {
            runs.remove(id);
            return Err(gone());
        };
        let needs_code = !matches!(decision, Decision::Deny);
        // Refusals that are not a try at a code leave the run waiting, so it can still be
        // denied or approved by the person.
        match (&entry.run.approval_code, code) {
            _ if !needs_code => {}
            (None, _) => {
                return Err(denied(
                    "this run can only be denied here: approving it needs a person's \
                     decision, and none was asked for through this server (its client cannot \
                     ask the user, and the server has no channel to give them an approval code)",
                ));
            }
            (Some(_), None) => {
                return Err(denied(
                    "approving needs `approval_code`, the code the pycage server showed the \
                     person; ask the user for it (or deny the call)",
                ));
            }
            (Some(_), Some(_)) => {}
        }
        let Some(Entry { run, .. }) = runs.remove(id) else {
            return Err(gone());
        };
        match (&run.approval_code, code) {
            (Some(expected), Some(given)) if needs_code && !same_code(expected, given) => {
                Err(denied(
                    "that is not the run's approval code: the run is over (a code has one \
                     try); run the code again to ask anew",
                ))
            }
            _ => Ok(run),
        }
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
        self.config.ttl
    }
}

/// `N` bytes from the system's random source, for `what`.
fn random<const N: usize>(what: &str) -> Result<[u8; N], RunError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| {
        RunError::new(
            ErrorKind::BackendError,
            format!("no {what}: the random source failed: {e}"),
        )
    })?;
    Ok(bytes)
}

/// A fresh run id: 128 random bits, hex.
fn new_id() -> Result<String, RunError> {
    let bytes = random::<16>("id for the suspended run")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The symbols of an approval code: Crockford's base32 (no I, L, O or U), read aloud or
/// typed without confusion.
const CODE_SYMBOLS: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A fresh approval code: 10 symbols (50 random bits) as `XXXXX-XXXXX`. Short enough for a
/// person to type into a chat; with one try per run, guessing it is a 2^-50 chance. (Ten
/// lines by hand rather than a base32 crate: the symbols are whole bytes' low 5 bits, not a
/// bit stream, and the dash is ours.)
fn approval_code() -> Result<String, RunError> {
    let bytes = random::<10>("approval code")?;
    let mut code = String::with_capacity(11);
    for (i, b) in bytes.iter().enumerate() {
        if i == 5 {
            code.push('-');
        }
        code.push(char::from(CODE_SYMBOLS[usize::from(b & 31)]));
    }
    Ok(code)
}

/// True when `given` is the code `expected`, as a person may type it: any case, with or
/// without the dash and spaces; compared in constant time.
fn same_code(expected: &str, given: &str) -> bool {
    let normal = |s: &str| -> Vec<u8> {
        s.bytes()
            .filter(|b| !matches!(b, b'-' | b' '))
            .map(|b| b.to_ascii_uppercase())
            .collect()
    };
    bool::from(normal(expected).ct_eq(&normal(given)))
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

    fn run(code_bytes: usize) -> SuspendedRun {
        let mut state = state();
        state.code = "x".repeat(code_bytes);
        SuspendedRun::new(state, Vec::new())
    }

    fn config(max_runs: usize, max_run_bytes: usize, max_total_bytes: usize) -> SuspendedConfig {
        SuspendedConfig {
            ttl: Duration::from_secs(60),
            max_runs,
            max_run_bytes,
            max_total_bytes,
            max_runs_per_client: max_runs,
            max_bytes_per_client: max_total_bytes,
        }
    }

    #[test]
    fn a_kept_run_is_taken_once_and_the_store_is_bounded() {
        let store = SuspendedRuns::new(config(2, 1 << 20, 1 << 20));
        let a = store.keep(run(1)).unwrap();
        let b = store.keep(run(1)).unwrap();
        assert_ne!(a, b);
        assert_eq!(store.keep(run(1)).unwrap_err().kind, ErrorKind::Busy);
        assert!(store.take(&a).is_some());
        assert!(store.take(&a).is_none(), "taken once");
        store.keep(run(1)).unwrap();
        let expired = SuspendedRuns::new(SuspendedConfig {
            ttl: Duration::ZERO,
            ..config(2, 1 << 20, 1 << 20)
        });
        let id = expired.keep(run(1)).unwrap();
        assert!(expired.take(&id).is_none(), "an expired run is gone");
    }

    /// Issue 37, hole 3: bytes are bounded per run and in all, not only runs.
    #[test]
    fn a_run_too_big_to_keep_is_a_tool_call_limit_and_the_total_is_bounded() {
        let store = SuspendedRuns::new(config(100, 10_000, 25_000));
        // At the bound per run, and one byte past it.
        let base = serde_json::to_vec(&run(0).state).unwrap().len();
        let at = store.keep(run(10_000 - base)).unwrap();
        let over = store.keep(run(10_001 - base)).unwrap_err();
        assert_eq!(over.kind, ErrorKind::ToolCallLimit, "{}", over.message);
        assert!(over.message.contains("10000 bytes"), "{}", over.message);
        // 10,000 + 10,000 fit in 25,000; a third does not, until one is taken.
        store.keep(run(10_000 - base)).unwrap();
        let full = store.keep(run(10_000 - base)).unwrap_err();
        assert_eq!(full.kind, ErrorKind::Busy, "{}", full.message);
        assert!(store.take(&at).is_some());
        store.keep(run(10_000 - base)).unwrap();
    }

    /// Issue 37, hole 3: one client cannot take every slot, nor every byte; runs of no
    /// known client count only against the totals.
    #[test]
    fn one_client_keeps_at_most_its_share() {
        let store = SuspendedRuns::new(SuspendedConfig {
            max_runs_per_client: 2,
            max_bytes_per_client: 1 << 20,
            ..config(4, 1 << 20, 4 << 20)
        });
        let of = |client: &str| run(1).for_client(Some(client.into()));
        let first = store.keep(of("a")).unwrap();
        store.keep(of("a")).unwrap();
        let third = store.keep(of("a")).unwrap_err();
        assert_eq!(third.kind, ErrorKind::Busy, "{}", third.message);
        assert!(third.message.contains("this client"), "{}", third.message);
        store.keep(of("b")).unwrap();
        store.keep(run(1)).unwrap();
        // The totals still hold: four kept.
        assert_eq!(store.keep(of("c")).unwrap_err().kind, ErrorKind::Busy);
        // A run taken and resumed frees its client's place.
        let taken = store.take(&first).unwrap();
        assert_eq!(taken.client.as_deref(), Some("a"));
        store.keep(taken).unwrap();
        // Bytes: two runs of 600 KiB do not fit a client's 1 MiB.
        let bytes = SuspendedRuns::new(SuspendedConfig {
            max_runs_per_client: 10,
            max_bytes_per_client: 1 << 20,
            ..config(10, 1 << 20, 8 << 20)
        });
        let big = || run(600 << 10).for_client(Some("a".into()));
        bytes.keep(big()).unwrap();
        assert_eq!(bytes.keep(big()).unwrap_err().kind, ErrorKind::Busy);
        bytes
            .keep(run(600 << 10).for_client(Some("b".into())))
            .unwrap();
    }

    /// Issue 37, hole 4: the model's own `approve` needs the person's code; deny does not.
    #[test]
    fn a_model_approves_only_with_the_persons_code_and_has_one_try() {
        let store = SuspendedRuns::default();
        let approve = Decision::Approve;
        // No code issued: only deny.
        let id = store.keep(run(1)).unwrap();
        let e = store.take_with_code(&id, &approve, Some("x")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied, "{}", e.message);
        store.take_with_code(&id, &Decision::Deny, None).unwrap();
        // A code issued: without it the run waits on; with it (as typed) it is taken.
        let id = store.keep(run(1)).unwrap();
        let code = store.issue_code(&id).unwrap().unwrap();
        assert_eq!(code.len(), 11, "{code}");
        let e = store.take_with_code(&id, &approve, None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        let typed = code.replace('-', " ").to_lowercase();
        store.take_with_code(&id, &approve, Some(&typed)).unwrap();
        // A wrong code ends the run.
        let id = store.keep(run(1)).unwrap();
        let code = store.issue_code(&id).unwrap().unwrap();
        let wrong = if code.starts_with('0') { "1" } else { "0" }.to_owned() + &code[1..];
        let e = store
            .take_with_code(&id, &approve, Some(&wrong))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::CapabilityDenied);
        assert!(store.take_with_code(&id, &approve, Some(&code)).is_err());
        assert_eq!(store.issue_code("nope").unwrap(), None);
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

//! Tool-call journals and suspended runs.
//!
//! A [`Journal`] is what a run's tool calls returned, in order, signed with a host-held
//! [`JournalKey`]. A later run given it ([`RunRequest::replay`](crate::RunRequest::replay))
//! answers matching calls from it without calling the tools; a call that differs from the
//! journal at its position is a divergence, which fails the run (`replay_diverged`) or, when
//! asked, goes live from there.
//!
//! A [`Suspended`] run is one that reached a call needing a person's approval (or whose tool
//! asked to wait): its code, inputs, journal so far and pending call, signed the same way.
//! [`Runner::resume`](crate::Runner::resume) re-executes it deterministically with a
//! [`Decision`] for the pending call.
//!
//! # Security
//!
//! Both are plain JSON a client may keep and hand back, so the host trusts neither until its
//! MAC verifies: HMAC-SHA256 with the runner's key over a canonical form (object keys sorted,
//! so no reordering changes what is signed), with a distinct domain string for each kind of
//! document. A journal cannot forge a tool's result, and a suspended state cannot change the
//! code it resumes or the answer already given to an earlier call.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::InputFile;
use crate::broker::CallError;

/// The format version of journals and suspended states this build writes and reads.
pub const JOURNAL_VERSION: u32 = 1;

const JOURNAL_DOMAIN: &[u8] = b"pycage journal v1\n";
const SUSPENDED_DOMAIN: &[u8] = b"pycage suspended v1\n";

/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The host's secret for signing journals and suspended states. A runner makes a random one
/// unless given one; a key shared by processes (a key file) lets a journal or a suspended
/// run cross between them.
#[derive(Clone)]
pub struct JournalKey(Hmac<Sha256>);

impl fmt::Debug for JournalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JournalKey(..)")
    }
}

impl JournalKey {
    /// A new random key (from the operating system's generator).
    ///
    /// # Errors
    ///
    /// [`JournalError::Key`] when the operating system's random source fails.
    pub fn generate() -> Result<Self, JournalError> {
        Self::from_bytes(&random_bytes()?)
    }

    /// A key of these bytes.
    ///
    /// # Errors
    ///
    /// [`JournalError::Key`] when shorter than [`MIN_KEY_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, JournalError> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(JournalError::Key(format!(
                "a journal key is at least {MIN_KEY_BYTES} bytes; this one is {}",
                bytes.len()
            )));
        }
        <Hmac<Sha256> as Mac>::new_from_slice(bytes)
            .map(JournalKey)
            .map_err(|e| JournalError::Key(format!("an unusable journal key: {e}")))
    }

    /// Where a user's key file lives by default: `journal.key` in pycage's configuration
    /// directory (`~/.config/pycage` on Linux).
    pub fn default_path() -> Option<PathBuf> {
        directories::ProjectDirs::from("", "", "pycage")
            .map(|dirs| dirs.config_dir().join("journal.key"))
    }

    /// The key in the file at `path` (base64url text), made first when there is none: a new
    /// random key written to a file only its owner can read.
    ///
    /// # Errors
    ///
    /// [`JournalError::Key`] when the file cannot be read or written, or holds no valid key.
    pub fn load_or_create(path: &Path) -> Result<Self, JournalError> {
        let shown = path.display();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                check_private(path)?;
                let bytes = URL_SAFE_NO_PAD.decode(text.trim()).map_err(|_| {
                    JournalError::Key(format!("{shown} does not hold a base64url key"))
                })?;
                Self::from_bytes(&bytes)
                    .map_err(|e| JournalError::Key(format!("{shown}: {}", e.message())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let bytes = random_bytes()?;
                write_private(path, &format!("{}\n", URL_SAFE_NO_PAD.encode(bytes)))
                    .map_err(|e| JournalError::Key(format!("cannot write {shown}: {e}")))?;
                Self::from_bytes(&bytes)
            }
            Err(e) => Err(JournalError::Key(format!("cannot read {shown}: {e}"))),
        }
    }

    fn mac(&self, domain: &[u8], document: &Value) -> String {
        URL_SAFE_NO_PAD.encode(self.hmac(domain, document).finalize().into_bytes())
    }

    fn verifies(&self, domain: &[u8], document: &Value, mac: &str) -> bool {
        let Ok(tag) = URL_SAFE_NO_PAD.decode(mac) else {
            return false;
        };
        // `verify_slice` compares in constant time.
        self.hmac(domain, document).verify_slice(&tag).is_ok()
    }

    fn hmac(&self, domain: &[u8], document: &Value) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(domain);
        mac.update(canonical(document).as_bytes());
        mac
    }
}

/// [`MIN_KEY_BYTES`] from the operating system's random source.
fn random_bytes() -> Result<[u8; MIN_KEY_BYTES], JournalError> {
    let mut bytes = [0u8; MIN_KEY_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| JournalError::Key(format!("the random source failed: {e}")))?;
    Ok(bytes)
}

/// Refuses a key file that users other than its owner may read or write (as ssh refuses a
/// private key): anyone who reads it can forge journals and suspended runs.
fn check_private(path: &Path) -> Result<(), JournalError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| JournalError::Key(format!("cannot read {}: {e}", path.display())))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(JournalError::Key(format!(
                "{shown} can be read or written by other users (mode {mode:03o}); anyone who \
                 reads it can forge journals and suspended runs: `chmod 600 {shown}`",
                shown = path.display(),
                mode = mode & 0o777,
            )));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Creates `path` (and its directory) with `text`, readable by its owner only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
}

/// `value` as compact JSON with every object's keys sorted: the form a MAC covers.
fn canonical(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// Why a journal, a suspended state or a key is unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalError {
    /// Not JSON of the expected shape, or of another version.
    Malformed(String),
    /// The MAC does not verify: the document was changed, or signed with another key.
    BadSignature,
    /// The key is unusable, or its file cannot be read or made.
    Key(String),
}

impl JournalError {
    /// The sentence for a person.
    pub fn message(&self) -> String {
        match self {
            JournalError::Malformed(m) | JournalError::Key(m) => m.clone(),
            JournalError::BadSignature => "its signature does not verify: it was changed, or \
                                           signed with another key"
                .into(),
        }
    }
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for JournalError {}

/// How one recorded call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CallOutcome {
    /// The tool's result.
    Ok(Value),
    /// The error the code got.
    Error {
        /// The [`CallError::kind`] (`failed`, `denied`, ...).
        kind: String,
        /// Its message.
        message: String,
    },
}

impl CallOutcome {
    fn of(outcome: &Result<String, CallError>) -> Self {
        match outcome {
            // The broker's own serialization of the tool's value: it parses.
            Ok(text) => CallOutcome::Ok(serde_json::from_str(text).unwrap_or(Value::Null)),
            Err(e) => CallOutcome::Error {
                kind: e.kind().to_owned(),
                message: e.message().to_owned(),
            },
        }
    }

    fn answer(&self) -> Result<String, CallError> {
        match self {
            CallOutcome::Ok(value) => Ok(value.to_string()),
            CallOutcome::Error { kind, message } => Err(CallError::from_kind(kind, message)),
        }
    }
}

/// One executed tool call as a journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalCall {
    /// Its place among the run's executed calls, from 0.
    pub position: u32,
    /// The tool's qualified name (`math.add`).
    pub tool: String,
    /// The arguments, as the broker parsed them.
    pub args: Map<String, Value>,
    /// What the call returned.
    pub outcome: CallOutcome,
}

/// A run's tool calls, signed: what [`RunResult::journal`](crate::RunResult::journal) holds
/// and [`RunRequest::replay`](crate::RunRequest::replay) takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    /// [`JOURNAL_VERSION`].
    pub version: u32,
    /// The BLAKE3 digest (hex) of the code that made the calls. A replay does not require
    /// the same code (an edited program reuses the calls it still makes in the same order).
    pub code_blake3: String,
    /// The deterministic seed of the run, where it had one.
    pub seed: Option<u64>,
    /// The executed calls, by position.
    pub calls: Vec<JournalCall>,
    /// HMAC-SHA256 (base64url) over the rest, with the host's key.
    pub mac: String,
}

impl Journal {
    fn sign(key: &JournalKey, code: &str, seed: Option<u64>, calls: Vec<JournalCall>) -> Self {
        let mut journal = Journal {
            version: JOURNAL_VERSION,
            code_blake3: blake3::hash(code.as_bytes()).to_hex().to_string(),
            seed,
            calls,
            mac: String::new(),
        };
        journal.mac = journal.signature(key);
        journal
    }

    /// A journal read from its JSON text (not yet verified: a runner verifies it against its
    /// key before using it).
    ///
    /// # Errors
    ///
    /// [`JournalError::Malformed`] when it is not a journal of this version.
    pub fn from_json(text: &str) -> Result<Self, JournalError> {
        let journal: Journal = from_json(text, "journal")?;
        check_version(journal.version)?;
        Ok(journal)
    }

    /// Checks the MAC with `key`.
    ///
    /// # Errors
    ///
    /// [`JournalError::BadSignature`] when it does not verify.
    pub fn verify(&self, key: &JournalKey) -> Result<(), JournalError> {
        self.check(key)
    }
}

impl Signed for Journal {
    const DOMAIN: &'static [u8] = JOURNAL_DOMAIN;

    fn version(&self) -> u32 {
        self.version
    }

    fn mac(&self) -> &str {
        &self.mac
    }
}

/// The call a suspended run waits on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingCall {
    /// Its position among the run's executed calls.
    pub position: u32,
    /// The tool's qualified name.
    pub tool: String,
    /// The arguments the code passed.
    pub args: Map<String, Value>,
    /// Why it waits: the policy requires approval of the tool, or the tool's own message.
    pub reason: String,
}

/// A run stopped at a call that waits for a person, signed: everything
/// [`Runner::resume`](crate::Runner::resume) needs to finish it, in this process or another
/// with the same key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suspended {
    /// [`JOURNAL_VERSION`].
    pub version: u32,
    /// A random id (32 hex digits), new for each suspension: what a host records to let the
    /// state resume once (`pycage resume` does). Empty in a state signed without one.
    #[serde(default)]
    pub id: String,
    /// When the run was suspended, in seconds since the Unix epoch (the host's clock): what a
    /// host checks the state's age against. 0 in a state signed without one.
    #[serde(default)]
    pub suspended_at: u64,
    /// The code.
    pub code: String,
    /// Its initial global variables.
    pub vars: Map<String, Value>,
    /// Its input files.
    #[serde(default)]
    pub files: Vec<InputFile>,
    /// The deterministic seed it ran with (`None`: the backend was not deterministic, and a
    /// resume may diverge).
    pub seed: Option<u64>,
    /// The calls executed before the pending one.
    pub calls: Vec<JournalCall>,
    /// The call waiting for a decision.
    pub pending: PendingCall,
    /// The tools the run exposed (qualified names): a resume needs them all.
    #[serde(default)]
    pub tools: Vec<String>,
    /// The tools whose calls needed approval in the run's policy (qualified names): they
    /// still do when it resumes, whatever the resuming runner's policy.
    #[serde(default)]
    pub approve: Vec<String>,
    /// The limits the run's request set (`None`: the runner's): a resume runs within them,
    /// not within the resuming runner's, so approving a call does not lift them.
    #[serde(default)]
    pub limits: Option<crate::Limits>,
    /// HMAC-SHA256 (base64url) over the rest, with the host's key.
    pub mac: String,
}

impl Suspended {
    /// `state` signed by `key`, stamped with a new [`id`](Self::id) and the time now.
    pub(crate) fn sign(key: &JournalKey, mut state: Suspended) -> Self {
        state.version = JOURNAL_VERSION;
        let mut id = [0u8; 16];
        // Without a random source the state has no id, and a host that resumes each state
        // once refuses it (saying so) rather than taking a guessable one.
        state.id = match getrandom::fill(&mut id) {
            Ok(()) => id.iter().map(|b| format!("{b:02x}")).collect(),
            Err(_) => String::new(),
        };
        state.suspended_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        state.mac = state.signature(key);
        state
    }

    /// A suspended state read from JSON text: either the state itself or a whole
    /// [`RunResult`](crate::RunResult) that holds one under `suspended` (not yet verified).
    ///
    /// # Errors
    ///
    /// [`JournalError::Malformed`] when it is neither, or of another version.
    pub fn from_json(text: &str) -> Result<Self, JournalError> {
        let value: Value = from_json(text, "suspended run")?;
        let state = match value {
            Value::Object(mut result) if result.contains_key("ok") => {
                match result.remove("suspended") {
                    Some(state @ Value::Object(_)) => state,
                    _ => {
                        return Err(JournalError::Malformed(
                            "this run result is not suspended: it has no `suspended` state".into(),
                        ));
                    }
                }
            }
            other => other,
        };
        let state: Suspended = serde_json::from_value(state)
            .map_err(|e| JournalError::Malformed(format!("not a suspended run: {e}")))?;
        check_version(state.version)?;
        Ok(state)
    }

    /// Checks the MAC with `key`.
    ///
    /// # Errors
    ///
    /// [`JournalError::BadSignature`] when it does not verify.
    pub fn verify(&self, key: &JournalKey) -> Result<(), JournalError> {
        self.check(key)
    }
}

impl Signed for Suspended {
    const DOMAIN: &'static [u8] = SUSPENDED_DOMAIN;

    fn version(&self) -> u32 {
        self.version
    }

    fn mac(&self) -> &str {
        &self.mac
    }
}

/// A document signed by a [`JournalKey`]: its `mac` covers the rest of its JSON, under a
/// domain string of its kind (so one kind's MAC never verifies another).
trait Signed: Serialize {
    const DOMAIN: &'static [u8];

    fn version(&self) -> u32;

    fn mac(&self) -> &str;

    /// The document's JSON without its `mac`: what the MAC covers.
    fn unsigned(&self) -> Value {
        // Plain structs with string keys: serializing cannot fail.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        value.as_object_mut().map(|o| o.remove("mac"));
        value
    }

    /// The MAC `key` gives the document.
    fn signature(&self, key: &JournalKey) -> String {
        key.mac(Self::DOMAIN, &self.unsigned())
    }

    /// Checks the version and the MAC.
    fn check(&self, key: &JournalKey) -> Result<(), JournalError> {
        check_version(self.version())?;
        if key.verifies(Self::DOMAIN, &self.unsigned(), self.mac()) {
            Ok(())
        } else {
            Err(JournalError::BadSignature)
        }
    }
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, JournalError> {
    serde_json::from_str(text).map_err(|e| JournalError::Malformed(format!("not a {what}: {e}")))
}

fn check_version(version: u32) -> Result<(), JournalError> {
    if version == JOURNAL_VERSION {
        Ok(())
    } else {
        Err(JournalError::Malformed(format!(
            "version {version}; this build reads version {JOURNAL_VERSION}"
        )))
    }
}

/// What a resume does with the pending call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// The tool runs now, and the code gets its result.
    Approve,
    /// The tool does not run; the code gets a `ToolError` of kind `denied`.
    Deny,
    /// The tool does not run; the code gets this value as its result.
    Answer(Value),
}

/// What a replay does when a call differs from the journal at its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnDivergence {
    /// The run fails with `replay_diverged`, naming both calls (the default).
    #[default]
    Fail,
    /// That call and every later one go to the live tools.
    GoLive,
}

/// Why a run with a journal stopped early.
#[derive(Debug, Clone)]
pub(crate) enum Halt {
    /// It reached a call that waits for a person.
    Suspended(PendingCall),
    /// A call differed from the journal being replayed; the message names both.
    Diverged(String),
}

/// What the broker does with one admitted call.
#[derive(Debug)]
pub(crate) enum Step {
    /// Answer it with this, without calling the tool (already recorded).
    Answer(Result<String, CallError>),
    /// Call the tool, then [`CallJournal::record`] the outcome at `position`.
    Call { position: u32 },
    /// The run stops here; see [`CallJournal::halt`].
    Halt,
}

/// The journal of one run in progress: the calls it replays, the decision it resumes with,
/// and the calls it has made.
#[derive(Debug)]
pub(crate) struct CallJournal {
    state: Mutex<JournalState>,
}

#[derive(Debug)]
struct JournalState {
    replay: Vec<JournalCall>,
    decision: Option<(PendingCall, Decision)>,
    on_divergence: OnDivergence,
    /// Tools whose calls need approval beyond the policy's (those of a resumed run's).
    approve: Vec<String>,
    /// Set once a divergence sent the run to the live tools.
    live: bool,
    next: u32,
    recorded: Vec<Recorded>,
    halt: Option<Halt>,
}

/// A call as the run made it. A live one becomes a [`JournalCall`] only when the journal is
/// read: parsing each result back into JSON on the call's path showed in the profile of
/// `tool_call_x1000` (`benches/hot_paths.rs`); keeping its text is a copy.
#[derive(Debug)]
enum Recorded {
    /// Answered from the journal it replays: the entry as it was.
    Replayed(JournalCall),
    /// Made now (or answered by a decision).
    Live {
        position: u32,
        tool: String,
        args: Map<String, Value>,
        outcome: Result<String, CallError>,
    },
}

impl Recorded {
    fn position(&self) -> u32 {
        match self {
            Recorded::Replayed(call) => call.position,
            Recorded::Live { position, .. } => *position,
        }
    }

    fn to_call(&self) -> JournalCall {
        match self {
            Recorded::Replayed(call) => call.clone(),
            Recorded::Live {
                position,
                tool,
                args,
                outcome,
            } => JournalCall {
                position: *position,
                tool: tool.clone(),
                args: args.clone(),
                outcome: CallOutcome::of(outcome),
            },
        }
    }
}

impl CallJournal {
    /// A journal that replays `replay`, then applies `decision` at the pending call's
    /// position; calls of `approve`'s tools need approval too.
    pub(crate) fn new(
        replay: Vec<JournalCall>,
        decision: Option<(PendingCall, Decision)>,
        on_divergence: OnDivergence,
        approve: Vec<String>,
    ) -> Self {
        CallJournal {
            state: Mutex::new(JournalState {
                replay,
                decision,
                on_divergence,
                approve,
                live: false,
                next: 0,
                recorded: Vec::new(),
                halt: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JournalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next position for a call of `tool` with `args`, admitted by the ceiling.
    pub(crate) fn begin(
        &self,
        tool: &str,
        args: &Map<String, Value>,
        needs_approval: bool,
    ) -> Step {
        let mut state = self.lock();
        if state.halt.is_some() {
            return Step::Halt;
        }
        let position = state.next;
        state.next += 1;
        if !state.live
            && let Some(step) = state.replayed(position, tool, args)
        {
            return step;
        }
        if needs_approval || state.approve.iter().any(|t| t == tool) {
            let reason = format!("`{tool}` needs a person's approval");
            state.suspend(position, tool, args, reason);
            return Step::Halt;
        }
        Step::Call { position }
    }

    /// Records a live call's outcome.
    pub(crate) fn record(
        &self,
        position: u32,
        tool: String,
        args: Map<String, Value>,
        outcome: &Result<String, CallError>,
    ) {
        self.lock().record(position, tool, args, outcome);
    }

    /// The tool at `position` asked the run to wait: it stops there.
    pub(crate) fn tool_suspended(
        &self,
        position: u32,
        tool: &str,
        args: &Map<String, Value>,
        reason: &str,
    ) {
        let mut state = self.lock();
        if state.halt.is_none() {
            state.suspend(position, tool, args, reason.to_owned());
        }
    }

    /// Why the run stopped early, if it did.
    pub(crate) fn halt(&self) -> Option<Halt> {
        self.lock().halt.clone()
    }

    /// The tools this journal gates beyond the policy.
    pub(crate) fn extra_approvals(&self) -> Vec<String> {
        self.lock().approve.clone()
    }

    /// True once the run stopped early.
    pub(crate) fn halted(&self) -> bool {
        self.lock().halt.is_some()
    }

    /// The calls made so far, by position (a halted call is not among them).
    pub(crate) fn calls(&self) -> Vec<JournalCall> {
        let state = self.lock();
        let mut recorded: Vec<&Recorded> = state.recorded.iter().collect();
        recorded.sort_by_key(|c| c.position());
        recorded.into_iter().map(Recorded::to_call).collect()
    }

    /// The calls so far, signed with `key`, as the journal of a run of `code`.
    pub(crate) fn signed(&self, key: &JournalKey, code: &str, seed: Option<u64>) -> Journal {
        Journal::sign(key, code, seed, self.calls())
    }
}

impl JournalState {
    fn record(
        &mut self,
        position: u32,
        tool: String,
        args: Map<String, Value>,
        outcome: &Result<String, CallError>,
    ) {
        self.recorded.push(Recorded::Live {
            position,
            tool,
            args,
            outcome: outcome.clone(),
        });
    }

    /// The run stops at the call at `position`, which waits for a person.
    fn suspend(&mut self, position: u32, tool: &str, args: &Map<String, Value>, reason: String) {
        self.halt = Some(Halt::Suspended(PendingCall {
            position,
            tool: tool.to_owned(),
            args: args.clone(),
            reason,
        }));
    }

    /// The step for the call at `position` while the run still follows its journal: `None`
    /// when it is past the journal (or just went live), so the call is live.
    fn replayed(&mut self, position: u32, tool: &str, args: &Map<String, Value>) -> Option<Step> {
        let index = position as usize;
        let expected = if let Some(entry) = self.replay.get(index) {
            if entry.tool == tool && entry.args == *args {
                let entry = entry.clone();
                let answer = entry.outcome.answer();
                self.recorded.push(Recorded::Replayed(entry));
                return Some(Step::Answer(answer));
            }
            describe_call(&entry.tool, &entry.args)
        } else {
            if index != self.replay.len() {
                return None;
            }
            let (pending, decision) = self.decision.take()?;
            if pending.tool == tool && pending.args == *args {
                let answer = match decision {
                    Decision::Approve => return Some(Step::Call { position }),
                    Decision::Deny => Err(CallError::Denied(format!(
                        "a person denied this call of `{tool}`"
                    ))),
                    Decision::Answer(value) => Ok(value.to_string()),
                };
                self.record(position, tool.to_owned(), args.clone(), &answer);
                return Some(Step::Answer(answer));
            }
            describe_call(&pending.tool, &pending.args)
        };
        match self.on_divergence {
            OnDivergence::GoLive => {
                self.live = true;
                None
            }
            OnDivergence::Fail => {
                self.halt = Some(Halt::Diverged(format!(
                    "tool call {position} differs from the journal: the code called {}, the \
                     journal has {expected}",
                    describe_call(tool, args)
                )));
                Some(Step::Halt)
            }
        }
    }
}

/// `tool(args)` for a message, the arguments cut to 200 characters.
fn describe_call(tool: &str, args: &Map<String, Value>) -> String {
    let args = Value::Object(args.clone()).to_string();
    format!("`{tool}` with {}", crate::result::cap_chars(&args, 200))
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;

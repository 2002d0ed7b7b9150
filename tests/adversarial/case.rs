//! The corpus format: one TOML file per category, one `[[case]]` table per case.
//!
//! ```toml
//! [[case]]
//! name = "subclasses walk"           # required
//! code = '''...'''                   # required; @PLACEHOLDERS@ are filled by the harness
//! expect = "any"                     # ok | fail | any | an error kind | ["kind", "kind"]
//! exception = "PermissionError"      # optional: the uncaught exception's type
//! message_contains = "..."           # optional
//! value = 42                         # optional: the exact return value
//! output_max = 2048                  # optional: bytes of stdout and of stderr
//! message_max = 20000                # optional: bytes of error message + traceback
//! tool_calls = 100                   # optional: exact count of executed calls
//! timeout = "1s"                     # optional limits (defaults: 5s, 256MiB, 64KiB, 100)
//! memory = "256MiB"
//! max_output = "1KiB"
//! max_tool_calls = 100
//! max_value = "1MiB"
//! fuel = 1000000
//! max_written = "1MiB"               # optional file budgets (defaults: the library's)
//! max_files = 100
//! max_file = "1MiB"
//! files = { "in.txt" = "text" }      # optional input files, path = contents
//! allow = ["math.add"]               # optional: tools to expose (default: namespace math)
//! then = ["...code..."]              # optional: follow-up runs; the last one is checked
//! session = true                     # optional: `code` and `then` run in one session (only
//!                                    #   on backends that keep sessions); the canaries are
//!                                    #   checked after every run
//! next_session = true                # optional, with `session`: `then` runs in a second,
//!                                    #   fresh session (what the first left must be absent)
//! backends = ["wasm"]                # optional: only on these backends
//! native = "same"                    # optional: what native-CPython backends must show:
//!                                    #   "same" (every check above), or an `expect` value
//!                                    #   (default "any": only the shared invariants and caps)
//! ```
//!
//! `expect`, `exception`, `message_contains` and `value` describe the wasm guest (and the
//! layered backend, which runs the same guest). Native CPython in an OS sandbox has fork,
//! sockets and a real file system *inside* its sandbox, so those cases check it through the
//! invariants unless `native` says more. Caps (`output_max`, `message_max`, `tool_calls`) and
//! the invariants apply to every backend.
//!
//! Placeholders: `@CANARY_FILE@`, `@CANARY_DIR@`, `@MARKER@`, `@TCP_PORT@`, `@UDP_PORT@`,
//! `@UNIX_SOCKET@`, `@ENV_NAME@`. The TCP canary listens on `@TCP_PORT@` at 127.0.0.1 and, where
//! the host has IPv6, at ::1.

use std::path::Path;
use std::time::Duration;

use pycage::{ErrorKind, Limits};
use pycage_tools::units::{parse_duration, parse_size};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    Ok,
    Fail,
    Any,
    Kind(ErrorKind),
    OneOf(Vec<ErrorKind>),
}

#[derive(Debug)]
pub struct Case {
    pub category: String,
    pub name: String,
    pub code: String,
    pub expect: Expect,
    pub exception: Option<String>,
    pub message_contains: Option<String>,
    pub value: Option<Value>,
    pub output_max: Option<usize>,
    pub message_max: Option<usize>,
    pub tool_calls: Option<u32>,
    pub limits: Limits,
    pub allow: Vec<String>,
    pub then: Vec<String>,
    pub session: bool,
    pub next_session: bool,
    pub files: Vec<pycage::InputFile>,
    backends: Vec<String>,
    native: Native,
}

/// What a native-CPython backend must show.
#[derive(Debug, Clone, PartialEq)]
enum Native {
    /// The same as the wasm guest.
    Same,
    /// Only this outcome (plus caps and invariants).
    Expect(Expect),
}

impl Case {
    pub fn runs_on(&self, backend: &str) -> bool {
        self.backends.is_empty() || self.backends.iter().any(|b| b == backend)
    }

    /// The outcome expected on `backend`, and whether the wasm-specific details (exception,
    /// message, value) apply there too.
    pub fn expectation(&self, native_backend: bool) -> (&Expect, bool) {
        match (&self.native, native_backend) {
            (_, false) | (Native::Same, true) => (&self.expect, true),
            (Native::Expect(e), true) => (e, false),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    case: Vec<RawCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    code: String,
    expect: toml::Value,
    exception: Option<String>,
    message_contains: Option<String>,
    value: Option<toml::Value>,
    output_max: Option<usize>,
    message_max: Option<usize>,
    tool_calls: Option<u32>,
    timeout: Option<String>,
    memory: Option<String>,
    max_output: Option<String>,
    max_tool_calls: Option<u32>,
    max_value: Option<String>,
    fuel: Option<u64>,
    max_written: Option<String>,
    max_files: Option<u32>,
    max_file: Option<String>,
    #[serde(default)]
    files: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    then: Vec<String>,
    #[serde(default)]
    session: bool,
    #[serde(default)]
    next_session: bool,
    #[serde(default)]
    backends: Vec<String>,
    native: Option<toml::Value>,
}

/// Every case of every corpus file, in file order.
pub fn load_corpus() -> Result<Vec<Case>, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/adversarial/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let category = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: File = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if file.case.len() < 5 {
            return Err(format!("{category}: a category needs at least five cases"));
        }
        for raw in file.case {
            let name = raw.name.clone();
            cases.push(convert(&category, raw).map_err(|e| format!("{category}/{name}: {e}"))?);
        }
    }
    Ok(cases)
}

fn convert(category: &str, raw: RawCase) -> Result<Case, String> {
    let mut limits = Limits::builder().wall_timeout(Duration::from_secs(5));
    if let Some(t) = &raw.timeout {
        limits = limits.wall_timeout(parse_duration(t).map_err(|e| e.to_string())?);
    }
    if let Some(m) = &raw.memory {
        limits = limits.memory_bytes(parse_size(m).map_err(|e| e.to_string())?);
    }
    if let Some(o) = &raw.max_output {
        limits = limits.max_output_bytes(parse_size(o).map_err(|e| e.to_string())?);
    }
    if let Some(n) = raw.max_tool_calls {
        limits = limits.max_tool_calls(n);
    }
    if let Some(v) = &raw.max_value {
        limits = limits.max_value_bytes(parse_size(v).map_err(|e| e.to_string())?);
    }
    if raw.fuel.is_some() {
        limits = limits.fuel(raw.fuel);
    }
    if let Some(w) = &raw.max_written {
        limits = limits.max_written_bytes(parse_size(w).map_err(|e| e.to_string())?);
    }
    if let Some(n) = raw.max_files {
        limits = limits.max_files(n);
    }
    if let Some(f) = &raw.max_file {
        limits = limits.max_file_bytes(parse_size(f).map_err(|e| e.to_string())?);
    }
    if raw.next_session && !raw.session {
        return Err("`next_session` needs `session = true`".into());
    }
    Ok(Case {
        category: category.to_owned(),
        name: raw.name,
        code: raw.code,
        expect: expect(&raw.expect)?,
        exception: raw.exception,
        message_contains: raw.message_contains,
        value: raw
            .value
            .map(|v| serde_json::to_value(v).map_err(|e| e.to_string()))
            .transpose()?,
        output_max: raw.output_max,
        message_max: raw.message_max,
        tool_calls: raw.tool_calls,
        limits: limits.build().map_err(|e| e.to_string())?,
        allow: raw.allow,
        then: raw.then,
        session: raw.session,
        next_session: raw.next_session,
        files: raw
            .files
            .into_iter()
            .map(|(path, text)| pycage::InputFile::new(path, text.into_bytes()))
            .collect(),
        backends: raw.backends,
        native: match &raw.native {
            None => Native::Expect(Expect::Any),
            Some(toml::Value::String(s)) if s == "same" => Native::Same,
            Some(v) => Native::Expect(expect(v)?),
        },
    })
}

fn expect(v: &toml::Value) -> Result<Expect, String> {
    let kind = |s: &str| -> Result<ErrorKind, String> {
        serde_json::from_value(Value::String(s.to_owned()))
            .map_err(|_| format!("unknown expect `{s}`"))
    };
    match v {
        toml::Value::String(s) => match s.as_str() {
            "ok" => Ok(Expect::Ok),
            "fail" => Ok(Expect::Fail),
            "any" => Ok(Expect::Any),
            other => kind(other).map(Expect::Kind),
        },
        toml::Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .ok_or("expect lists hold strings".to_owned())
                    .and_then(kind)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Expect::OneOf),
        _ => Err("expect is a string or a list of strings".into()),
    }
}

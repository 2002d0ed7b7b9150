//! Loading command tools from TOML. The format is described in the parent module.
//!
//! The whole file is read through one derived [`File`]: serde rejects an unknown key at every
//! level and toml gives each error its position. Which tool an error is in, which toml does
//! not say, is looked up in an outline of the document on the error path ([`describe`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use toml::de::{DeTable, DeValue};

use super::{CommandTool, DEFAULT_TIMEOUT};
use crate::units::parse_duration;
use crate::{RegistryError, ToolRegistry};

/// A tools file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, deserialize_with = "tool_tables")]
    tool: Vec<ToolEntry>,
}

/// One `[[tool]]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a `[[tool]]` table")]
struct ToolEntry {
    name: String,
    namespace: String,
    description: String,
    command: Vec<String>,
    #[serde(default = "default_timeout", deserialize_with = "timeout")]
    timeout: Duration,
    #[serde(default)]
    expose_stderr: bool,
    #[serde(default)]
    pass_env: Vec<String>,
    #[serde(default = "object_schema", deserialize_with = "parameters")]
    parameters: Value,
}

/// Loads the command tools declared in the TOML file at `path`.
///
/// A relative `command[0]` that contains a `/` (such as `./tool.py` or `bin/tool`) is
/// resolved against the directory holding the file, so a tools file can ship its scripts
/// next to it. A bare program name (`python3`) is looked up on `PATH` when the tool runs.
///
/// # Errors
///
/// [`RegistryError::Config`] naming the file when it cannot be read or is not a valid tools
/// file (including any unknown key); [`RegistryError::InvalidName`] for a bad tool name;
/// [`RegistryError::Duplicate`] when a tool is declared twice.
pub fn load_file(path: &Path) -> Result<ToolRegistry, RegistryError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|err| RegistryError::Config(format!("{origin}: cannot read tools file: {err}")))?;
    let base = std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| {
            RegistryError::Config(format!("{origin}: cannot find the file's directory"))
        })?;
    parse(&text, &origin, Some(&base))
}

/// Parses command tools from TOML `text`; `origin` (usually a file name) prefixes every
/// error message.
///
/// Relative command paths are kept as written and so resolve against the working directory
/// of the process when a tool runs; prefer [`load_file`] or absolute paths.
///
/// ```
/// let tools = pycage_tools::command::parse_toml(r#"
///     [[tool]]
///     name = "today"
///     namespace = "clock"
///     description = "Says the date."
///     command = ["/bin/date", "+{\"date\": \"%F\"}"]
///     timeout = "2s"
/// "#, "inline")?;
/// assert!(tools.get("clock", "today").is_some());
/// # Ok::<(), pycage_tools::RegistryError>(())
/// ```
///
/// # Errors
///
/// As for [`load_file`], except that nothing is read.
pub fn parse_toml(text: &str, origin: &str) -> Result<ToolRegistry, RegistryError> {
    parse(text, origin, None)
}

fn parse(text: &str, origin: &str, base: Option<&Path>) -> Result<ToolRegistry, RegistryError> {
    let config = |message: String| RegistryError::Config(format!("{origin}: {message}"));
    let file: File = toml::from_str(text).map_err(|err| config(describe(text, &err)))?;
    let mut registry = ToolRegistry::new();
    for (index, entry) in file.tool.into_iter().enumerate() {
        let context = tool_context(index, Some(&entry.name));
        let tool = build_tool(entry, base).map_err(|m| config(format!("{context}: {m}")))?;
        registry
            .register(tool)
            .map_err(|err| with_context(err, origin, &context))?;
    }
    Ok(registry)
}

fn build_tool(entry: ToolEntry, base: Option<&Path>) -> Result<CommandTool, String> {
    let argv = resolve_program(entry.command, base)?;
    let tool = CommandTool::new(entry.namespace, entry.name, entry.description, argv)
        .map_err(|_| "`command` must be a non-empty list whose first item names a program")?;
    Ok(tool
        .with_timeout(entry.timeout)
        .with_parameters(entry.parameters)
        .with_expose_stderr(entry.expose_stderr)
        .with_pass_env(entry.pass_env))
}

/// `tool #N` (1-based) and, when it has a `name`, `` (`name`) ``.
fn tool_context(index: usize, name: Option<&str>) -> String {
    let number = index + 1;
    match name {
        Some(name) => format!("tool #{number} (`{name}`)"),
        None => format!("tool #{number}"),
    }
}

/// Adds where the tool came from to a registration error that lacks it.
fn with_context(err: RegistryError, origin: &str, context: &str) -> RegistryError {
    match err {
        RegistryError::InvalidName(m) => {
            RegistryError::InvalidName(format!("{m} ({origin}: {context})"))
        }
        other => other,
    }
}

/// One line for a toml error: `line L, column C: `, then `tool #N (`name`): ` when the
/// error is inside a tool, then toml's message.
fn describe(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim();
    let Some(start) = err.span().map(|span| span.start) else {
        return message.to_owned();
    };
    let position = position(text, start);
    // A syntax error leaves no document to outline.
    let Ok(document) = DeTable::parse(text) else {
        return format!("{position}: {message}");
    };
    let document = document.into_inner();
    // Kept by hand, this wording only: the derive rejects an unknown top-level key, but as
    // it words every unknown field ("unknown field `version`, expected `tool`", measured with
    // toml 0.9.12 and serde 1.0.229). That text comes from serde's default
    // `de::Error::unknown_field`, which toml's error does not override and no derive
    // attribute changes; the file's own tests pin "unknown top-level key `version`".
    let top_level = document
        .keys()
        .find(|key| key.get_ref() != "tool" && key.span().contains(&start));
    if let Some(key) = top_level {
        return format!(
            "{position}: unknown top-level key `{}` (expected `[[tool]]` tables)",
            key.get_ref()
        );
    }
    match tool_at(&document, start) {
        Some(context) => format!("{position}: {context}: {message}"),
        None => format!("{position}: {message}"),
    }
}

/// The context of the tool whose text holds `offset`: the last one starting at or before it
/// (a `[[tool]]` header, or an inline table, opens each tool; nothing of a tool precedes it).
fn tool_at(document: &DeTable<'_>, offset: usize) -> Option<String> {
    let DeValue::Array(tools) = document.get("tool")?.get_ref() else {
        return None;
    };
    let index = tools.iter().rposition(|tool| tool.span().start <= offset)?;
    let name = tools[index]
        .get_ref()
        .get("name")
        .and_then(|name| name.get_ref().as_str());
    Some(tool_context(index, name))
}

/// `line L, column C` (1-based, columns in characters) of byte `offset` in `text`.
fn position(text: &str, offset: usize) -> String {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

/// `tool` as `[[tool]]` tables. A visitor only for its `expecting` text: through `Vec`'s own
/// impl, `[tool]` or `tool = 5` read "invalid type: map, expected a sequence", which does not
/// say how tools are written (the file's tests pin `` `[[tool]]` `` in that message).
fn tool_tables<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ToolEntry>, D::Error> {
    struct Tables;

    impl<'de> Visitor<'de> for Tables {
        type Value = Vec<ToolEntry>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("`[[tool]]` tables")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut tools = Vec::new();
            while let Some(tool) = seq.next_element()? {
                tools.push(tool);
            }
            Ok(tools)
        }
    }

    deserializer.deserialize_seq(Tables)
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn timeout<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    let timeout =
        parse_duration(&text).map_err(|err| de::Error::custom(format!("`timeout`: {err}")))?;
    if timeout.is_zero() {
        return Err(de::Error::custom(format!(
            "`timeout` must be greater than zero, not `{text}`"
        )));
    }
    Ok(timeout)
}

fn object_schema() -> Value {
    serde_json::json!({ "type": "object" })
}

/// The `parameters` schema as JSON; it must describe an object.
fn parameters<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    let schema = toml_to_json(toml::Value::deserialize(deserializer)?)
        .map_err(|m| de::Error::custom(format!("`parameters`: {m}")))?;
    match schema.get("type") {
        Some(Value::String(t)) if t == "object" => Ok(schema),
        _ => Err(de::Error::custom(
            "`parameters` must be a table with `type = \"object\"`",
        )),
    }
}

/// Resolves a relative `command[0]` containing a `/` against `base`, when there is one.
pub(super) fn resolve_program(
    mut argv: Vec<String>,
    base: Option<&Path>,
) -> Result<Vec<String>, String> {
    let (Some(program), Some(base)) = (argv.first_mut(), base) else {
        return Ok(argv);
    };
    let path = Path::new(program.as_str());
    if path.is_absolute() || !program.contains('/') {
        return Ok(argv);
    }
    let resolved: PathBuf = base.join(path);
    *program = resolved
        .into_os_string()
        .into_string()
        .map_err(|_| "the tools file's directory is not valid UTF-8".to_owned())?;
    Ok(argv)
}

fn toml_to_json(value: toml::Value) -> Result<Value, String> {
    Ok(match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| format!("`{f}` is not a JSON number"))?,
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(toml_to_json)
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| Ok((k, toml_to_json(v)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
    })
}

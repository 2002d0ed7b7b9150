//! Loading command tools from TOML. The format is described in the parent module.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::{CommandTool, DEFAULT_TIMEOUT};
use crate::units::parse_duration;
use crate::{RegistryError, ToolRegistry};

/// One `[[tool]]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEntry {
    name: String,
    namespace: String,
    description: String,
    command: Vec<String>,
    timeout: Option<String>,
    #[serde(default)]
    expose_stderr: bool,
    parameters: Option<toml::Value>,
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
    let document: toml::Table =
        toml::from_str(text).map_err(|err| config(syntax_error(text, &err)))?;
    let mut registry = ToolRegistry::new();
    for (key, value) in document {
        if key != "tool" {
            return Err(config(format!(
                "unknown top-level key `{key}` (expected `[[tool]]` tables)"
            )));
        }
        let toml::Value::Array(entries) = value else {
            return Err(config("`tool` must be written as `[[tool]]` tables".into()));
        };
        for (index, entry) in entries.into_iter().enumerate() {
            let toml::Value::Table(table) = entry else {
                return Err(config("`tool` must be written as `[[tool]]` tables".into()));
            };
            let context = entry_context(index, &table);
            let tool = build_tool(table, base).map_err(|m| config(format!("{context}: {m}")))?;
            registry
                .register(tool)
                .map_err(|err| with_context(err, origin, &context))?;
        }
    }
    Ok(registry)
}

/// `tool #N` (1-based) and, when it has a string `name`, `` (`name`) ``.
fn entry_context(index: usize, table: &toml::Table) -> String {
    let number = index + 1;
    match table.get("name").and_then(toml::Value::as_str) {
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

/// `line L, column C: message` for a TOML error.
fn syntax_error(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim();
    let Some(start) = err.span().map(|span| span.start) else {
        return message.to_owned();
    };
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

fn build_tool(table: toml::Table, base: Option<&Path>) -> Result<CommandTool, String> {
    let entry: ToolEntry = table
        .try_into()
        .map_err(|err| err.message().trim().to_owned())?;
    let timeout = match &entry.timeout {
        Some(text) => parse_timeout(text)?,
        None => DEFAULT_TIMEOUT,
    };
    let parameters = match entry.parameters {
        Some(schema) => parse_parameters(schema)?,
        None => serde_json::json!({ "type": "object" }),
    };
    let argv = resolve_program(entry.command, base)?;
    let tool = CommandTool::new(entry.namespace, entry.name, entry.description, argv)
        .map_err(|_| "`command` must be a non-empty list whose first item names a program")?;
    Ok(tool
        .with_timeout(timeout)
        .with_parameters(parameters)
        .with_expose_stderr(entry.expose_stderr))
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text).map_err(|err| format!("`timeout`: {err}"))?;
    if timeout.is_zero() {
        return Err(format!("`timeout` must be greater than zero, not `{text}`"));
    }
    Ok(timeout)
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

/// Converts the `parameters` schema to JSON; it must describe an object.
fn parse_parameters(schema: toml::Value) -> Result<Value, String> {
    let schema = toml_to_json(schema).map_err(|m| format!("`parameters`: {m}"))?;
    match schema.get("type") {
        Some(Value::String(t)) if t == "object" => Ok(schema),
        _ => Err("`parameters` must be a table with `type = \"object\"`".to_owned()),
    }
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

//! A tool's JSON schema as a Python signature: `async def add(*, a: float | str, b: float | str)`.
//!
//! The guest defines each tool as `async def tool(**kwargs)`, so every parameter is
//! keyword-only; an optional one is written with `= ...`, as in a stub file.

use serde_json::Value;

/// How deep a parameter's type is followed (`list[list[...]]`); deeper is `Any`.
const MAX_TYPE_DEPTH: usize = 4;

/// One parameter of a tool, from its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parameter {
    pub name: String,
    pub annotation: String,
    pub required: bool,
    pub description: Option<String>,
}

/// The parameters `schema` declares (an object schema's `properties`, in their order).
pub(crate) fn parameters(schema: &Value) -> Vec<Parameter> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    properties
        .iter()
        .map(|(name, property)| Parameter {
            name: name.clone(),
            annotation: annotation(property, 0),
            required: required.contains(&name.as_str()),
            description: property
                .get("description")
                .and_then(Value::as_str)
                .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" ")),
        })
        .collect()
}

/// `async def name(*, a: int, b: str = ...)`; `**kwargs` when the schema declares no
/// properties.
pub(crate) fn signature(name: &str, schema: &Value) -> String {
    let params = parameters(schema);
    if params.is_empty() {
        return format!("async def {name}(**kwargs)");
    }
    let list: Vec<String> = params
        .iter()
        .map(|p| {
            let default = if p.required { "" } else { " = ..." };
            format!("{}: {}{default}", p.name, p.annotation)
        })
        .collect();
    format!("async def {name}(*, {})", list.join(", "))
}

/// The Python annotation of one JSON schema.
fn annotation(schema: &Value, depth: usize) -> String {
    if depth >= MAX_TYPE_DEPTH {
        return "Any".into();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let items: Vec<String> = values.iter().map(literal).collect();
        return format!("Literal[{}]", items.join(", "));
    }
    if let Some(value) = schema.get("const") {
        return format!("Literal[{}]", literal(value));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            return union(options.iter().map(|o| annotation(o, depth + 1)));
        }
    }
    match schema.get("type") {
        Some(Value::String(t)) => type_name(t, schema, depth),
        Some(Value::Array(types)) => union(
            types
                .iter()
                .filter_map(Value::as_str)
                .map(|t| type_name(t, schema, depth)),
        ),
        _ => "Any".into(),
    }
}

fn type_name(json_type: &str, schema: &Value, depth: usize) -> String {
    match json_type {
        "string" => "str".into(),
        "integer" => "int".into(),
        "number" => "float".into(),
        "boolean" => "bool".into(),
        "null" => "None".into(),
        "array" => match schema.get("items") {
            Some(items) if items.is_object() => format!("list[{}]", annotation(items, depth + 1)),
            _ => "list".into(),
        },
        "object" => "dict".into(),
        _ => "Any".into(),
    }
}

/// `a | b`, each once, in order; `Any` for none.
fn union(parts: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for part in parts {
        if !seen.contains(&part) {
            seen.push(part);
        }
    }
    if seen.is_empty() {
        "Any".into()
    } else {
        seen.join(" | ")
    }
}

/// A JSON value as a Python literal.
fn literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        other => other.to_string(),
    }
}

//! The limits a call or a session asks for, taken within the server's maxima.
//!
//! A run or a session may name limits in its input (`limits`): the library's `Limits` field
//! names (`wall_timeout: "5s"`, `memory_bytes`, `max_tool_calls`, ...) and two plain-number
//! spellings, `timeout_seconds` and `memory_mib`, on both servers; what it leaves out is the
//! server's default. A value above the server's maximum is lowered to it, and the reply says
//! so; a value of the wrong type or out of range is an error naming the field, never
//! ignored.

use std::time::Duration;

use pycage::{Limits, LimitsBuilder};
use serde::Serialize;
use serde_json::{Value, json};

use crate::input::InputError;

/// One value the server lowered to its maximum.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Clamped {
    /// The field of the request's `limits`, as the request named it.
    pub field: String,
    /// What the call asked for.
    pub asked: Value,
    /// What it got.
    pub got: Value,
}

/// The JSON schema of a call's `limits` object.
pub fn schema(maxima: &Limits) -> Value {
    let mut fuel = json!({
        "type": "integer", "minimum": 1,
        "description": "Fuel units (about one per WebAssembly instruction; the wasm backend only).",
    });
    if let (Some(max), Some(map)) = (maxima.fuel(), fuel.as_object_mut()) {
        map.insert("maximum".into(), json!(max));
    }
    json!({
        "type": "object",
        "description": "Limits for this call, each at most the server's maximum (a value \
                        above it is lowered, and the result says so). Omitted: the server's \
                        defaults.",
        "properties": {
            "timeout_seconds": {
                "type": "number", "exclusiveMinimum": 0,
                "maximum": maxima.wall_timeout().as_secs_f64(),
                "description": "Wall time of the call.",
            },
            "memory_mib": {
                "type": "integer", "minimum": 1,
                "maximum": maxima.memory_bytes() >> 20,
                "description": "Memory of the interpreter, in MiB.",
            },
            "max_output_bytes": {
                "type": "integer", "minimum": 1,
                "maximum": maxima.max_output_bytes(),
                "description": "Bytes kept of each of stdout and stderr.",
            },
            "max_tool_calls": {
                "type": "integer", "minimum": 0,
                "maximum": maxima.max_tool_calls(),
                "description": "Tool calls the code may make.",
            },
            "fuel": fuel,
        },
        "additionalProperties": false,
    })
}

/// The plain-number spellings a request may use for two library fields: `timeout_seconds`
/// (seconds, any positive number) for `wall_timeout` (text with a unit), and `memory_mib`
/// (whole MiB) for `memory_bytes`.
pub const ALIASES: [(&str, &str); 2] = [
    ("timeout_seconds", "wall_timeout"),
    ("memory_mib", "memory_bytes"),
];

/// `defaults` with what `asked` names, each within `maxima`; the values lowered, each under
/// the name the request gave it and in its units.
///
/// `asked` takes the library's `Limits` field names (`wall_timeout: "5s"`, `memory_bytes`,
/// `max_tool_calls`, ...) and the two [`ALIASES`]; both servers take the same names.
///
/// # Errors
///
/// [`InputError::Limits`] naming the field: not an object, an unknown field, a field named
/// twice (an alias and its field), a value of the wrong type or out of range, or limits
/// that do not validate together.
pub fn apply(
    defaults: &Limits,
    maxima: &Limits,
    asked: Option<&Value>,
) -> Result<(Limits, Vec<Clamped>), InputError> {
    let invalid = InputError::Limits;
    let asked = match asked {
        None | Some(Value::Null) => return Ok((defaults.clone(), Vec::new())),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(invalid("`limits` must be an object".into())),
    };
    let mut builder: LimitsBuilder = defaults.clone().into();
    // The library field each asked name sets.
    let mut named: Vec<(&str, &'static str)> = Vec::with_capacity(asked.len());
    for (key, value) in asked {
        let alias = ALIASES.iter().find(|(alias, _)| alias == key);
        let field = alias
            .map(|(_, field)| *field)
            .or_else(|| LimitsBuilder::FIELDS.iter().find(|f| *f == key).copied())
            .ok_or_else(|| {
                let known: Vec<&str> = ALIASES
                    .iter()
                    .map(|(alias, _)| *alias)
                    .chain(LimitsBuilder::FIELDS)
                    .collect();
                invalid(format!(
                    "`limits` has no field `{}` (it takes {})",
                    key.escape_debug(),
                    known.join(", ")
                ))
            })?;
        if let Some((other, _)) = named.iter().find(|(_, f)| *f == field) {
            return Err(invalid(format!(
                "`limits` names both `{other}` and `{key}`, which set the same limit; give one"
            )));
        }
        named.push((key, field));
        set(&mut builder, key, field, value)?;
    }
    let as_asked = |field: &'static str| -> &str {
        named
            .iter()
            .find(|(_, f)| *f == field)
            .map_or(field, |(key, _)| key)
    };
    let lowered = builder.clamp_to(maxima);
    let limits = builder
        .build()
        .map_err(|e| invalid(format!("`limits.{}`: {}", as_asked(e.field()), e.reason())))?;
    let serialized = serde_json::to_value(&limits).unwrap_or_default();
    let clamped = lowered
        .into_iter()
        .map(|field| {
            let name = as_asked(field);
            Clamped {
                field: name.to_owned(),
                asked: asked.get(name).cloned().unwrap_or_default(),
                got: value_of(&limits, &serialized, name),
            }
        })
        .collect();
    Ok((limits, clamped))
}

/// Sets `field` of `builder` from the request's `key: value`.
fn set(
    builder: &mut LimitsBuilder,
    key: &str,
    field: &'static str,
    value: &Value,
) -> Result<(), InputError> {
    match key {
        "timeout_seconds" => {
            let secs = value
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    InputError::Limits("`limits.timeout_seconds` must be a positive number".into())
                })?;
            // Past what a Duration holds is past any maximum: the clamp lowers it.
            builder.wall_timeout = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        }
        "memory_mib" => {
            let mib = value.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                InputError::Limits("`limits.memory_mib` must be an integer of at least 1".into())
            })?;
            builder.memory_bytes = mib.saturating_mul(1 << 20);
        }
        _ => {
            // The library's own parse of the field (units, types), one field at a time so
            // that an error names it.
            let Ok(Value::Object(mut fields)) = serde_json::to_value(&*builder) else {
                return Err(InputError::Limits("the limits do not serialize".into()));
            };
            fields.insert(field.to_owned(), value.clone());
            *builder = serde_json::from_value(Value::Object(fields))
                .map_err(|e| InputError::Limits(format!("`limits.{key}`: {e}")))?;
        }
    }
    Ok(())
}

/// What `limits` (`serialized` as JSON) holds for the request's name `name`, in that name's
/// units.
fn value_of(limits: &Limits, serialized: &Value, name: &str) -> Value {
    match name {
        "timeout_seconds" => json!(limits.wall_timeout().as_secs_f64()),
        "memory_mib" => json!(limits.memory_bytes() >> 20),
        _ => serialized.get(name).cloned().unwrap_or_default(),
    }
}

/// What `clamped` says, for the model's text: `limits lowered to the server's maxima:
/// timeout_seconds 600 → 60`.
pub fn note(clamped: &[Clamped]) -> Option<String> {
    if clamped.is_empty() {
        return None;
    }
    let parts: Vec<String> = clamped
        .iter()
        .map(|c| format!("{} {} → {}", c.field, c.asked, c.got))
        .collect();
    Some(format!(
        "limits lowered to the server's maxima: {}",
        parts.join(", ")
    ))
}

#[cfg(test)]
#[path = "clamp_tests.rs"]
mod tests;

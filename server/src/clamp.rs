//! The limits a call or a session asks for, taken within the server's maxima.
//!
//! A call may name a few limits in its input (`limits`: `timeout_seconds`, `memory_mib`,
//! `max_output_bytes`, `max_tool_calls`, `fuel`); the rest are the server's. A value above
//! the server's maximum is lowered to it, and the result says so; a value that is not a
//! positive number of the right type is an `invalid_input` error, never ignored.

use std::time::Duration;

use pycage::{ErrorKind, Limits, LimitsBuilder, RunError};
use serde::Serialize;
use serde_json::{Value, json};

/// The names a call's `limits` object may have.
pub const LIMIT_FIELDS: [&str; 5] = [
    "timeout_seconds",
    "memory_mib",
    "max_output_bytes",
    "max_tool_calls",
    "fuel",
];

/// One value the server lowered to its maximum.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Clamped {
    /// The field of the call's `limits`.
    pub field: &'static str,
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

/// `defaults` with what `asked` names, each within `maxima`; the values lowered.
///
/// # Errors
///
/// `invalid_input` naming the field: not an object, an unknown field, a value of the wrong
/// type or not positive, or limits that do not validate together.
pub fn apply(
    defaults: &Limits,
    maxima: &Limits,
    asked: Option<&Value>,
) -> Result<(Limits, Vec<Clamped>), RunError> {
    let invalid = |why: String| RunError::new(ErrorKind::InvalidInput, why);
    let asked = match asked {
        None | Some(Value::Null) => return Ok((defaults.clone(), Vec::new())),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(invalid("`limits` must be an object".into())),
    };
    if let Some(key) = asked.keys().find(|k| !LIMIT_FIELDS.contains(&k.as_str())) {
        return Err(invalid(format!(
            "`limits` has no field `{}` (it takes {})",
            key.escape_debug(),
            LIMIT_FIELDS.join(", ")
        )));
    }
    let mut b: LimitsBuilder = defaults.clone().into();
    let mut clamped = Vec::new();
    if let Some(v) = asked.get("timeout_seconds") {
        let secs = v
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0)
            .ok_or_else(|| invalid("`limits.timeout_seconds` must be a positive number".into()))?;
        let max = maxima.wall_timeout();
        b.wall_timeout = if secs > max.as_secs_f64() {
            clamped.push(Clamped {
                field: "timeout_seconds",
                asked: v.clone(),
                got: json!(max.as_secs_f64()),
            });
            max
        } else {
            Duration::from_secs_f64(secs)
        };
    }
    let mut integer = |field: &'static str, min: u64, max: u64| -> Result<Option<u64>, RunError> {
        let Some(v) = asked.get(field) else {
            return Ok(None);
        };
        let n = v.as_u64().filter(|n| *n >= min).ok_or_else(|| {
            invalid(format!(
                "`limits.{field}` must be an integer of at least {min}"
            ))
        })?;
        if n > max {
            clamped.push(Clamped {
                field,
                asked: v.clone(),
                got: json!(max),
            });
            return Ok(Some(max));
        }
        Ok(Some(n))
    };
    if let Some(mib) = integer("memory_mib", 1, maxima.memory_bytes() >> 20)? {
        b.memory_bytes = mib << 20;
    }
    if let Some(n) = integer("max_output_bytes", 1, maxima.max_output_bytes())? {
        b.max_output_bytes = n;
    }
    let calls = u64::from(maxima.max_tool_calls());
    if let Some(n) = integer("max_tool_calls", 0, calls)? {
        b.max_tool_calls = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = integer("fuel", 1, maxima.fuel().unwrap_or(u64::MAX))? {
        b.fuel = Some(n);
    }
    let limits = b.build().map_err(|e| invalid(format!("`limits`: {e}")))?;
    Ok((limits, clamped))
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

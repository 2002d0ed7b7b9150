//! Built-in tools: `math.add`, `math.subtract`, `math.multiply`, `math.divide` and
//! `text.echo`.
//!
//! Math tools take two numbers `a` and `b`, each a JSON number or a numeric string (`"12"`,
//! `" -3.5 "`). Two integers give an integer (checked `i64` arithmetic, falling back to `f64`
//! on overflow); any float gives a float. Results that are not finite are an error.

use std::future::ready;

use serde_json::{Number, Value, json};

use crate::{Args, RegistryError, ToolError, ToolRegistry};

/// Registers every built-in tool in `reg`.
///
/// # Errors
///
/// [`RegistryError::Duplicate`] when `reg` already holds a tool with a built-in's name.
pub fn register_all(reg: &mut ToolRegistry) -> Result<(), RegistryError> {
    for op in MathOp::ALL {
        reg.register_fn(
            "math",
            op.name(),
            op.description(),
            op.parameters(),
            move |args| ready(op.call(&args)),
        )?;
    }
    reg.register_fn(
        "text",
        "echo",
        "Returns the given text unchanged.",
        echo_parameters(),
        |args| ready(echo(&args)),
    )
}

/// A number as the math tools see it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            // Precision loss above 2^53 is the documented float fallback.
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn into_json(self) -> Result<Value, ToolError> {
        match self {
            Num::Int(i) => Ok(Value::from(i)),
            Num::Float(f) => Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| ToolError::Failed("result is not a finite number".into())),
        }
    }
}

/// The four binary math tools.
#[derive(Debug, Clone, Copy)]
enum MathOp {
    Add,
    Subtract,
    Multiply,
    Divide,
}

impl MathOp {
    const ALL: [MathOp; 4] = [
        MathOp::Add,
        MathOp::Subtract,
        MathOp::Multiply,
        MathOp::Divide,
    ];

    fn name(self) -> &'static str {
        match self {
            MathOp::Add => "add",
            MathOp::Subtract => "subtract",
            MathOp::Multiply => "multiply",
            MathOp::Divide => "divide",
        }
    }

    fn description(self) -> &'static str {
        match self {
            MathOp::Add => "Adds two numbers: a + b.",
            MathOp::Subtract => "Subtracts b from a: a - b.",
            MathOp::Multiply => "Multiplies two numbers: a * b.",
            MathOp::Divide => "Divides a by b: a / b.",
        }
    }

    /// The key of the result object.
    fn result_key(self) -> &'static str {
        match self {
            MathOp::Add => "sum",
            MathOp::Subtract => "difference",
            MathOp::Multiply => "product",
            MathOp::Divide => "quotient",
        }
    }

    fn parameters(self) -> Value {
        let operand = |what: &str| {
            json!({
                "type": ["number", "string"],
                "description": format!("{what}: a number or a numeric string"),
            })
        };
        let (a, b) = match self {
            MathOp::Add | MathOp::Multiply => ("The first operand", "The second operand"),
            MathOp::Subtract => ("The minuend", "The subtrahend"),
            MathOp::Divide => ("The dividend", "The divisor"),
        };
        json!({
            "type": "object",
            "properties": { "a": operand(a), "b": operand(b) },
            "required": ["a", "b"],
            "additionalProperties": false,
        })
    }

    fn call(self, args: &Args) -> Result<Value, ToolError> {
        reject_unknown(args, &["a", "b"])?;
        let a = number_arg(args, "a")?;
        let b = number_arg(args, "b")?;
        let result = self.apply(a, b)?;
        Ok(json!({ self.result_key(): result.into_json()? }))
    }

    fn apply(self, a: Num, b: Num) -> Result<Num, ToolError> {
        if let (Num::Int(x), Num::Int(y)) = (a, b)
            && let Some(exact) = self.apply_int(x, y)?
        {
            return Ok(Num::Int(exact));
        }
        self.apply_float(a.as_f64(), b.as_f64()).map(Num::Float)
    }

    /// Integer arithmetic; `Ok(None)` when the result is not an `i64` (overflow, or a
    /// quotient with a remainder) and float arithmetic should be used instead.
    fn apply_int(self, x: i64, y: i64) -> Result<Option<i64>, ToolError> {
        Ok(match self {
            MathOp::Add => x.checked_add(y),
            MathOp::Subtract => x.checked_sub(y),
            MathOp::Multiply => x.checked_mul(y),
            MathOp::Divide if y == 0 => return Err(division_by_zero()),
            MathOp::Divide => match x.checked_rem(y) {
                Some(0) => x.checked_div(y),
                _ => None,
            },
        })
    }

    fn apply_float(self, x: f64, y: f64) -> Result<f64, ToolError> {
        let result = match self {
            MathOp::Add => x + y,
            MathOp::Subtract => x - y,
            MathOp::Multiply => x * y,
            MathOp::Divide if y == 0.0 => return Err(division_by_zero()),
            MathOp::Divide => x / y,
        };
        if result.is_finite() {
            Ok(result)
        } else {
            Err(ToolError::Failed("result is not a finite number".into()))
        }
    }
}

fn division_by_zero() -> ToolError {
    ToolError::Failed("division by zero".into())
}

/// Fails on the first argument whose name is not in `known`.
fn reject_unknown(args: &Args, known: &[&str]) -> Result<(), ToolError> {
    match args.keys().find(|k| !known.contains(&k.as_str())) {
        Some(extra) => Err(ToolError::InvalidArguments(format!(
            "unexpected argument `{}`",
            truncate_name(extra)
        ))),
        None => Ok(()),
    }
}

/// An argument name as quoted back in messages: the guest chose it, so keep it short.
fn truncate_name(name: &str) -> &str {
    const MAX: usize = 64;
    match name.char_indices().nth(MAX) {
        Some((end, _)) => &name[..end],
        None => name,
    }
}

fn required<'a>(args: &'a Args, name: &str) -> Result<&'a Value, ToolError> {
    args.get(name)
        .ok_or_else(|| ToolError::InvalidArguments(format!("missing argument `{name}`")))
}

fn number_arg(args: &Args, name: &str) -> Result<Num, ToolError> {
    let invalid =
        || ToolError::InvalidArguments(format!("`{name}` must be a number or a numeric string"));
    match required(args, name)? {
        Value::Number(n) => number_from_json(n).ok_or_else(invalid),
        Value::String(s) => number_from_str(s).ok_or_else(invalid),
        _ => Err(invalid()),
    }
}

fn number_from_json(n: &Number) -> Option<Num> {
    match n.as_i64() {
        Some(i) => Some(Num::Int(i)),
        None => n.as_f64().filter(|f| f.is_finite()).map(Num::Float),
    }
}

/// Parses `"12"`, `" -3.5 "`, `"1e3"`; rejects `"inf"`, `"nan"` and anything else.
fn number_from_str(s: &str) -> Option<Num> {
    let s = s.trim();
    if let Ok(i) = s.parse::<i64>() {
        return Some(Num::Int(i));
    }
    // `f64::from_str` also accepts "inf", "infinity" and "nan": require a digit.
    if !s.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(Num::Float)
}

fn echo_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": { "type": "string", "description": "The text to return" },
        },
        "required": ["text"],
        "additionalProperties": false,
    })
}

fn echo(args: &Args) -> Result<Value, ToolError> {
    reject_unknown(args, &["text"])?;
    match required(args, "text")? {
        Value::String(text) => Ok(json!({ "text": text })),
        _ => Err(ToolError::InvalidArguments(
            "`text` must be a string".into(),
        )),
    }
}

#[cfg(test)]
#[path = "builtin_tests.rs"]
mod tests;

//! JSON text as pycage reads it from a guest, a tool or a peer process: numbers exact, nesting
//! bounded.
//!
//! Python's `float` and `int` cross the host as JSON numbers, so reading them must not change
//! them:
//!
//! * **Floats** are parsed with correct rounding (serde_json's `float_roundtrip`), so the text
//!   CPython writes for a float (its shortest repr) reads back as the same 64 bits, subnormals
//!   and `-0.0` included.
//! * **Integers** are exact from −2⁶³ to 2⁶⁴−1 (what [`Value`] holds as `i64`/`u64`). A
//!   larger integer is refused with [`JsonError::IntegerOutOfRange`], never rounded to a float
//!   as serde_json would do on its own. (serde_json's `arbitrary_precision` could carry it, but
//!   that feature is global to a program and breaks serde's untagged and flattened types,
//!   which a host embedding pycage, and MCP's JSON-RPC types, rely on.)
//! * **Nesting** of arrays and objects is bounded by the caller ([`MAX_DEPTH`] for values),
//!   checked by an iterative scan before anything recurses, so hostile text cannot exhaust
//!   the host's stack, and the bound is pycage's own rather than serde_json's 128.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// The deepest nesting of arrays and objects a value may have when it crosses the host: a
/// run's return value, a tool's arguments object (which counts as one level) or its result.
pub const MAX_DEPTH: usize = 200;

/// Why JSON text was refused. Displayed as a clause that reads after "in the return value, "
/// (or any other subject).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JsonError {
    /// The text is not valid JSON.
    Syntax,
    /// Arrays and objects nest deeper than the bound, which the error carries.
    TooDeep(usize),
    /// An integer outside −2⁶³..2⁶⁴−1; the error carries its text, shortened when long.
    IntegerOutOfRange(String),
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonError::Syntax => f.write_str("the text is not valid JSON"),
            JsonError::TooDeep(max) => {
                write!(f, "arrays and objects nest deeper than {max} levels")
            }
            JsonError::IntegerOutOfRange(text) => write!(
                f,
                "the integer {text} is outside the range JSON numbers cross here \
                 (-2**63 to 2**64-1)"
            ),
        }
    }
}

impl std::error::Error for JsonError {}

/// Parses `text` as one JSON value: floats correctly rounded, integers exact or refused, and
/// arrays and objects nested at most `max_depth` deep.
///
/// # Errors
///
/// [`JsonError::TooDeep`] or [`JsonError::IntegerOutOfRange`] when the text breaks those
/// rules (found before parsing), otherwise [`JsonError::Syntax`] for text that is not JSON.
pub fn parse(text: &[u8], max_depth: usize) -> Result<Value, JsonError> {
    scan(text, max_depth, true)?;
    let mut de = serde_json::Deserializer::from_slice(text);
    // The scan bounded the depth; serde_json's own limit (128) would be the wrong bound.
    de.disable_recursion_limit();
    let value = Value::deserialize(&mut de).map_err(|_| JsonError::Syntax)?;
    de.end().map_err(|_| JsonError::Syntax)?;
    Ok(value)
}

/// Checks that arrays and objects in `text` nest at most `max_depth` deep, without parsing
/// it: for text that is then read in parts (raw values), each part by its own rule.
///
/// # Errors
///
/// [`JsonError::TooDeep`] when they nest deeper.
pub fn check_nesting(text: &[u8], max_depth: usize) -> Result<(), JsonError> {
    scan(text, max_depth, false)
}

/// One pass over the text, outside strings: counts nesting, and (with `integers`) checks each
/// integer literal's range. It does not validate: serde_json does, after it. Its idea of
/// where strings begin and end is JSON's (a quote opens and closes one, a backslash escapes
/// the next byte), so up to the first syntax error, which stops serde_json too, the depth it
/// measures is the depth serde_json recurses to.
///
/// Hand-written because no maintained crate gives either check on the way in: serde_json
/// turns an integer it cannot hold into a float before a visitor sees it.
fn scan(text: &[u8], max_depth: usize, integers: bool) -> Result<(), JsonError> {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&byte) = text.get(i) {
        match byte {
            b'"' => {
                i = string_end(text, i + 1);
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Err(JsonError::TooDeep(max_depth));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' if integers => {
                let start = i;
                while text
                    .get(i)
                    .is_some_and(|b| matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                {
                    i += 1;
                }
                check_integer(&text[start..i])?;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The index just past the string whose contents start at `i` (or the text's end).
fn string_end(text: &[u8], mut i: usize) -> usize {
    while let Some(&byte) = text.get(i) {
        match byte {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    text.len()
}

/// The longest integer text an error repeats in full.
const MAX_SHOWN_DIGITS: usize = 40;

fn check_integer(token: &[u8]) -> Result<(), JsonError> {
    if token.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        return Ok(()); // a float
    }
    // The token is ASCII by construction.
    let text = std::str::from_utf8(token).unwrap_or_default();
    if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
        return Ok(());
    }
    let digits = text.trim_start_matches('-');
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(()); // not a number: serde_json reports the syntax error
    }
    let shown = if text.len() <= MAX_SHOWN_DIGITS {
        text.to_owned()
    } else {
        format!(
            "{}…{} ({} digits)",
            &text[..MAX_SHOWN_DIGITS / 2],
            &text[text.len() - 8..],
            digits.len()
        )
    };
    Err(JsonError::IntegerOutOfRange(shown))
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;

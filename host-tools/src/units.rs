//! Durations and byte sizes written for humans: `500ms`, `1.5s`, `64KiB`, `256MiB`.
//!
//! Parsing is exact (decimal arithmetic, no floating point) and rejects anything it does not
//! understand, naming the input in the error. Zero is accepted; callers decide whether a zero
//! limit makes sense.
//!
//! Written by hand on purpose: `humantime`, `bytesize`, `parse-size` and `byte-unit` were
//! measured against this module's tests and each differs where users would notice; the
//! comment beside each function says how.

use std::fmt;
use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Fractional digits beyond this many are validated but ignored: they are far below one
/// nanosecond or one byte for every unit this module knows.
const MAX_FRACTION_DIGITS: usize = 18;

/// Duration units, largest first: suffix, length in nanoseconds, and whether
/// [`format_duration`] may print a fraction of it.
const DURATION_UNITS: &[(&str, u128, bool)] = &[
    ("h", 3_600 * NANOS_PER_SEC, false),
    ("m", 60 * NANOS_PER_SEC, false),
    ("s", NANOS_PER_SEC, true),
    ("ms", 1_000_000, true),
    ("us", 1_000, true),
    ("ns", 1, false),
];

const KIB: u128 = 1 << 10;
const MIB: u128 = 1 << 20;
const GIB: u128 = 1 << 30;
const TIB: u128 = 1 << 40;

/// Size units as accepted by [`parse_size`] (compared case-insensitively).
const SIZE_UNITS: &[(&str, u128)] = &[
    ("b", 1),
    ("k", KIB),
    ("kib", KIB),
    ("kb", 1_000),
    ("m", MIB),
    ("mib", MIB),
    ("mb", 1_000_000),
    ("g", GIB),
    ("gib", GIB),
    ("gb", 1_000_000_000),
    ("t", TIB),
    ("tib", TIB),
    ("tb", 1_000_000_000_000),
];

/// Binary units used by [`format_size`], largest first.
const SIZE_FORMAT_UNITS: &[(&str, u128)] =
    &[("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)];

/// Why a duration or size could not be parsed. The message names the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    message: String,
}

impl UnitError {
    fn new(message: String) -> Self {
        Self { message }
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UnitError {}

/// A non-negative decimal number split at its point, as written.
struct Decimal<'a> {
    whole: u128,
    fraction: &'a str,
}

impl Decimal<'_> {
    /// `self * unit`, truncated towards zero, with a flag saying whether it was exact.
    /// `None` on overflow.
    fn scale(&self, unit: u128) -> Option<(u128, bool)> {
        let whole = self.whole.checked_mul(unit)?;
        let digits = &self.fraction[..self.fraction.len().min(MAX_FRACTION_DIGITS)];
        let exact_digits = digits.len() == self.fraction.len()
            || self.fraction[digits.len()..].bytes().all(|b| b == b'0');
        if digits.is_empty() {
            return Some((whole, exact_digits));
        }
        let numerator: u128 = digits.parse().ok()?;
        let denominator = 10u128.pow(u32::try_from(digits.len()).ok()?);
        let product = numerator.checked_mul(unit)?;
        let part = product / denominator;
        let exact = exact_digits && product % denominator == 0;
        Some((whole.checked_add(part)?, exact))
    }
}

/// Splits `s` into a leading decimal number and the rest (the unit, whitespace-trimmed).
/// `Err` carries a reason fragment; `Ok(None)` means `s` does not start with a number.
fn split_number(s: &str) -> Result<Option<(Decimal<'_>, &str)>, &'static str> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(end);
    if !number.bytes().any(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') {
        return Ok(None);
    }
    let whole = if whole.is_empty() {
        0
    } else {
        whole.parse::<u128>().map_err(|_| "it is too large")?
    };
    Ok(Some((Decimal { whole, fraction }, unit.trim())))
}

// Hand-written, not `humantime` (measured: humantime 2.4.0's `parse_duration` on every input
// units_tests.rs pins). It agrees on whole numbers and most decimals, but:
// - it rejects `.25s`, and any digit below a nanosecond (`1.0000000019s`, `1.0000015us`);
//   pinned: 250ms, and the finer digits truncated (1s 1ns);
// - it accepts far more than the six units: `1M` is a month of 30.44 days beside `1m` a
//   minute, and `2d`, `1y`, `5 seconds`, `1h 30m` all parse;
// - it calls `1e3s` unit `e` and `5s5` a missing unit (pinned: unknown units `e3s`, `s5`).
// A wrapper would have to check this grammar and truncate fractions itself: a second parser
// beside this one, not a replacement.
/// Parses a duration such as `500ms`, `5s`, `1.5s`, `2m`, `1h` or `250us`.
///
/// Units are `h`, `m`, `s`, `ms`, `us` and `ns` (lower case; whitespace between number and
/// unit is allowed). A unit is required: a bare `5` is ambiguous and rejected. Fractions finer
/// than a nanosecond are truncated.
///
/// # Errors
///
/// [`UnitError`] naming the input when it is empty, negative, has no or an unknown unit, is
/// not a number, or does not fit in a [`Duration`].
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let input = s.trim();
    let invalid = |why: &str| UnitError::new(format!("invalid duration `{s}`: {why}"));
    if input.starts_with('-') {
        return Err(invalid("durations cannot be negative"));
    }
    let (number, unit) = split_number(input)
        .map_err(invalid)?
        .ok_or_else(|| invalid("expected a number followed by a unit, e.g. `5s`"))?;
    if unit.is_empty() {
        return Err(invalid("a unit is required, e.g. `5s` or `500ms`"));
    }
    let (_, unit_nanos, _) = DURATION_UNITS
        .iter()
        .find(|(suffix, _, _)| *suffix == unit)
        .ok_or_else(|| {
            invalid(&format!(
                "unknown unit `{unit}` (use h, m, s, ms, us or ns)"
            ))
        })?;
    let (nanos, _) = number
        .scale(*unit_nanos)
        .ok_or_else(|| invalid("it is too large"))?;
    duration_from_nanos(nanos).ok_or_else(|| invalid("it is too large"))
}

fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, subsec))
}

// Hand-written; measured on every input units_tests.rs pins:
// - `bytesize` 2.7.0 (`ByteSize::from_str`) reads the number as an f64: `1.0001KiB` becomes
//   1024 and `1.5B` 1 instead of errors, `18014398509481983.5KiB` and `16777216TiB` saturate
//   to u64::MAX instead of "too large"; its `K`, `M`, `G` are decimal (`4K` = 4000, pinned
//   4096); ` 1 MiB ` is refused.
// - `parse-size` 1.1.0 is exact but rounds to whole bytes (`1.5B` = 2, `1.0001KiB` = 1024),
//   has one switch making `K` and `KB` both binary or both decimal (pinned: `K` binary, `KB`
//   decimal), and gives no reason a wrapper could name (`12 parsecs`: "invalid digit found in
//   string").
// - `byte-unit` 5.2.6 makes `4K` 4000, rounds `1.5B` to 2 and `1.0001KiB` to 1025, and reads
//   a lower-case `b` as bits unless told to ignore case.
/// Parses a byte size such as `1024`, `512B`, `64KiB`, `256MiB`, `1GiB`, `10MB` or `1.5M`.
///
/// A bare number is bytes. `KiB`/`MiB`/`GiB`/`TiB` and the short forms `K`/`M`/`G`/`T` are
/// binary (1024-based); `KB`/`MB`/`GB`/`TB` are decimal (1000-based). Units are
/// case-insensitive. A fraction is allowed when the result is a whole number of bytes.
///
/// # Errors
///
/// [`UnitError`] naming the input when it is empty, negative, has an unknown unit, is not a
/// whole number of bytes, or does not fit in a `u64`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let input = s.trim();
    let invalid = |why: &str| UnitError::new(format!("invalid size `{s}`: {why}"));
    if input.starts_with('-') {
        return Err(invalid("sizes cannot be negative"));
    }
    let (number, unit) = split_number(input)
        .map_err(invalid)?
        .ok_or_else(|| invalid("expected a number with an optional unit, e.g. `64KiB`"))?;
    let multiplier = if unit.is_empty() {
        1
    } else {
        SIZE_UNITS
            .iter()
            .find(|(suffix, _)| suffix.eq_ignore_ascii_case(unit))
            .map(|(_, multiplier)| *multiplier)
            .ok_or_else(|| {
                invalid(&format!(
                    "unknown unit `{unit}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
                ))
            })?
    };
    let (bytes, exact) = number
        .scale(multiplier)
        .ok_or_else(|| invalid("it is too large"))?;
    if !exact {
        return Err(invalid("it is not a whole number of bytes"));
    }
    u64::try_from(bytes).map_err(|_| invalid("it is too large"))
}

// Hand-written: `humantime::format_duration` (2.4.0) writes a sum of parts, `1s 500ms`,
// `1m 30s`, `1ms 234us 567ns`, where this writes `1.5s`, `90s`, `1234.567us` (pinned): one
// number and one unit, the form of `tool timed out after 1.5s` and of serialized limits.
/// Formats a duration for people, in the largest unit that shows it exactly: `30s`, `1.5s`,
/// `250ms`, `2m`, `1h`. The output is accepted by [`parse_duration`].
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    for &(suffix, unit, fractional) in DURATION_UNITS {
        if let Some(text) = format_in_unit(nanos, unit, fractional) {
            return format!("{text}{suffix}");
        }
    }
    format!("{nanos}ns")
}

// Hand-written: `bytesize`'s `Display` (2.7.0) rounds to one decimal with a space, `64.0 KiB`,
// and shows 1025 as `1.0 KiB` and u64::MAX as `16.0 EiB`, which do not parse back to the
// same number; pinned here: `64KiB`, `1025B`, `18446744073709551615B`.
/// Formats a byte count for people, in the largest binary unit that shows it exactly (with
/// at most three decimals): `64KiB`, `256MiB`, `1.5GiB`, else plain bytes such as `1000B`. The
/// output is accepted by [`parse_size`].
pub fn format_size(n: u64) -> String {
    let bytes = u128::from(n);
    for &(suffix, unit) in SIZE_FORMAT_UNITS {
        if let Some(text) = format_in_unit(bytes, unit, true) {
            return format!("{text}{suffix}");
        }
    }
    format!("{n}B")
}

/// `value / unit` as text, when `value >= unit` and the quotient is whole or (when
/// `fractional`) has at most three decimals; trailing zeros are dropped.
fn format_in_unit(value: u128, unit: u128, fractional: bool) -> Option<String> {
    if value < unit {
        return None;
    }
    let (whole, rest) = (value / unit, value % unit);
    if rest == 0 {
        return Some(whole.to_string());
    }
    let thousandths = rest.checked_mul(1_000)?;
    if !fractional || thousandths % unit != 0 {
        return None;
    }
    let fraction = format!("{:03}", thousandths / unit);
    Some(format!("{whole}.{}", fraction.trim_end_matches('0')))
}

#[cfg(test)]
#[path = "units_tests.rs"]
mod tests;

/// Serde for a [`Duration`] written as text with a unit (`"30s"`, `"500ms"`), as limits and
/// server configs write them: `#[serde(with = "pycage_tools::units::duration_text")]`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `d` as [`format_duration`](super::format_duration) does.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    /// Reads a duration as [`parse_duration`](super::parse_duration) does.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

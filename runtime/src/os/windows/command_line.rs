//! The command line and the environment block `CreateProcessW` takes, rendered as plain
//! data: pure, and unit-tested on every OS.

use std::cmp::Ordering;
use std::fmt;

/// The longest command line `CreateProcessW` accepts, in UTF-16 units with its NUL.
pub const MAX_COMMAND_LINE_UNITS: usize = 32_767;

/// Why a command line or an environment block cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenderError {
    /// A program, argument, name or value holds a NUL, which would end its string early.
    Nul,
    /// The program's path holds a `"`: the rules for `argv[0]` have no escape for one.
    QuoteInProgram,
    /// The command line is longer than [`MAX_COMMAND_LINE_UNITS`].
    TooLong,
    /// An environment variable's name is empty or holds a `=`.
    BadName(String),
    /// Two environment variables' names differ only in case: Windows holds one of them.
    DuplicateName(String),
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::Nul => f.write_str("a NUL character in the command or environment"),
            RenderError::QuoteInProgram => f.write_str("a `\"` in the program's path"),
            RenderError::TooLong => write!(
                f,
                "the command line is longer than {MAX_COMMAND_LINE_UNITS} UTF-16 units"
            ),
            RenderError::BadName(name) => write!(f, "a bad environment variable name: {name:?}"),
            RenderError::DuplicateName(name) => write!(
                f,
                "the environment variable {name:?} is named twice (names ignore case)"
            ),
        }
    }
}

impl std::error::Error for RenderError {}

/// True when an argument must be quoted: it is empty, or holds whitespace the parser splits
/// on, or a quote.
fn needs_quotes(arg: &str) -> bool {
    arg.is_empty() || arg.contains([' ', '\t', '\n', '\u{b}', '"'])
}

/// Appends one argument as the Microsoft C runtime's parser (the one `CommandLineToArgvW`
/// and every MSVC program's startup code share) reads it back unchanged.
///
/// An argument without spaces, tabs or quotes goes as it is (its backslashes are literal).
/// Any other goes in double quotes, where a run of `n` backslashes followed by a quote
/// becomes `2n + 1` backslashes and the quote, a run before the closing quote becomes `2n`,
/// and backslashes anywhere else stay as they are.
pub fn quote_arg(arg: &str, out: &mut String) {
    if !needs_quotes(arg) {
        out.push_str(arg);
        return;
    }
    out.push('"');
    let mut backslashes = 0usize;
    for c in arg.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.extend(std::iter::repeat_n('\\', 2 * backslashes + 1));
                out.push('"');
                backslashes = 0;
            }
            c => {
                out.extend(std::iter::repeat_n('\\', backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.extend(std::iter::repeat_n('\\', 2 * backslashes));
    out.push('"');
}

/// The whole command line: the program, always quoted (the parser reads `argv[0]` up to
/// the next quote, with no escapes), then each argument quoted by [`quote_arg`], separated
/// by single spaces.
///
/// # Errors
///
/// [`RenderError::Nul`] for a NUL anywhere, [`RenderError::QuoteInProgram`] for a quote in
/// the program, [`RenderError::TooLong`] past [`MAX_COMMAND_LINE_UNITS`].
pub fn command_line(program: &str, args: &[String]) -> Result<String, RenderError> {
    if program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
        return Err(RenderError::Nul);
    }
    if program.contains('"') {
        return Err(RenderError::QuoteInProgram);
    }
    let mut line = String::with_capacity(program.len() + 2);
    line.push('"');
    line.push_str(program);
    line.push('"');
    for arg in args {
        line.push(' ');
        quote_arg(arg, &mut line);
    }
    if line.encode_utf16().count() + 1 > MAX_COMMAND_LINE_UNITS {
        return Err(RenderError::TooLong);
    }
    Ok(line)
}

/// How Windows orders environment names: by their upper-case UTF-16 units, whatever the
/// locale.
fn name_order(a: &str, b: &str) -> Ordering {
    let upper = |s: &str| -> Vec<u16> { s.to_uppercase().encode_utf16().collect() };
    upper(a).cmp(&upper(b))
}

/// The environment block of `CreateProcessW` with `CREATE_UNICODE_ENVIRONMENT`: every
/// `NAME=VALUE` in UTF-16, each ended by a NUL, sorted by name without regard to case, and
/// one more NUL at the end (an empty environment is two NULs).
///
/// # Errors
///
/// [`RenderError::BadName`] for an empty name or one with a `=`,
/// [`RenderError::DuplicateName`] for two names that differ only in case,
/// [`RenderError::Nul`] for a NUL in a name or value.
pub fn environment_block(vars: &[(String, String)]) -> Result<Vec<u16>, RenderError> {
    let mut sorted: Vec<&(String, String)> = vars.iter().collect();
    for (name, value) in &sorted {
        if name.contains('\0') || value.contains('\0') {
            return Err(RenderError::Nul);
        }
        if name.is_empty() || name.contains('=') {
            return Err(RenderError::BadName(name.clone()));
        }
    }
    sorted.sort_by(|a, b| name_order(&a.0, &b.0));
    if let Some(pair) = sorted
        .windows(2)
        .find(|w| name_order(&w[0].0, &w[1].0) == Ordering::Equal)
    {
        return Err(RenderError::DuplicateName(pair[1].0.clone()));
    }
    let mut block = Vec::new();
    for (name, value) in sorted {
        block.extend(name.encode_utf16());
        block.push(u16::from(b'='));
        block.extend(value.encode_utf16());
        block.push(0);
    }
    if block.is_empty() {
        block.push(0);
    }
    block.push(0);
    Ok(block)
}

#[cfg(test)]
#[path = "command_line_tests.rs"]
mod tests;

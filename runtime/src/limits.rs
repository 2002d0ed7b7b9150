//! [`Limits`]: what one run may consume, validated at construction.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The resource limits of one run.
///
/// Every backend enforces them on the host side; the guest never sees or enforces its own
/// limits. Build with [`Limits::builder`] (invalid values are rejected there) or take
/// [`Limits::default`]:
///
/// | limit | default |
/// |---|---|
/// | `wall_timeout` | 30 s |
/// | `memory_bytes` | 256 MiB |
/// | `max_output_bytes` (each of stdout and stderr) | 64 KiB |
/// | `max_tool_calls` | 100 |
/// | `fuel` | none (consumption is still measured) |
/// | `tool_timeout` (one tool call) | 30 s |
/// | `max_tool_args_bytes` | 1 MiB |
/// | `max_tool_result_bytes` | 4 MiB |
/// | `max_value_bytes` (the return value's JSON) | 4 MiB |
/// | `max_code_bytes` | 16 MiB |
/// | `max_input_bytes` (all input files together) | 32 MiB |
/// | `max_written_bytes` (all the code writes to its files) | 32 MiB |
/// | `max_files` (files and directories in the scratch directory) | 1,000 |
/// | `max_file_bytes` (one file) | 16 MiB |
/// | `max_returned_bytes` (the produced files' contents in the result) | 16 MiB |
///
/// ```
/// use std::time::Duration;
/// let limits = pycage::Limits::builder()
///     .wall_timeout(Duration::from_secs(5))
///     .fuel(Some(1_000_000_000))
///     .build()?;
/// assert_eq!(limits.max_tool_calls(), 100);
/// # Ok::<(), pycage::LimitsError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LimitsBuilder", into = "LimitsBuilder")]
pub struct Limits {
    wall_timeout: Duration,
    memory_bytes: u64,
    max_output_bytes: u64,
    max_tool_calls: u32,
    fuel: Option<u64>,
    tool_timeout: Duration,
    max_tool_args_bytes: u64,
    max_tool_result_bytes: u64,
    max_value_bytes: u64,
    max_code_bytes: u64,
    max_input_bytes: u64,
    max_written_bytes: u64,
    max_files: u32,
    max_file_bytes: u64,
    max_returned_bytes: u64,
}

const MIB: u64 = 1024 * 1024;

/// The largest memory limit: a 32-bit guest cannot address more than 4 GiB.
pub const MAX_MEMORY_BYTES: u64 = 4 * 1024 * MIB;

/// The smallest memory limit the Python guest can start in.
pub const MIN_MEMORY_BYTES: u64 = 64 * MIB;

/// The largest file budget (input, written, returned): what a host may spend on one scratch
/// directory's disk.
const MAX_SCRATCH_BYTES: u64 = 16 * 1024 * MIB;

/// The most files a scratch directory may be allowed.
const MAX_FILES: u32 = 1_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall_timeout: Duration::from_secs(30),
            memory_bytes: 256 * MIB,
            max_output_bytes: 64 * 1024,
            max_tool_calls: 100,
            fuel: None,
            tool_timeout: Duration::from_secs(30),
            max_tool_args_bytes: MIB,
            max_tool_result_bytes: 4 * MIB,
            max_value_bytes: 4 * MIB,
            max_code_bytes: 16 * MIB,
            max_input_bytes: 32 * MIB,
            max_written_bytes: 32 * MIB,
            max_files: 1000,
            max_file_bytes: 16 * MIB,
            max_returned_bytes: 16 * MIB,
        }
    }
}

impl Limits {
    /// A builder starting from the defaults.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::from(Limits::default())
    }

    /// The first field above its value in `maxima`, by name (see
    /// [`LimitsBuilder::clamp_to`]), or `None` when every one is within them.
    pub fn first_above(&self, maxima: &Limits) -> Option<&'static str> {
        LimitsBuilder::from(self.clone())
            .clamp_to(maxima)
            .first()
            .copied()
    }

    /// The limits of one run in a session opened with `session`'s limits: the run's own wall
    /// time, fuel, output, value, code and tool limits, and the session's memory and file
    /// budgets (they belong to the guest and its directory, which outlive the run).
    pub(crate) fn within_session(mut self, session: &Limits) -> Limits {
        self.memory_bytes = session.memory_bytes;
        self.max_written_bytes = session.max_written_bytes;
        self.max_files = session.max_files;
        self.max_file_bytes = session.max_file_bytes;
        self
    }

    /// The wall-clock limit of the whole run, including time blocked in tool calls.
    pub fn wall_timeout(&self) -> Duration {
        self.wall_timeout
    }
    /// The most linear memory (and host memory on the guest's behalf) the guest may use.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }
    /// The most bytes kept of each of stdout and stderr (head and tail; the middle is cut).
    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_bytes
    }
    /// The most tool calls the run may execute.
    pub fn max_tool_calls(&self) -> u32 {
        self.max_tool_calls
    }
    /// The fuel budget (roughly, wasm instructions), if any.
    pub fn fuel(&self) -> Option<u64> {
        self.fuel
    }
    /// The time limit of one tool call.
    pub fn tool_timeout(&self) -> Duration {
        self.tool_timeout
    }
    /// The most bytes of JSON arguments one tool call may pass.
    pub fn max_tool_args_bytes(&self) -> u64 {
        self.max_tool_args_bytes
    }
    /// The most bytes of JSON one tool call may return to the guest.
    pub fn max_tool_result_bytes(&self) -> u64 {
        self.max_tool_result_bytes
    }
    /// The most bytes the JSON of the run's return value may take.
    pub fn max_value_bytes(&self) -> u64 {
        self.max_value_bytes
    }
    /// The most bytes of source code a run accepts.
    pub fn max_code_bytes(&self) -> u64 {
        self.max_code_bytes
    }
    /// The most bytes the input files of a run may hold together.
    pub fn max_input_bytes(&self) -> u64 {
        self.max_input_bytes
    }
    /// The most bytes the code may write to files in its scratch directory, counted on every
    /// write (over the directory's life: one run's, or a whole session's).
    pub fn max_written_bytes(&self) -> u64 {
        self.max_written_bytes
    }
    /// The most files and directories the scratch directory may hold (inputs included).
    pub fn max_files(&self) -> u32 {
        self.max_files
    }
    /// The largest one file in the scratch directory may grow.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }
    /// The most bytes of produced files' contents a result carries; files past it are
    /// listed with their size but without their bytes.
    pub fn max_returned_bytes(&self) -> u64 {
        self.max_returned_bytes
    }
}

/// Builds [`Limits`]; [`LimitsBuilder::build`] validates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[allow(missing_docs)]
pub struct LimitsBuilder {
    #[serde(with = "pycage_tools::units::duration_text")]
    pub wall_timeout: Duration,
    pub memory_bytes: u64,
    pub max_output_bytes: u64,
    pub max_tool_calls: u32,
    pub fuel: Option<u64>,
    #[serde(with = "pycage_tools::units::duration_text")]
    pub tool_timeout: Duration,
    pub max_tool_args_bytes: u64,
    pub max_tool_result_bytes: u64,
    pub max_value_bytes: u64,
    pub max_code_bytes: u64,
    pub max_input_bytes: u64,
    pub max_written_bytes: u64,
    pub max_files: u32,
    pub max_file_bytes: u64,
    pub max_returned_bytes: u64,
}

impl Default for LimitsBuilder {
    fn default() -> Self {
        Limits::default().into()
    }
}

impl From<Limits> for LimitsBuilder {
    fn from(l: Limits) -> Self {
        LimitsBuilder {
            wall_timeout: l.wall_timeout,
            memory_bytes: l.memory_bytes,
            max_output_bytes: l.max_output_bytes,
            max_tool_calls: l.max_tool_calls,
            fuel: l.fuel,
            tool_timeout: l.tool_timeout,
            max_tool_args_bytes: l.max_tool_args_bytes,
            max_tool_result_bytes: l.max_tool_result_bytes,
            max_value_bytes: l.max_value_bytes,
            max_code_bytes: l.max_code_bytes,
            max_input_bytes: l.max_input_bytes,
            max_written_bytes: l.max_written_bytes,
            max_files: l.max_files,
            max_file_bytes: l.max_file_bytes,
            max_returned_bytes: l.max_returned_bytes,
        }
    }
}

impl TryFrom<LimitsBuilder> for Limits {
    type Error = LimitsError;
    fn try_from(b: LimitsBuilder) -> Result<Self, LimitsError> {
        b.build()
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = value;
            self
        }
    };
}

impl LimitsBuilder {
    /// The fields' names, in the order they are declared, as they are serialized and as
    /// [`clamp_to`](Self::clamp_to) and [`LimitsError::field`] name them: what a server takes
    /// in a request's `limits`.
    pub const FIELDS: [&'static str; 15] = [
        "wall_timeout",
        "memory_bytes",
        "max_output_bytes",
        "max_tool_calls",
        "fuel",
        "tool_timeout",
        "max_tool_args_bytes",
        "max_tool_result_bytes",
        "max_value_bytes",
        "max_code_bytes",
        "max_input_bytes",
        "max_written_bytes",
        "max_files",
        "max_file_bytes",
        "max_returned_bytes",
    ];

    setter!(
        /// Sets the wall-clock limit; must be more than zero.
        wall_timeout: Duration
    );
    setter!(
        /// Sets the memory limit; between 64 MiB and 4 GiB.
        memory_bytes: u64
    );
    setter!(
        /// Sets the output cap of each stream; zero keeps no output.
        max_output_bytes: u64
    );
    setter!(
        /// Sets the call ceiling; zero allows no tool calls.
        max_tool_calls: u32
    );
    setter!(
        /// Sets the fuel budget; `None` meters without a budget. `Some(0)` is rejected.
        fuel: Option<u64>
    );
    setter!(
        /// Sets the time limit of one tool call; must be more than zero.
        tool_timeout: Duration
    );
    setter!(
        /// Sets the cap on one call's JSON arguments; must be more than zero.
        max_tool_args_bytes: u64
    );
    setter!(
        /// Sets the cap on one call's JSON result; must be more than zero.
        max_tool_result_bytes: u64
    );
    setter!(
        /// Sets the cap on the return value's JSON; must be more than zero.
        max_value_bytes: u64
    );
    setter!(
        /// Sets the cap on the source code; must be more than zero.
        max_code_bytes: u64
    );
    setter!(
        /// Sets the cap on all input files together; zero accepts no input bytes.
        max_input_bytes: u64
    );
    setter!(
        /// Sets how many bytes the code may write to its files; zero makes them read-only in
        /// effect (every write is `ENOSPC`).
        max_written_bytes: u64
    );
    setter!(
        /// Sets how many files and directories the scratch directory may hold.
        max_files: u32
    );
    setter!(
        /// Sets the largest size of one file; must be more than zero.
        max_file_bytes: u64
    );
    setter!(
        /// Sets the cap on the produced files' contents in a result; zero returns names and
        /// sizes only.
        max_returned_bytes: u64
    );

    /// Validates and returns the limits.
    ///
    /// Lowers each field above its value in `maxima` to it, and names the fields lowered,
    /// in the order the fields are declared. No fuel limit (unmetered) is above any fuel
    /// maximum; maxima without one allow any. What a server does with a client's request:
    /// its limits within the server's maxima, and what it lowered for the client to see.
    pub fn clamp_to(&mut self, maxima: &Limits) -> Vec<&'static str> {
        let mut lowered = Vec::new();
        macro_rules! lower {
            ($($field:ident),* $(,)?) => {$(
                if self.$field > maxima.$field {
                    self.$field = maxima.$field;
                    lowered.push(stringify!($field));
                }
            )*};
        }
        lower!(wall_timeout, memory_bytes, max_output_bytes, max_tool_calls);
        if let Some(max) = maxima.fuel
            && self.fuel.is_none_or(|f| f > max)
        {
            self.fuel = Some(max);
            lowered.push("fuel");
        }
        lower!(
            tool_timeout,
            max_tool_args_bytes,
            max_tool_result_bytes,
            max_value_bytes,
            max_code_bytes,
            max_input_bytes,
            max_written_bytes,
            max_files,
            max_file_bytes,
            max_returned_bytes,
        );
        lowered
    }

    /// # Errors
    ///
    /// [`LimitsError`] naming the first invalid field and why.
    pub fn build(self) -> Result<Limits, LimitsError> {
        let err = |field, reason: String| Err(LimitsError { field, reason });
        if self.wall_timeout.is_zero() {
            return err("wall_timeout", "must be more than zero".into());
        }
        if self.tool_timeout.is_zero() {
            return err("tool_timeout", "must be more than zero".into());
        }
        if !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&self.memory_bytes) {
            return err(
                "memory_bytes",
                format!(
                    "must be between {MIN_MEMORY_BYTES} (64 MiB) and {MAX_MEMORY_BYTES} (4 GiB) bytes, got {}",
                    self.memory_bytes
                ),
            );
        }
        if self.fuel == Some(0) {
            return err("fuel", "must be more than zero (or unset)".into());
        }
        for (field, value) in [
            ("max_tool_args_bytes", self.max_tool_args_bytes),
            ("max_tool_result_bytes", self.max_tool_result_bytes),
            ("max_value_bytes", self.max_value_bytes),
            ("max_code_bytes", self.max_code_bytes),
            ("max_file_bytes", self.max_file_bytes),
        ] {
            if value == 0 {
                return err(field, "must be more than zero".into());
            }
            if value > MAX_MEMORY_BYTES {
                return err(field, "must not exceed 4 GiB".into());
            }
        }
        for (field, value) in [
            ("max_input_bytes", self.max_input_bytes),
            ("max_written_bytes", self.max_written_bytes),
            ("max_returned_bytes", self.max_returned_bytes),
        ] {
            if value > MAX_SCRATCH_BYTES {
                return err(field, "must not exceed 16 GiB".into());
            }
        }
        if self.max_files > MAX_FILES {
            return err("max_files", format!("must not exceed {MAX_FILES}"));
        }
        Ok(Limits {
            wall_timeout: self.wall_timeout,
            memory_bytes: self.memory_bytes,
            max_output_bytes: self.max_output_bytes,
            max_tool_calls: self.max_tool_calls,
            fuel: self.fuel,
            tool_timeout: self.tool_timeout,
            max_tool_args_bytes: self.max_tool_args_bytes,
            max_tool_result_bytes: self.max_tool_result_bytes,
            max_value_bytes: self.max_value_bytes,
            max_code_bytes: self.max_code_bytes,
            max_input_bytes: self.max_input_bytes,
            max_written_bytes: self.max_written_bytes,
            max_files: self.max_files,
            max_file_bytes: self.max_file_bytes,
            max_returned_bytes: self.max_returned_bytes,
        })
    }
}

/// An invalid limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsError {
    field: &'static str,
    reason: String,
}

impl LimitsError {
    /// The name of the invalid field.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why it is invalid (`must be more than zero`).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid limit `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for LimitsError {}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;

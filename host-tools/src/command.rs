//! Command tools: tools backed by an executable, usually declared in a TOML file.
//!
//! A call spawns the command directly (never through a shell) with the JSON arguments object
//! and a newline on its stdin, then closes stdin. On exit status 0 the command's stdout is
//! parsed as JSON and becomes the result. Otherwise the call fails with a fixed message that
//! gives only the exit status or the signal (`tool exited with status 3`, `tool was killed by
//! signal 9`), and the last non-empty line of the command's stderr goes to the host's log
//! (`tracing`, at `warn`, with the tool's qualified name; never the arguments). A tool declared
//! with `expose_stderr` shows that line to the guest instead of the status.
//!
//! # Security
//!
//! A command tool runs with the host's privileges and working directory: it is trusted host
//! code, configured by the operator. Its environment is not the host's: only
//! [`INHERITED_ENV`](crate::process::INHERITED_ENV) and the variables its `pass_env` names,
//! so a secret in the host's environment reaches a tool only when its configuration says so. The guest controls only the arguments
//! object, which the command must validate (the `parameters` schema is advisory). Stdout is
//! read up to a byte cap and stderr keeps a bounded tail, so a command cannot make the host
//! buffer unbounded output; the call's time limit kills the command's whole process group
//! (on Unix) and reaps it.
//!
//! Stderr is the command's own diagnostics and can name host paths, hosts or credentials, so
//! the guest sees none of it by default. Set `expose_stderr` only for a command whose stderr is
//! written for the guest: the guest then reads its last line (trimmed, without control
//! characters, at most 500 characters).
//!
//! # File format
//!
//! ```toml
//! [[tool]]
//! name = "word_count"            # required; a Python identifier
//! namespace = "text"             # required
//! description = "Counts words."  # required
//! command = ["./wc.py", "--json"] # required argv; see below for relative paths
//! timeout = "10s"                # optional; default 30s, must be > 0
//! expose_stderr = true           # optional; default false: the guest sees the exit status only
//! pass_env = ["GITHUB_TOKEN"]    # optional; host variables it gets beyond PATH, HOME, the locale...
//! parameters = { type = "object", properties = { text = { type = "string" } } }
//! ```
//!
//! Unknown keys are errors. An error names the tool it is in and, where toml gives one, its
//! line and column. See [`load_file`] and [`parse_toml`].

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};

use crate::process::ProcessGroup;
use crate::units::format_duration;
use crate::{Args, RegistryError, Tool, ToolError, ToolFuture};

mod config;

pub use config::{load_file, parse_toml};

/// The time limit of a command tool that does not set one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The stdout cap of a command tool that does not set one: 16 MiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 << 20;

/// How much of a command's stderr is kept by default (the tail): 64 KiB.
pub const DEFAULT_MAX_STDERR_BYTES: usize = 64 << 10;

/// The longest stderr line kept (for the host's log and, when exposed, the guest), in characters.
const MAX_ERROR_CHARS: usize = 500;

/// Size of the buffer output is read through.
const READ_CHUNK: usize = 8 << 10;

/// A tool backed by an executable.
///
/// Built with [`CommandTool::new`] and the `with_*` setters, or loaded from TOML with
/// [`load_file`] / [`parse_toml`]. Defaults: no arguments schema beyond `{"type": "object"}`,
/// a [`DEFAULT_TIMEOUT`] time limit, a [`DEFAULT_MAX_OUTPUT_BYTES`] stdout cap, a
/// [`DEFAULT_MAX_STDERR_BYTES`] stderr tail, and stderr kept from the guest (see
/// [`CommandTool::with_expose_stderr`]).
///
/// ```
/// use std::time::Duration;
/// use pycage_tools::{ToolRegistry, command::CommandTool};
///
/// let tool = CommandTool::new("text", "wc", "Counts words.", vec!["/usr/local/bin/wc-json".into()])?
///     .with_timeout(Duration::from_secs(5));
/// let mut tools = ToolRegistry::new();
/// tools.register(tool)?;
/// # Ok::<(), pycage_tools::RegistryError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CommandTool {
    namespace: String,
    name: String,
    description: String,
    parameters: Value,
    argv: Vec<String>,
    timeout: Duration,
    max_output_bytes: usize,
    max_stderr_bytes: usize,
    expose_stderr: bool,
    pass_env: Vec<String>,
}

impl CommandTool {
    /// A command tool running `argv` (`argv[0]` is the program, looked up on `PATH` when it
    /// contains no `/`).
    ///
    /// # Errors
    ///
    /// [`RegistryError::Config`] when `argv` is empty or `argv[0]` is empty. Names are
    /// checked when the tool is registered.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        description: impl Into<String>,
        argv: Vec<String>,
    ) -> Result<Self, RegistryError> {
        if argv.first().is_none_or(|program| program.is_empty()) {
            return Err(RegistryError::Config(
                "a command tool needs a non-empty command".into(),
            ));
        }
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
            description: description.into(),
            parameters: serde_json::json!({ "type": "object" }),
            argv,
            timeout: DEFAULT_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_stderr_bytes: DEFAULT_MAX_STDERR_BYTES,
            expose_stderr: false,
            pass_env: Vec::new(),
        })
    }

    /// Names host environment variables the command gets beyond
    /// [`INHERITED_ENV`](crate::process::INHERITED_ENV) (none by default).
    ///
    /// # Security
    ///
    /// The command is trusted, but what it prints reaches the guest: pass a secret only to a
    /// command that keeps it out of its output.
    #[must_use]
    pub fn with_pass_env(mut self, names: Vec<String>) -> Self {
        self.pass_env = names;
        self
    }

    /// Sets the JSON schema of the arguments object.
    #[must_use]
    pub fn with_parameters(mut self, parameters: Value) -> Self {
        self.parameters = parameters;
        self
    }

    /// Sets the time limit of one call; the command is killed when it runs longer.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the most stdout bytes a call may produce; more fails the call.
    #[must_use]
    pub fn with_max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Sets how many trailing stderr bytes are kept for the error message.
    #[must_use]
    pub fn with_max_stderr_bytes(mut self, bytes: usize) -> Self {
        self.max_stderr_bytes = bytes;
        self
    }

    /// Sets whether a failed call shows the guest the last line of the command's stderr
    /// (`true`) or only its exit status or signal (`false`, the default). Either way the line
    /// is logged on the host.
    ///
    /// # Security
    ///
    /// The guest is untrusted: turn this on only for a command whose stderr is meant for it
    /// and never names host paths, hosts, credentials or other host details.
    #[must_use]
    pub fn with_expose_stderr(mut self, expose: bool) -> Self {
        self.expose_stderr = expose;
        self
    }

    /// The command line: program, then arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The most stdout bytes a call may produce.
    pub fn max_output_bytes(&self) -> usize {
        self.max_output_bytes
    }

    /// How many trailing stderr bytes are kept.
    pub fn max_stderr_bytes(&self) -> usize {
        self.max_stderr_bytes
    }

    /// Whether the guest sees the last line of stderr when a call fails.
    pub fn expose_stderr(&self) -> bool {
        self.expose_stderr
    }

    async fn run(&self, args: Args) -> Result<Value, ToolError> {
        let mut input = serde_json::to_vec(&Value::Object(args))
            .map_err(|_| ToolError::Failed("tool arguments could not be encoded".into()))?;
        input.push(b'\n');
        let mut process = Process::spawn(&self.argv, &self.pass_env)?;
        let exchanged = tokio::time::timeout(
            self.timeout,
            process.exchange(input, self.max_output_bytes, self.max_stderr_bytes),
        )
        .await;
        match exchanged {
            Ok(Ok(output)) => output.into_result(self),
            Ok(Err(err)) => {
                process.kill().await;
                Err(err)
            }
            Err(_elapsed) => {
                process.kill().await;
                Err(ToolError::Failed(format!(
                    "tool timed out after {}",
                    format_duration(self.timeout)
                )))
            }
        }
    }
}

impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }
    fn call(&self, args: Args) -> ToolFuture<'_> {
        Box::pin(self.run(args))
    }
}

/// A spawned command: dropping it kills its process group (see [`ProcessGroup`]).
struct Process {
    group: ProcessGroup,
}

/// What a finished command left behind.
struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Process {
    fn spawn(argv: &[String], pass_env: &[String]) -> Result<Self, ToolError> {
        let not_started = || ToolError::Failed("tool could not be started".into());
        let (program, args) = argv.split_first().ok_or_else(not_started)?;
        let mut command = Command::new(program);
        crate::process::inherit_env_only(&mut command, pass_env);
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so a time limit can kill everything the command started.
        match ProcessGroup::spawn(command) {
            Ok(group) => Ok(Self { group }),
            Err(err) => {
                tracing::warn!(program = %program, error = %err, "command tool could not be started");
                Err(not_started())
            }
        }
    }

    /// Feeds `input` to stdin, collects stdout (at most `max_stdout` bytes) and the tail of
    /// stderr (`keep_stderr` bytes) concurrently, then waits for the exit status.
    async fn exchange(
        &mut self,
        input: Vec<u8>,
        max_stdout: usize,
        keep_stderr: usize,
    ) -> Result<Output, ToolError> {
        let stdin = self.group.child().stdin.take();
        let stdout = self.group.child().stdout.take();
        let stderr = self.group.child().stderr.take();
        let (stdout, stderr, ()) = tokio::try_join!(
            read_capped(stdout, max_stdout),
            async { Ok(read_tail(stderr, keep_stderr).await) },
            async {
                write_input(stdin, &input).await;
                Ok(())
            },
        )?;
        let status = self
            .group
            .child()
            .wait()
            .await
            .map_err(|_| ToolError::Failed("tool could not be waited for".into()))?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Kills the command and everything in its process group, and reaps it.
    async fn kill(&mut self) {
        self.group.kill().await;
    }
}

impl Output {
    fn into_result(self, tool: &CommandTool) -> Result<Value, ToolError> {
        if self.status.success() {
            return crate::json::parse(&self.stdout, crate::json::MAX_DEPTH).map_err(|e| match e {
                crate::json::JsonError::Syntax => {
                    ToolError::Failed("tool returned invalid JSON".into())
                }
                other => ToolError::Failed(format!("in the tool's result, {other}")),
            });
        }
        let line = last_line(&self.stderr);
        tracing::warn!(
            tool = %format_args!("{}.{}", tool.namespace, tool.name),
            status = %self.status,
            stderr = line.as_deref().unwrap_or(""),
            "command tool failed"
        );
        Err(ToolError::Failed(failure_message(
            self.status,
            line.filter(|_| tool.expose_stderr),
        )))
    }
}

/// The guest's message for a command that did not exit with status 0: the signal that
/// killed it, else `stderr_line` (the last stderr line, given only when the tool exposes
/// it), else the exit status.
fn failure_message(status: ExitStatus, stderr_line: Option<String>) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("tool was killed by signal {signal}");
        }
    }
    if let Some(line) = stderr_line {
        return line;
    }
    match status.code() {
        Some(code) => format!("tool exited with status {code}"),
        None => "tool failed".to_owned(),
    }
}

/// The last non-empty line of `stderr`, trimmed, without control characters, at most
/// [`MAX_ERROR_CHARS`] characters.
fn last_line(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Some(
        line.chars()
            .filter(|c| !c.is_control())
            .take(MAX_ERROR_CHARS)
            .collect(),
    )
}

/// Reads `reader` to its end, failing as soon as it yields more than `cap` bytes.
async fn read_capped<R: AsyncRead + Unpin>(
    reader: Option<R>,
    cap: usize,
) -> Result<Vec<u8>, ToolError> {
    let Some(mut reader) = reader else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut chunk = vec![0; READ_CHUNK];
    loop {
        let n = reader
            .read(&mut chunk)
            .await
            .map_err(|_| ToolError::Failed("tool output could not be read".into()))?;
        if n == 0 {
            return Ok(out);
        }
        if n > cap - out.len() {
            return Err(ToolError::Failed(format!(
                "tool output exceeds {cap} bytes"
            )));
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

/// Reads `reader` to its end (or first error), keeping only the last `keep` bytes.
async fn read_tail<R: AsyncRead + Unpin>(reader: Option<R>, keep: usize) -> Vec<u8> {
    let Some(mut reader) = reader else {
        return Vec::new();
    };
    let mut tail = Vec::new();
    let mut chunk = vec![0; READ_CHUNK];
    while let Ok(n @ 1..) = reader.read(&mut chunk).await {
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > keep {
            tail.drain(..tail.len() - keep);
        }
    }
    tail
}

/// Writes `input` to the command's stdin and closes it. A command that exits without
/// reading its input is not an error here; its exit status speaks for it.
async fn write_input(stdin: Option<ChildStdin>, input: &[u8]) {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(input).await;
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;

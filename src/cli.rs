//! Command-line arguments (clap). Kept apart from the settings the commands resolve them to.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Run untrusted Python behind a real isolation boundary.
#[derive(Debug, Parser)]
#[command(name = "pycage", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run Python code in a fresh sandbox.
    Run(Box<RunArgs>),
    /// Finish a run that stopped at a call waiting for approval (`pycage run --approve TOOL
    /// --suspend-out FILE`): re-execute it deterministically, answer the calls before from
    /// its journal, give the pending call the decision, and go on.
    Resume(Box<ResumeArgs>),
    /// Print what a model is told about a `run_python` tool with these flags: the text and
    /// the input schema, generated from the sandbox itself.
    Describe(Box<DescribeArgs>),
    /// An interactive session on a terminal: state persists between entries, each run has the
    /// limits the flags set.
    Repl(Box<ReplArgs>),
    /// Serve the `run_python` tool over the Model Context Protocol on stdin and stdout (for
    /// an MCP client's configuration); logs go to stderr.
    Mcp(Box<McpArgs>),
    /// Serve the HTTP API (`POST /v1/runs`, sessions, the description, health) on ADDR.
    Serve(Box<ServeArgs>),
    /// Compile the wasm guest now and write the artifact to the cache (or to DIR), so a new
    /// process, container or replica serves its first run in milliseconds.
    Prepare(PrepareArgs),
    /// Measure pycage side by side with native baselines on this machine.
    Bench(BenchArgs),
    /// Run programs deterministically and print each one's fuel, stdout digest and status:
    /// a cost that does not depend on the machine or its load.
    Meter(Box<MeterArgs>),
    /// List every backend: whether it isolates, and whether it can run here (and why not).
    Backends(BackendsArgs),
    /// Build a guest with pure-Python packages baked in (`guest build`), or print a guest
    /// file's manifest (`guest info`).
    #[command(subcommand)]
    Guest(GuestCommand),
    /// The layered backend's worker (started by pycage itself inside bubblewrap; Unix only).
    #[cfg(unix)]
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(Debug, Subcommand)]
pub enum GuestCommand {
    /// Build a guest: resolve the packages with pip (pure-Python wheels only, pinned by
    /// version and hash), bake them into the sandbox, preload the modules named, and write
    /// GUEST.wasm and its manifest (GUEST.wasm.json).
    Build(GuestBuildArgs),
    /// Print a guest file's manifest (after checking the file).
    Info(GuestInfoArgs),
}

#[derive(Debug, Args)]
pub struct GuestBuildArgs {
    /// A requirements file for pip (repeatable).
    #[arg(long = "requirements", short = 'r', value_name = "FILE")]
    pub requirements: Vec<PathBuf>,

    /// A package to bake in, NAME or NAME==VERSION (repeatable).
    #[arg(long = "package", value_name = "SPEC")]
    pub packages: Vec<String>,

    /// A module to import when the guest is built, so that importing it in a run is free
    /// (repeatable; dotted names allowed).
    #[arg(long = "preload", value_name = "MODULE")]
    pub preload: Vec<String>,

    /// Where to write the guest.
    #[arg(short = 'o', long = "out", value_name = "GUEST.wasm")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct GuestInfoArgs {
    /// The guest file.
    pub guest: PathBuf,

    /// Print the manifest as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Write the artifact into DIR instead of the cache directory (PYCAGE_CACHE_DIR, else the
    /// user's cache); serve with PYCAGE_CACHE_DIR=DIR to use it. DIR may be read-only then.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BackendsArgs {
    /// Print the table as one JSON array.
    #[arg(long)]
    pub json: bool,
}

#[cfg(unix)]
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The prepared, read-only artifact cache.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Samples per latency case.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,

    /// How long each throughput case runs, with a unit.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub duration: Duration,

    /// Idle time before each sample of the sandbox latency cases, with a unit (default: none,
    /// samples back to back). Back to back, a run finds the caches warm from the run before;
    /// an idle gap measures runs that arrive now and then, as an agent's do.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub idle: Duration,

    /// The native Python for the baselines.
    #[arg(long, default_value = "python3")]
    pub python: String,

    /// Run only the cases whose name contains this.
    #[arg(long)]
    pub only: Option<String>,

    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,

    /// An MCP server with an `echo(message)` tool (for example the reference
    /// `mcp-server-everything stdio`), started as `pycage mcp --upstream up='COMMAND'` for
    /// the `mcp_upstream` row; without it that row is left out.
    #[arg(long, value_name = "COMMAND")]
    pub upstream: Option<String>,

    /// A guest file (`pycage guest build`), or `data` (the data guest): adds the `guest_*`
    /// rows, which measure it side by side with the built-in guest (compile, fresh `pass`, a
    /// preloaded import, memory).
    #[arg(long, value_name = "GUEST.wasm")]
    pub guest: Option<PathBuf>,

    /// A Python with peer sandboxes installed (pydantic-monty; `scripts/peers` makes a venv
    /// of them): adds the `peers_*` rows, each snippet run fresh by pycage and by each peer,
    /// one sample of each in turn.
    #[arg(long, value_name = "PYTHON")]
    pub peers: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A Python file to run, or `-` for standard input.
    #[arg(
        value_name = "FILE",
        required_unless_present = "code",
        conflicts_with = "code"
    )]
    pub file: Option<PathBuf>,

    /// The code to run, given on the command line.
    #[arg(short = 'c', long = "code", value_name = "CODE")]
    pub code: Option<String>,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// An initial global variable, NAME=JSON (repeatable): --var base=21 --var name='"Ada"'.
    #[arg(long = "var", value_name = "NAME=JSON")]
    pub vars: Vec<String>,

    /// An input file in the code's working directory (repeatable): NAME=PATH puts the host
    /// file PATH at NAME; a bare PATH uses the file's own name.
    #[arg(long = "file", value_name = "NAME=PATH")]
    pub files: Vec<String>,

    /// Calls of this tool (`name` or `ns.name`, exposed) wait for a person's approval
    /// (repeatable): the run stops at the first such call and comes back suspended, for
    /// `pycage resume`.
    #[arg(long = "approve", value_name = "TOOL")]
    pub approve: Vec<String>,

    /// Answer the tool calls from this journal (`--journal-out` of an earlier run, same key)
    /// while they match it, without calling the tools; the rest go live.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,

    /// With --replay, at a call that differs from the journal: `fail` the run
    /// (`replay_diverged`) or go `live` from there [default: fail].
    #[arg(long = "on-divergence", value_name = "WHAT", requires = "replay")]
    pub on_divergence: Option<Divergence>,

    #[command(flatten)]
    pub journal: JournalArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// What a replay does at a call that differs from its journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Divergence {
    /// The run fails with `replay_diverged`, naming both calls.
    Fail,
    /// That call and the later ones go to the live tools.
    Live,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The suspended run: the file `--suspend-out` wrote, or a `--json` result holding it
    /// (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    #[command(flatten)]
    pub decision: DecisionArgs,

    /// The oldest a suspended state may be to resume, with a unit [default: 24h]. Each
    /// state resumes once, whatever its outcome.
    #[arg(long = "max-age", value_name = "DURATION", value_parser = parse_duration)]
    pub max_age: Option<Duration>,

    /// The sandbox flags of the suspended run (its tools and policy); the seed is the
    /// state's unless given.
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub journal: JournalArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// The decision for a suspended run's pending call: exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct DecisionArgs {
    /// The tool runs now; the code gets its result.
    #[arg(long)]
    pub approve: bool,

    /// The tool does not run; the code gets a ToolError of kind `denied`.
    #[arg(long)]
    pub deny: bool,

    /// The tool does not run; the code gets this JSON as its result.
    #[arg(long, value_name = "JSON")]
    pub answer: Option<String>,
}

/// Where a run's journal and suspended state go, and the key that signs them.
#[derive(Debug, Args)]
pub struct JournalArgs {
    /// Record the run's tool calls as a signed JSON journal in FILE (for --replay).
    #[arg(long = "journal-out", value_name = "FILE")]
    pub journal_out: Option<PathBuf>,

    /// When the run stops at a call waiting for approval, write its signed state to FILE
    /// (for `pycage resume`).
    #[arg(long = "suspend-out", value_name = "FILE")]
    pub suspend_out: Option<PathBuf>,

    /// The key file that signs journals and suspended runs and checks those given back
    /// [default: journal.key in the user's config directory, made on first use].
    #[arg(long = "journal-key", value_name = "FILE")]
    pub journal_key: Option<PathBuf>,
}

/// How a run's result is reported.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Write the files the code created or changed into DIR (created if missing).
    #[arg(long = "out-dir", value_name = "DIR")]
    pub out_dir: Option<PathBuf>,

    /// With --out-dir, replace files that are already there.
    #[arg(long, requires = "out_dir")]
    pub force: bool,

    /// With --json, include each produced file's bytes (base64); without it, paths and sizes.
    #[arg(long = "json-files", requires = "json")]
    pub json_files: bool,

    /// Print the whole result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// A server config TOML: backend, tools, policy, limits, the maxima a call may ask for,
    /// sessions and runs (see the README). The flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Calls of this allowed tool wait for a person's approval (repeatable; replaces the
    /// file's `[policy] approve`): the run comes back suspended, for `resume_run`.
    #[arg(long = "approve", value_name = "TOOL")]
    pub approve: Vec<String>,

    /// The most runs at once; a call beyond them waits up to --queue-timeout, then fails as
    /// `busy` [default: 4].
    #[arg(long = "max-concurrent", value_name = "N")]
    pub max_concurrent: Option<usize>,

    /// How long a call waits for a free run slot, with a unit [default: 5s].
    #[arg(long = "queue-timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub queue_timeout: Option<Duration>,

    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (`127.0.0.1:8080`; port 0
    /// picks one, printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// With --listen: a file holding the bearer token every request must carry (required to
    /// listen on an address that is not loopback).
    #[arg(long = "token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// With --listen: also accept this `Host` (repeatable; loopback names always are).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,

    /// With --listen: also accept this browser `Origin`, `https://app.example:443` or with
    /// port `*` (repeatable; loopback origins always are).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,

    /// Code mode: start the MCP server COMMAND (split like a shell, none run), or connect to
    /// one at an `http://` URL (streamable HTTP), and let the code call its tools as
    /// `NAME.tool(...)`, each allowed like any tool (`--allow NAME.tool` or `--namespace
    /// NAME`). Repeatable; adds to the file's `[[upstream]]`.
    #[arg(long = "upstream", value_name = "NAME='COMMAND ARGS'|NAME=URL", value_parser = pycage_server::UpstreamConfig::parse_flag)]
    pub upstreams: Vec<pycage_server::UpstreamConfig>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The same server config TOML as `pycage mcp --config` takes; the flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Calls of this allowed tool wait for a person's approval (repeatable; replaces the
    /// file's `[policy] approve`): the run comes back suspended, for `POST /v1/runs/{id}/resume`.
    #[arg(long = "approve", value_name = "TOOL")]
    pub approve: Vec<String>,

    /// Listen here (`127.0.0.1:8080`; port 0 picks one, printed on stderr) [default: the
    /// file's `[http] listen`, else 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// The most runs at once [default: 4].
    #[arg(long = "max-concurrent-runs", value_name = "N")]
    pub max_concurrent_runs: Option<usize>,

    /// How many runs may wait for a slot; beyond them a request gets 429 at once
    /// [default: 16 per core].
    #[arg(long = "max-queued", value_name = "N")]
    pub max_queued: Option<usize>,

    /// A file holding the bearer token every request must carry (required unless
    /// --insecure-no-auth; /healthz, /readyz and /metrics need none).
    #[arg(long = "token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Serve without a token: only for a network that only trusted clients reach (behind an
    /// authenticating proxy, or loopback on a machine with no other users). Anyone who
    /// reaches the address runs code.
    #[arg(long = "insecure-no-auth")]
    pub insecure_no_auth: bool,

    /// Also accept this `Host`, `name` (any port) or `name:port` (repeatable; `localhost`
    /// and IP addresses always are). Others get 403, against DNS rebinding.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,

    /// Also accept requests from a browser page of this `Origin`, `https://app.example`,
    /// `https://app.example:8443` or `http://app.example:*` (repeatable; loopback origins
    /// always are). Others get 403.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,

    /// After SIGTERM or SIGINT, how long the runs in flight may take to finish before they
    /// are cancelled, with a unit [default: 30s].
    #[arg(long = "shutdown-grace", value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_grace: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ReplArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Describe calls that share a session (state and files persist) rather than one-shot
    /// runs.
    #[arg(long)]
    pub session: bool,

    /// Print the description as one JSON object: `name`, `description` (the text),
    /// `input_schema`, and what they were made from.
    #[arg(long)]
    pub json: bool,
}

/// The sandbox a command runs code in: tools, limits and backend. `run` and `describe` take
/// the same flags, so a description is of the sandbox a run with those flags gets.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// A TOML file declaring command tools (repeatable). Built-in tools are always registered.
    #[arg(long = "tools", value_name = "FILE")]
    pub tools: Vec<PathBuf>,

    /// Let the code make HTTP(S) requests to this host through the `net.fetch` tool
    /// (repeatable): `example.com`, `*.example.com`, with `:PORT` or `https://` to narrow.
    /// Exposes the tool. Everything else stays unreachable.
    #[arg(long = "net-allow", value_name = "HOST[:PORT]")]
    pub net_allow: Vec<String>,

    /// Give a bubblewrap or docker sandbox the network, unfiltered: bubblewrap shares the
    /// host's network namespace (the host's loopback services included), docker joins the
    /// default bridge. Off by default; --net-allow is the way to reach a list of hosts.
    #[arg(long = "allow-network")]
    pub allow_network: bool,

    /// Let `net.fetch` connect to this internal range (loopback, private, ...), which is
    /// refused by default even for an allowed host: `127.0.0.1/32` (repeatable).
    #[arg(long = "net-allow-address", value_name = "CIDR")]
    pub net_allow_address: Vec<String>,

    /// A secret for `net.fetch`: NAME=ENV_VAR@HOST[,HOST...] (repeatable). The code writes
    /// `PYCAGE_SECRET_NAME` where the value goes; the host puts the value of ENV_VAR in, for
    /// those hosts only, and the code never sees it.
    #[arg(long = "secret", value_name = "NAME=ENV_VAR@HOSTS")]
    pub secrets: Vec<String>,

    /// Expose the tools of this namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// Expose this tool, `name` or `ns.name` (repeatable); with --namespace, narrow to these.
    #[arg(long = "allow", value_name = "TOOL")]
    pub allow: Vec<String>,

    /// Wall-clock limit, with a unit: 500ms, 5s, 2m [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Fuel budget (about one unit per wasm instruction) [default: unlimited, still measured].
    #[arg(long, value_name = "N")]
    pub fuel: Option<u64>,

    /// Memory limit: bytes or with a unit, 256MiB [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,

    /// Bytes kept of each of stdout and stderr: 64KiB [default: 64KiB].
    #[arg(long = "max-output", value_name = "SIZE", value_parser = parse_size)]
    pub max_output: Option<u64>,

    /// The most tool calls the run may make [default: 100].
    #[arg(long = "max-tool-calls", value_name = "N")]
    pub max_tool_calls: Option<u32>,

    /// The most bytes the code may write to its files [default: 32MiB].
    #[arg(long = "max-written", value_name = "SIZE", value_parser = parse_size)]
    pub max_written: Option<u64>,

    /// The most files and directories in the working directory [default: 1000].
    #[arg(long = "max-files", value_name = "N")]
    pub max_files: Option<u32>,

    /// The sandbox backend (`pycage backends` shows which can run here) [default: wasm].
    #[arg(long, value_name = "NAME", value_parser = backend_kind())]
    pub backend: Option<pycage::BackendKind>,

    /// Accept a backend without an isolation boundary (`local`): the code runs with your
    /// user's files, network and processes.
    #[arg(long = "allow-no-isolation")]
    pub allow_no_isolation: bool,

    /// Make the run reproducible (wasm backend): virtual clocks from 2000-01-01, seeded
    /// random bytes, NaNs canonicalized; same inputs give the same output and fuel.
    #[arg(long)]
    pub deterministic: bool,

    /// The seed of a deterministic run's random bytes (implies --deterministic) [default: 0].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Run this guest instead of the built-in one (wasm backend): a guest file with packages
    /// baked in, checked before use (its digest, the pycage version that built it, and its
    /// imports); or `data`, the data guest (numpy and pandas, preloaded), built into the cache
    /// the first time it is named (a file called data is `./data`) [default: the built-in
    /// guest].
    #[arg(long, value_name = "FILE")]
    pub guest: Option<std::path::PathBuf>,
}

impl SandboxArgs {
    /// The deterministic mode's seed, if the flags ask for deterministic runs.
    pub fn seed(&self) -> Option<u64> {
        (self.deterministic || self.seed.is_some()).then(|| self.seed.unwrap_or(0))
    }
}

#[derive(Debug, Args)]
pub struct MeterArgs {
    /// Python files to run, each in a fresh deterministic sandbox.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,

    /// Print one JSON object per program, on one line each.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    pycage_tools::units::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_size(s: &str) -> Result<u64, String> {
    pycage_tools::units::parse_size(s).map_err(|e| e.to_string())
}

/// `--backend`'s parser: one of [`pycage::BackendKind`]'s names, which clap lists in help
/// and in its error for any other.
fn backend_kind() -> impl clap::builder::TypedValueParser<Value = pycage::BackendKind> {
    use clap::builder::TypedValueParser as _;
    let names = pycage::BackendKind::ALL.map(pycage::BackendKind::name);
    clap::builder::PossibleValuesParser::new(names)
        .try_map(|name| name.parse::<pycage::BackendKind>())
}

//! `pycage`: run untrusted Python in a sandbox from the command line.

mod backends;
mod bench;
mod cli;
mod describe;
mod exit;
mod guest;
mod mcp;
mod meter;
mod prepare;
mod repl;
mod report;
mod resume;
mod run;
mod sandbox;
mod serve;
#[cfg(unix)]
mod worker;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::exit::Exit;

/// The static musl build's allocator (see Cargo.toml: musl's own is much slower here).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The environment variable that sets the log filter (for example `pycage::audit=info`).
const ENV_LOG: &str = "PYCAGE_LOG";

fn main() -> ExitCode {
    // Before any HTTP client exists (an MCP upstream's, net.fetch's): see the function.
    pycage_tools::net::install_crypto_provider();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Ok.into()
            };
        }
    };
    // `run`, `describe` and `worker` run one guest and exit; the others may run many at once.
    let one_run = match &cli.command {
        Command::Run(_)
        | Command::Resume(_)
        | Command::Describe(_)
        | Command::Repl(_)
        | Command::Meter(_) => true,
        #[cfg(unix)]
        Command::Worker(_) => true,
        Command::Mcp(_)
        | Command::Serve(_)
        | Command::Prepare(_)
        | Command::Bench(_)
        | Command::Backends(_)
        | Command::Guest(_) => false,
    };
    if one_run {
        one_malloc_arena();
    }
    init_logging();
    let runtime = match runtime(one_run) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pycage: cannot start the async runtime: {e}");
            return Exit::Internal.into();
        }
    };
    runtime.block_on(async {
        let mut command = cli.command;
        if let Err((exit, message)) = data_guest(&mut command).await {
            eprintln!(
                "pycage: --guest {}: {message}",
                pycage_server::config::DATA_GUEST
            );
            return exit.into();
        }
        match command {
            Command::Run(args) => run::run(*args).await.into(),
            Command::Resume(args) => resume::resume(*args).await.into(),
            Command::Describe(args) => describe::describe(*args).await.into(),
            Command::Repl(args) => repl::repl(*args).await.into(),
            Command::Mcp(args) => mcp::mcp(*args).await.into(),
            Command::Serve(args) => serve::serve(*args).await.into(),
            Command::Prepare(args) => prepare::prepare(args).await.into(),
            Command::Bench(args) => bench::bench(args).await.into(),
            Command::Meter(args) => meter::meter(*args).await.into(),
            Command::Backends(args) => backends::list(args).into(),
            Command::Guest(command) => guest::guest(command).await.into(),
            #[cfg(unix)]
            Command::Worker(args) => worker::worker(args).await,
        }
    })
}

/// The async runtime. One run needs no worker threads: its guest, its broker and its timers
/// share the thread that waits for it (a guest yields at each epoch tick or fuel slice, so the
/// wall clock still fires). Not starting a worker per core took `pycage run -c pass` from
/// 11.3-12.3 ms to 10.8-11.6 ms (five interleaved rounds of 40, on top of one arena).
fn runtime(one_run: bool) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if one_run {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build()
}

/// Keeps a one-run process's allocations in glibc's main arena. By default glibc gives each
/// new thread an arena of its own and grows a thread's arena one `mprotect` at a time: loading
/// the cached guest on tokio's blocking thread made about 180 of them (207 `mprotect` calls in
/// a `pycage run -c pass`, 22 with one arena). Side by side, four interleaved rounds of 40:
/// `pycage run -c pass` took 10.1-11.1 ms instead of 10.8-12.7 ms. Processes that run many
/// guests at once keep glibc's default: with one arena, `pycage bench`'s 2- and 8-caller
/// throughput was 3-5% lower. It must run before the first thread starts.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator parameter; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn init_logging() {
    let Ok(filter) = std::env::var(ENV_LOG) else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        Err(e) => eprintln!("pycage: ignoring {ENV_LOG}={filter:?}: {e}"),
    }
}

/// `--guest data`: the data guest's path in the name's place, built first if need be (see
/// [`guest::resolve_data_guest`]). A server's config file may name it too;
/// `sandbox::prepare_server_guest` resolves that after the file is read.
async fn data_guest(command: &mut Command) -> Result<(), guest::Failed> {
    let slot = match command {
        Command::Run(args) => &mut args.sandbox.guest,
        Command::Resume(args) => &mut args.sandbox.guest,
        Command::Describe(args) => &mut args.sandbox.guest,
        Command::Repl(args) => &mut args.sandbox.guest,
        Command::Mcp(args) => &mut args.sandbox.guest,
        Command::Serve(args) => &mut args.sandbox.guest,
        Command::Meter(args) => &mut args.sandbox.guest,
        Command::Bench(args) => &mut args.guest,
        _ => return Ok(()),
    };
    guest::resolve_data_guest(slot).await
}

//! `pycage`: run untrusted Python in a sandbox from the command line.

mod backends;
mod bench;
mod cli;
mod exit;
mod report;
mod run;
mod worker;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::exit::Exit;

/// The environment variable that sets the log filter (for example `pycage::audit=info`).
const ENV_LOG: &str = "PYCAGE_LOG";

fn main() -> ExitCode {
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
    if matches!(cli.command, Command::Run(_) | Command::Worker(_)) {
        one_malloc_arena();
    }
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pycage: cannot start the async runtime: {e}");
            return Exit::Internal.into();
        }
    };
    runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await.into(),
            Command::Bench(args) => bench::bench(args).await.into(),
            Command::Backends(args) => backends::list(args).into(),
            Command::Worker(args) => worker::worker(args).await,
        }
    })
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

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

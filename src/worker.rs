//! `pycage worker`: the layered backend's worker, started by pycage inside bubblewrap.

use std::process::ExitCode;

use crate::cli::WorkerArgs;

pub async fn worker(args: WorkerArgs) -> ExitCode {
    let status = pycage::os::worker::serve(std::io::stdin().lock(), &args.cache_dir).await;
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

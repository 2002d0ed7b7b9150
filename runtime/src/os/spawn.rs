//! Spawning one sandboxed process tree: input on stdin, output captured with caps, a wall
//! deadline, and every process of the tree killed and reaped at the end.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::cgroup::RunCgroup;
use super::container::{Container, ContainerGuard, remove_container};
use pycage_tools::process::ProcessGroup;

use crate::capture::{CapturePipe, Captured};

/// How long output is still drained after the tree is gone (a descendant that escaped every
/// kill could hold a pipe open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// One command to run.
#[derive(Debug, Clone)]
pub(crate) struct SpawnSpec {
    /// The command line; `argv[0]` is an absolute path.
    pub argv: Vec<OsString>,
    /// The whole environment (the host's is cleared).
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Everything the process reads on stdin (then end of file).
    pub stdin: Vec<u8>,
    /// The cap on each of stdout and stderr.
    pub output_cap: u64,
    /// Counts stdout and stderr bytes as they arrive.
    pub output_meter: Option<crate::OutputMeter>,
    /// When the process is killed if it has not exited.
    pub deadline: Instant,
}

/// What else may hold the run's processes, beyond the child's process group.
#[derive(Debug, Default)]
pub(crate) struct Containment<'a> {
    /// The run's cgroups.
    pub cgroup: Option<&'a RunCgroup>,
    /// A Docker container.
    pub container: Option<&'a Container>,
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited (or was killed by a signal) before the deadline.
    Exited(ExitStatus),
    /// The deadline passed; it was killed.
    TimedOut,
}

/// The end of a spawned tree and its output.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub ended: Ended,
    pub stdout: Captured,
    pub stderr: Captured,
}

/// Runs `spec` to its end. The child leads a new process group; when it ends (or the
/// deadline passes) that group, the cgroup and the container are killed, so nothing of the
/// run outlives this call, and the child is reaped.
///
/// # Errors
///
/// When the command cannot be started.
pub(crate) async fn run(spec: SpawnSpec, contain: Containment<'_>) -> std::io::Result<Spawned> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command line"))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut group = ProcessGroup::spawn(command)?;
    let child = group.child();
    let mut guard = ContainerGuard(contain.container);

    let stdin = child.stdin.take();
    let input = spec.stdin;
    let feeder = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A child that exits early closes its end: not an error of ours.
            let _ = stdin.write_all(&input).await;
        }
    });
    let stdout = CapturePipe::new(spec.output_cap);
    let stderr = CapturePipe::new(spec.output_cap);
    if let Some(meter) = &spec.output_meter {
        meter.attach(&stdout, &stderr);
    }
    let pumps = [
        child
            .stdout
            .take()
            .map(|s| tokio::spawn(pump(s, stdout.clone()))),
        child
            .stderr
            .take()
            .map(|s| tokio::spawn(pump(s, stderr.clone()))),
    ];

    let ended = match tokio::time::timeout_at(spec.deadline.into(), child.wait()).await {
        Ok(Ok(status)) => Ended::Exited(status),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "pycage: waiting for a sandboxed process failed");
            Ended::TimedOut
        }
        Err(_) => Ended::TimedOut,
    };
    kill_tree(&group, &contain, ended).await;
    guard.0 = None;
    if ended == Ended::TimedOut {
        let _ = group.child().start_kill();
        let _ = group.child().wait().await;
    }
    feeder.abort();
    for pump in pumps.into_iter().flatten() {
        if tokio::time::timeout(DRAIN_GRACE, pump).await.is_err() {
            tracing::warn!("pycage: a sandboxed process's output stayed open after the run");
        }
    }
    Ok(Spawned {
        ended,
        stdout: stdout.captured(),
        stderr: stderr.captured(),
    })
}

/// Kills whatever the run left: the process group, the cgroup's members, the container.
async fn kill_tree(group: &ProcessGroup, contain: &Containment<'_>, ended: Ended) {
    // After the leader's exit, what it started may still run in its group.
    group.kill_group();
    if let Some(cgroup) = contain.cgroup {
        cgroup.kill_all();
    }
    // `docker run --rm` removes a container that ended normally before the client exits; one
    // whose client was killed, or that failed, is removed here.
    let clean_exit = matches!(ended, Ended::Exited(s) if s.success());
    if let Some(c) = contain.container
        && !clean_exit
    {
        let killed = Command::from(remove_container(c))
            .kill_on_drop(true)
            .status();
        if tokio::time::timeout(Duration::from_secs(10), killed)
            .await
            .map_or(true, |s| s.is_err())
        {
            tracing::error!("pycage: a sandbox container could not be removed");
        }
    }
}

/// Copies a stream into a capture pipe (which keeps head and tail within its cap) until the
/// stream ends.
async fn pump<R: AsyncRead + Unpin>(mut stream: R, pipe: CapturePipe) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pipe.push(&buf[..n]),
        }
    }
}

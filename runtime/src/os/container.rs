//! A Docker run's container: its name and engine, its removal, and what the engine recorded
//! of it. The docker backend names the container; the spawner removes it; the classifier asks
//! whether the engine killed it for memory. Off Unix nothing runs a container (the docker
//! backend is unavailable there), so only the docker backend's renderer uses this.
#![cfg_attr(not(unix), allow(dead_code))]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A run's container, and how to reach the engine that runs it.
#[derive(Debug, Clone)]
pub(crate) struct Container {
    /// The container's name.
    pub name: String,
    /// The `docker` client's absolute path.
    pub docker: PathBuf,
    /// The client's environment (where the engine is: `DOCKER_HOST`, ...).
    pub env: Vec<(String, String)>,
}

/// `docker rm --force` for the run's container, silent, in the container's environment.
pub(crate) fn remove_container(c: &Container) -> std::process::Command {
    let mut rm = std::process::Command::new(&c.docker);
    rm.args(["rm", "--force", c.name.as_str()])
        .env_clear()
        .envs(c.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    rm
}

/// Removes a run's container if the run is dropped before its end (a cancelled future).
pub(crate) struct ContainerGuard<'a>(pub Option<&'a Container>);

impl Drop for ContainerGuard<'_> {
    fn drop(&mut self) {
        let Some(c) = self.0 else {
            return;
        };
        let spawned = remove_container(c).spawn();
        match spawned {
            // Reaped on a thread of its own: a destructor must not block.
            Ok(mut child) => {
                std::thread::spawn(move || child.wait());
            }
            Err(e) => {
                tracing::error!(error = %e, "pycage: a sandbox container could not be removed")
            }
        }
    }
}

/// True when Docker recorded an out-of-memory kill in `container` since `since` (the
/// container itself is gone: `--rm`).
pub(crate) async fn oom_event(container: &Container, since: SystemTime) -> bool {
    let stamp = |t: SystemTime| {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
    };
    let query = tokio::process::Command::new(&container.docker)
        .args([
            "events",
            "--since",
            &stamp(since),
            "--until",
            &stamp(SystemTime::now()),
            "--filter",
            &format!("container={}", container.name),
            "--filter",
            "event=oom",
            "--format",
            "{{.Status}}",
        ])
        .env_clear()
        .envs(container.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(5), query).await {
        Ok(Ok(out)) => out.status.success() && !out.stdout.trim_ascii().is_empty(),
        _ => false,
    }
}

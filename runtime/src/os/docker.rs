//! The Docker backend: native CPython in a throwaway container per run.
//!
//! # Security
//!
//! Each run is one `docker run --rm -i` of a minimal local image (empty directories only; see
//! `scripts/docker-image`): no network (`--network none`, unless the host opts into the
//! default bridge with [`DockerBackend::allow_network`]), a read-only root
//! (`--read-only`), no capabilities (`--cap-drop ALL`), `no-new-privileges`, the host user's
//! uid and gid, a memory cap without swap (`--memory`, `--memory-swap`), a process cap
//! (`--pids-limit`), `--pull never` (nothing is fetched), a fresh `/tmp` (tmpfs), the host's
//! interpreter directories bound read-only, and the run's private directory (the guest's
//! files and the broker's socket) bound read-only. Inside, `prlimit` (from the bound `/usr`)
//! applies the same per-process rlimits as the other backends. The container is named after
//! the run, removed on a wall-clock timeout (`docker rm --force`) and never left behind.
//!
//! Not protected: the host's kernel is shared, the Docker daemon runs as root (whoever can
//! talk to it owns the host), and the bound system directories are readable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::container::Container;
use super::host_layout::HostLayout;
use super::native::{
    self, DEFAULT_INTERPRETER, GUEST_ENV, GUEST_MOUNT, INTERPRETER_FLAGS, NativeRun, NativeSandbox,
    SandboxCommand,
};
use super::rlimits::{MAX_PROCESSES, PRLIMIT, Rlimits, scratch_bytes};
use crate::Limits;
use crate::backend::{Availability, Backend, Job, RunFuture, Unavailable};
use crate::broker::ToolGate;

/// Where the Docker client is; never looked up on `PATH`.
pub const DOCKER: &str = "/usr/bin/docker";

/// The image `scripts/docker-image` builds: empty directories, nothing else.
pub const DEFAULT_IMAGE: &str = "pycage-sandbox:local";

/// The prefix of every run's container name (`docker ps -a --filter name=pycage-`).
pub const CONTAINER_PREFIX: &str = "pycage-";

/// The host environment the Docker client keeps (where the engine is). None of it reaches
/// the container.
pub const CLIENT_ENV: &[&str] = &["DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "HOME"];

/// What one container run needs. Plain data; [`render_docker`] turns it into argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerSpec {
    /// The image.
    pub image: String,
    /// The container's name.
    pub name: String,
    /// The host user's uid and gid.
    pub user: (u32, u32),
    /// The host's system directories: the real ones are bound read-only (the image mirrors
    /// the links).
    pub layout: HostLayout,
    /// The run directory's host path, bound read-only at [`GUEST_MOUNT`].
    pub run_dir: PathBuf,
    /// The run's limits.
    pub limits: Limits,
    /// The interpreter (inside the bound directories).
    pub interpreter: PathBuf,
    /// Docker's default bridge network instead of none: the code can reach what a
    /// container on the bridge can (the internet through the host's NAT, the host on the
    /// bridge's gateway address), not the host's loopback.
    pub network: bool,
}

/// The `docker run` command line for `spec` (starting with [`DOCKER`]). Pure.
pub fn render_docker(spec: &DockerSpec) -> Vec<OsString> {
    let memory = spec.limits.memory_bytes().to_string();
    let scratch = scratch_bytes(&spec.limits);
    let mut argv: Vec<OsString> = [
        DOCKER,
        "run",
        "--rm",
        "-i",
        "--name",
        &spec.name,
        "--network",
        if spec.network { "bridge" } else { "none" },
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--memory",
        &memory,
        "--memory-swap",
        &memory,
        "--pids-limit",
        &MAX_PROCESSES.to_string(),
        "--pull",
        "never",
        "--user",
        &format!("{}:{}", spec.user.0, spec.user.1),
        "--hostname",
        "pycage",
        "--workdir",
        "/tmp",
        "--tmpfs",
        &format!("/tmp:rw,nosuid,nodev,size={scratch},mode=1777"),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    for dir in spec.layout.real_dirs() {
        argv.extend(["--volume".into(), format!("{dir}:{dir}:ro").into()]);
    }
    let mut volume = spec.run_dir.as_os_str().to_owned();
    volume.push(format!(":{GUEST_MOUNT}:ro"));
    argv.extend(["--volume".into(), volume]);
    for (k, v) in GUEST_ENV.iter().chain([&("HOME", "/tmp")]) {
        argv.extend(["--env".into(), format!("{k}={v}").into()]);
    }
    argv.push(spec.image.clone().into());
    // The process count is the container's (`--pids-limit`); the rest are per process.
    let mut program = vec![spec.interpreter.as_os_str().to_owned()];
    program.extend(INTERPRETER_FLAGS.iter().map(OsString::from));
    program.push(
        Path::new(GUEST_MOUNT)
            .join("pycage_socket.py")
            .into_os_string(),
    );
    argv.extend(Rlimits::for_limits(&spec.limits, None).wrap(program));
    argv
}

/// The Docker backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    image: String,
    interpreter: PathBuf,
    layout: Arc<HostLayout>,
    network: bool,
}

impl Default for DockerBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl DockerBackend {
    /// The backend with [`DEFAULT_IMAGE`] and the system's Python.
    pub fn new() -> Self {
        Self::with_image(DEFAULT_IMAGE)
    }

    /// The backend with another local image (it must mirror the host's system directory
    /// links, as `scripts/docker-image` does).
    pub fn with_image(image: impl Into<String>) -> Self {
        DockerBackend {
            image: image.into(),
            interpreter: DEFAULT_INTERPRETER.into(),
            layout: Arc::new(HostLayout::probe()),
            network: false,
        }
    }

    /// With `allow`, containers join Docker's default bridge network instead of none: the
    /// code can open connections to whatever the bridge reaches (the internet through the
    /// host's NAT, the host at the bridge's gateway address). Off by default; the
    /// `net.fetch` tool is the way to reach a list of hosts.
    #[must_use]
    pub fn allow_network(mut self, allow: bool) -> Self {
        self.network = allow;
        self
    }

    /// The image runs use.
    pub fn image(&self) -> &str {
        &self.image
    }

    fn client_env() -> Vec<(String, String)> {
        CLIENT_ENV
            .iter()
            .filter_map(|k| Some(((*k).to_owned(), std::env::var(k).ok()?)))
            .collect()
    }

    fn docker_ok(&self, args: &[&str]) -> Result<(), String> {
        let out = std::process::Command::new(DOCKER)
            .args(args)
            .env_clear()
            .envs(Self::client_env())
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

impl NativeSandbox for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    /// The file checks only: asking the daemon would cost a round trip per run, and a daemon
    /// or image problem already fails `docker run` itself as a sandbox failure.
    fn preflight(&self) -> Result<(), Unavailable> {
        if !Path::new(DOCKER).is_file() {
            return Err(Unavailable::missing(format!("binary missing: {DOCKER}")));
        }
        if !self.interpreter.exists() || !Path::new(PRLIMIT).is_file() {
            return Err(Unavailable::missing(format!(
                "interpreter or prlimit missing: {} {PRLIMIT}",
                self.interpreter.display()
            )));
        }
        Ok(())
    }

    fn guest_dir(&self, _host_dir: &Path) -> PathBuf {
        PathBuf::from(GUEST_MOUNT)
    }

    fn command(&self, run: &NativeRun<'_>) -> Result<SandboxCommand, String> {
        let name = format!("{CONTAINER_PREFIX}{}", run.tag);
        let spec = DockerSpec {
            image: self.image.clone(),
            name: name.clone(),
            user: (super::sys::uid(), super::sys::gid()),
            layout: (*self.layout).clone(),
            run_dir: run.host_dir.to_owned(),
            limits: run.limits.clone(),
            interpreter: self.interpreter.clone(),
            network: self.network,
        };
        let env = Self::client_env();
        Ok(SandboxCommand {
            argv: render_docker(&spec),
            env: env.clone(),
            cwd: run.host_dir.to_owned(),
            container: Some(Container {
                name,
                docker: DOCKER.into(),
                env,
            }),
        })
    }

    fn uses_cgroup(&self) -> bool {
        // The container is its own cgroup (`--memory`, `--pids-limit`).
        false
    }
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        if !Path::new(DOCKER).is_file() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "binary missing: {DOCKER}"
            )));
        }
        if !self.interpreter.exists() || !Path::new(PRLIMIT).is_file() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "interpreter or prlimit missing: {} {PRLIMIT}",
                self.interpreter.display()
            )));
        }
        if let Err(why) = self.docker_ok(&["info", "--format", "{{.ServerVersion}}"]) {
            tracing::debug!(why, "pycage: docker info failed");
            if why.to_ascii_lowercase().contains("permission denied") {
                return Availability::Unavailable(Unavailable::refused(
                    "no permission to reach the Docker daemon (docker info fails)",
                ));
            }
            return Availability::Unavailable(Unavailable::refused(
                "daemon down (docker info fails)",
            ));
        }
        if self
            .docker_ok(&["image", "inspect", "--format", "{{.Id}}", &self.image])
            .is_err()
        {
            return Availability::Unavailable(Unavailable::missing(format!(
                "image absent: {} (build it with scripts/docker-image)",
                self.image
            )));
        }
        Availability::Available
    }

    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(native::run(self, job, gate))
    }
}

#[cfg(test)]
#[path = "docker_tests.rs"]
mod tests;

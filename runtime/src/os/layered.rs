//! The layered backend, `wasm+bubblewrap` (Linux): the wasm engine itself runs in a
//! bubblewrap-confined worker process, so an engine bug still lands in an empty namespace;
//! the broker stays in the host.
//!
//! # Security
//!
//! Two boundaries. The guest is the wasm backend's: CPython on WASI with no host syscalls,
//! fuel, memory and wall-clock limits enforced by the engine. The engine runs in a worker
//! process (`<worker executable> worker --cache-dir /run/pycage-cache`) inside the same
//! bubblewrap sandbox as the [`bubblewrap`] backend: new namespaces, no
//! network, no capabilities, an empty file system except read-only binds of the system
//! directories, the worker executable, the prepared artifact cache and the run's socket
//! directory; rlimits (CPU seconds, processes, file size, open files; not address space,
//! which the engine reserves generously) and, where the host allows, a cgroup capping the
//! worker's processes and memory. The host prepares the compiled artifact before the
//! worker starts, so the worker never compiles and never writes the cache.
//!
//! Tool calls cross the same socket protocol as the native backends: the worker's gate
//! forwards each call to the host's broker, which decides. The worker's report (the value,
//! the guest's output, fuel) is untrusted data, checked and capped by the host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::bubblewrap::{self, BwrapSpec, guest_env, render_bwrap};
use super::host_layout::HostLayout;
use super::native::backend_failure;
use super::rlimits::Rlimits;
use crate::backend::{Availability, Backend, Job, RunFuture, Unavailable, UnavailableKind};
use crate::broker::ToolGate;
use crate::wasm::{WasmBackend, WasmError};
use crate::{Limits, RunResult};

/// Where the worker executable appears inside the sandbox.
pub const WORKER_PATH: &str = "/run/pycage-bin/pycage";

/// Where the artifact cache appears inside the sandbox.
pub const CACHE_MOUNT: &str = "/run/pycage-cache";

/// How long after the wall-clock limit the host kills a worker that has not reported (the
/// worker enforces the limit itself; this is the backstop).
pub const WORKER_GRACE: Duration = Duration::from_millis(1500);

/// Memory the worker's own runtime may use on top of the guest's memory limit.
pub const WORKER_OVERHEAD_BYTES: u64 = 512 << 20;

/// The cap on the worker's own stdout and stderr (diagnostics, logged, never shown).
#[cfg(unix)]
const WORKER_DIAGNOSTICS_BYTES: u64 = 16 * 1024;

/// The layered backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LayeredBackend {
    worker: PathBuf,
    cache_dir: PathBuf,
    host: Result<WasmBackend, WasmError>,
    layout: Arc<HostLayout>,
}

impl LayeredBackend {
    /// A backend whose worker is `worker_executable` (an absolute path to an executable that
    /// runs [`worker::serve`](super::worker::serve) as `<exe> worker --cache-dir <dir>`, such
    /// as the `pycage` CLI itself) with compiled artifacts in `cache_dir` (written by the
    /// host, read-only to the worker).
    pub fn new(worker_executable: PathBuf, cache_dir: PathBuf) -> Self {
        let host = worker_backend(&cache_dir);
        LayeredBackend {
            worker: worker_executable,
            cache_dir,
            host,
            layout: Arc::new(HostLayout::probe()),
        }
    }

    /// The whole command line of one run: `prlimit` (without an address-space limit), then
    /// bubblewrap with the worker, the cache and the run directory bound read-only, then the
    /// worker. Pure.
    pub fn render(&self, limits: &Limits, run_dir: &Path, processes: Option<u64>) -> Vec<OsString> {
        render_layered(
            &self.layout,
            &self.worker,
            &self.cache_dir,
            limits,
            run_dir,
            processes,
        )
    }

    /// Off Unix: a `backend_error` (the worker reaches the broker over a Unix socket).
    #[cfg(not(unix))]
    async fn run_job(&self, _job: Job, _gate: Arc<dyn ToolGate>) -> RunResult {
        RunResult::failed(
            self.name(),
            backend_failure("the layered backend cannot run here", "wrong OS"),
            Duration::ZERO,
        )
    }

    #[cfg(unix)]
    async fn run_job(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunResult {
        use std::time::Instant;

        use super::bubblewrap::process_allowance;
        use super::cgroup;
        use super::classify::{self, Reporter};
        use super::native::{GUEST_MOUNT, SOCKET_NAME, run_cgroup, run_sandbox, run_tag};
        use super::run_dir::RunDir;
        use super::server::SocketServer;
        use super::spawn::SpawnSpec;
        use super::worker::WorkerRequest;
        use crate::wasm::ArtifactSource;

        let name = self.name();
        let prep_started = Instant::now();
        let fail = |error| RunResult::failed(name, error, prep_started.elapsed());
        let host = match &self.host {
            Ok(h) => h,
            Err(e) => return fail(backend_failure("the wasm engine could not be created", e)),
        };
        // Compile (or verify) the artifact here, so the worker only maps it. This does not
        // count against the run's wall clock, as for the wasm backend.
        match host.prepare().await {
            Ok(ArtifactSource::CompiledUncached) => {
                return fail(backend_failure(
                    "the layered backend needs a writable artifact cache",
                    self.cache_dir.display(),
                ));
            }
            Ok(_) => {}
            Err(e) => return fail(backend_failure("the wasm guest could not be prepared", e)),
        }
        let started = Instant::now();
        let limits = job.limits.clone();
        let dir = match RunDir::create() {
            Ok(dir) => dir,
            Err(e) => return fail(backend_failure("the run directory could not be created", e)),
        };
        let host_dir = dir.path().to_owned();
        let server = match SocketServer::start(dir, gate, &limits) {
            Ok(s) => s,
            Err(e) => {
                return fail(backend_failure(
                    "the broker's socket could not be opened",
                    e,
                ));
            }
        };
        let tag = match run_tag() {
            Ok(tag) => tag,
            Err(e) => return fail(e),
        };
        let cgroup = match run_cgroup(
            &tag,
            limits.memory_bytes().saturating_add(WORKER_OVERHEAD_BYTES),
        ) {
            Ok(cg) => cg,
            Err(e) => return fail(e),
        };
        let request = WorkerRequest {
            socket: Path::new(GUEST_MOUNT).join(SOCKET_NAME),
            token: server.token().as_str().to_owned(),
            job: job.into(),
        };
        let stdin = match serde_json::to_vec(&request) {
            Ok(s) => s,
            Err(e) => {
                return fail(backend_failure(
                    "the worker's request could not be encoded",
                    e,
                ));
            }
        };
        drop(request);
        let argv = self.render(&limits, &host_dir, Some(process_allowance()));
        let argv = match &cgroup {
            Some(cg) => cgroup::wrap(cg.procs_files(), argv),
            None => argv,
        };
        let spec = SpawnSpec {
            argv,
            env: Vec::new(),
            cwd: host_dir.clone(),
            stdin,
            output_cap: WORKER_DIAGNOSTICS_BYTES,
            // The worker's own diagnostics, not the guest's output (that comes in its result).
            output_meter: None,
            deadline: started + limits.wall_timeout() + WORKER_GRACE,
        };
        let started_at = std::time::SystemTime::now();
        let finished = match run_sandbox(spec, cgroup, None, server, started_at).await {
            Ok(f) => f,
            Err(e) => return fail(backend_failure("the worker could not be started", e)),
        };
        let (outcome, exit, evidence) = (finished.outcome, finished.exit, finished.evidence);
        if outcome.is_none() {
            tracing::warn!(
                ?exit,
                stderr = %finished.stderr.text,
                "pycage: the layered worker ended without a result"
            );
        }
        let report = outcome
            .as_ref()
            .and_then(|o| o.report.clone())
            .unwrap_or_default();
        let value = classify::classify(
            outcome,
            exit,
            evidence,
            Reporter::Worker,
            limits.max_value_bytes(),
        );
        let cap = limits.max_output_bytes();
        RunResult::builder(name, value)
            .stdout(recap(report.stdout, report.stdout_truncated, cap))
            .stderr(recap(report.stderr, report.stderr_truncated, cap))
            .fuel_consumed(report.fuel_consumed)
            .files(report.files)
            .duration(started.elapsed())
            .build()
    }
}

/// The wasm backend a worker uses, and that the host prepares the artifact with: the same
/// engine configuration on both sides, so the cached artifact fits.
///
/// A worker runs one guest, but reserves pooling slots for two: with one, a guest that calls
/// a denied capability (`socket.getaddrinfo`) needs a second fiber and fails with "maximum
/// concurrent limit of 1 for fibers reached".
///
/// # Errors
///
/// When the engine cannot be created.
pub fn worker_backend(cache_dir: &Path) -> Result<WasmBackend, WasmError> {
    WasmBackend::builder()
        .cache_dir(Some(cache_dir.to_owned()))
        .max_instances(2)
        .build()
}

/// The worker's report of the guest's output is untrusted: text over the cap (plus room for
/// the cut marker) is cut again here.
#[cfg(unix)]
fn recap(text: String, truncated: bool, cap: u64) -> crate::capture::Captured {
    use crate::capture::{CapturePipe, Captured};

    const MARKER_ROOM: u64 = 64;
    if (text.len() as u64) <= cap.saturating_add(MARKER_ROOM) {
        return Captured { text, truncated };
    }
    let pipe = CapturePipe::new(cap);
    pipe.push(text.as_bytes());
    Captured {
        text: pipe.captured().text,
        truncated: true,
    }
}

/// The layered command line. Pure.
pub fn render_layered(
    layout: &HostLayout,
    worker: &Path,
    cache_dir: &Path,
    limits: &Limits,
    run_dir: &Path,
    processes: Option<u64>,
) -> Vec<OsString> {
    let spec = BwrapSpec {
        layout: layout.clone(),
        run_dir: Some(run_dir.to_owned()),
        extra_ro_binds: vec![
            (worker.to_owned(), WORKER_PATH.into()),
            (cache_dir.to_owned(), CACHE_MOUNT.into()),
        ],
        tmp_bytes: 16 << 20,
        work_bytes: None,
        env: guest_env(),
        program: vec![
            WORKER_PATH.into(),
            "worker".into(),
            "--cache-dir".into(),
            CACHE_MOUNT.into(),
        ],
        share_net: false,
    };
    let mut rlimits = Rlimits::for_limits(limits, processes);
    // The engine reserves address space for guard regions far beyond what it touches; its
    // memory is capped by the engine's limiter and the cgroup instead.
    rlimits.address_space = None;
    rlimits.file_size = 16 << 20;
    rlimits.wrap(render_bwrap(&spec))
}

impl Backend for LayeredBackend {
    fn name(&self) -> &'static str {
        "wasm+bubblewrap"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        if let Err(e) = &self.host {
            return Availability::Unavailable(Unavailable::refused(format!(
                "the wasm engine cannot start: {e}"
            )));
        }
        if !self.worker.is_absolute() || !self.worker.is_file() {
            return Availability::Unavailable(Unavailable::missing(format!(
                "worker executable missing: {}",
                self.worker.display()
            )));
        }
        if !self.cache_dir.is_absolute() {
            return Availability::Unavailable(Unavailable::new(
                UnavailableKind::Misconfigured,
                "the artifact cache directory must be absolute",
            ));
        }
        let python = Path::new(super::native::DEFAULT_INTERPRETER);
        if let Err(why) = bubblewrap::check_binaries(python, &self.layout) {
            return Availability::Unavailable(why);
        }
        match bubblewrap::probe_namespaces(python, &self.layout) {
            Ok(()) => Availability::Available,
            Err(why) => Availability::Unavailable(why),
        }
    }

    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(self.run_job(job, gate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_runs_in_bubblewrap_with_read_only_binds() {
        let argv: Vec<_> = render_layered(
            &HostLayout::merged_usr(),
            Path::new("/opt/bin/pycage"),
            Path::new("/home/ada/.cache/pycage"),
            &Limits::default(),
            Path::new("/tmp/pycage-abc"),
            Some(80),
        )
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
        assert_eq!(argv[0], super::super::rlimits::PRLIMIT);
        assert!(
            !argv.iter().any(|a| a.starts_with("--as=")),
            "no address-space cap"
        );
        assert!(argv.iter().any(|a| a == "--nproc=80"));
        assert!(argv.iter().any(|a| a == bubblewrap::BWRAP));
        assert!(argv.iter().any(|a| a == "--unshare-all"));
        let ro: Vec<_> = argv
            .windows(3)
            .filter(|w| w[0] == "--ro-bind")
            .map(|w| (w[1].as_str(), w[2].as_str()))
            .collect();
        assert_eq!(
            ro,
            [
                ("/usr", "/usr"),
                ("/tmp/pycage-abc", "/run/pycage"),
                ("/opt/bin/pycage", WORKER_PATH),
                ("/home/ada/.cache/pycage", CACHE_MOUNT),
            ]
        );
        assert_eq!(
            &argv[argv.len() - 4..],
            [WORKER_PATH, "worker", "--cache-dir", CACHE_MOUNT]
        );
    }

    #[cfg(unix)]
    #[test]
    fn reported_output_over_the_cap_is_cut_again() {
        let c = recap("x".repeat(10_000), false, 100);
        assert!(c.truncated);
        assert_eq!(c.text.matches('x').count(), 100);
        let c = recap("short".into(), false, 100);
        assert!(!c.truncated);
        assert_eq!(c.text, "short");
        assert!(
            recap("short".into(), true, 100).truncated,
            "the worker's own cut counts"
        );
    }
}

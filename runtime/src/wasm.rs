//! The wasm backend: CPython compiled to WASI, run by wasmtime inside this process.
//!
//! # Security
//!
//! The guest is a WebAssembly component. It has no host syscalls: it reaches the host only
//! through the imports the linker defines (see `wasm/linker.rs`): captured stdio, clocks, random,
//! an empty environment, a filesystem with nothing in it, and the broker's `call-tool`.
//! Memory, fuel and wall-clock limits are enforced by the engine and the store, never by the
//! guest. Each run gets a fresh store and instance; a store is dropped after its run, trapped
//! or not, and never re-entered.

mod bindings;
mod cache;
mod classify;
mod clock;
#[cfg(test)]
mod component_tests;
mod engine;
mod error;
mod fs;
pub mod guest;
mod instance;
mod interrupt;
mod linker;
mod noted;
mod pool;
mod reaper;
mod slot;
mod state;
mod swap;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::Engine;

pub use self::cache::{ArtifactSource, ENV_CACHE_DIR, default_cache_dir};
pub use self::error::WasmError;
pub use self::guest::{Guest, GuestError, GuestManifest};
pub use self::linker::CapabilityDenied;

use self::bindings::SandboxPre;
use self::engine::SlotReset;
use self::instance::{Fresh, RunExport};
use self::pool::WarmPool;
use self::state::RunState;
use crate::backend::{Availability, Backend, BackendSession, Job, RunFuture, SessionFuture};
use crate::broker::ToolGate;
use crate::{ErrorKind, Limits, RunError, RunResult};

/// The guest component: by default the prebuilt one of `pycage-guest-default`; with the
/// `guest-from-source` feature or `PYCAGE_COMPONENT`, the one this crate's build script made.
#[cfg(not(pycage_built_guest))]
use pycage_guest_default::{COMPONENT, COMPONENT_DIGEST};
#[cfg(pycage_built_guest)]
static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pycage-guest.wasm"));
#[cfg(pycage_built_guest)]
include!(concat!(env!("OUT_DIR"), "/component_digest.rs"));

/// The wasm backend. Cheap to clone; clones share the engine and the compiled guest.
#[derive(Clone)]
pub struct WasmBackend {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    /// How the engine's pooled slots are reset; [`SlotReset::InPlace`] only while the host
    /// has no swap.
    reset: SlotReset,
    /// The engine runs move to if swap is turned on after this one resets in place.
    successor: tokio::sync::OnceCell<Arc<Inner>>,
    settings: WasmBackendBuilder,
    prepared: tokio::sync::OnceCell<Prepared>,
    pool: Option<WarmPool>,
    /// Where this guest's sessions are interrupted, found in the first session's instance;
    /// `None`: they are not, and trap at their deadline (the log said why).
    interrupt_sites: interrupt::SiteCell,
}

struct Prepared {
    pre: SandboxPre<RunState>,
    /// Where the guest's `run` export is, looked up once (each instance only types it).
    run: RunExport,
    source: ArtifactSource,
}

impl std::fmt::Debug for WasmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmBackend")
            .field("cache_dir", &self.cache_dir())
            .field("warm_pool", &self.warm_instances())
            .finish_non_exhaustive()
    }
}

/// Builds a [`WasmBackend`].
#[derive(Debug, Clone)]
pub struct WasmBackendBuilder {
    cache_dir: Option<PathBuf>,
    warm_pool: usize,
    max_instances: u32,
    meter_fuel: bool,
    reset_in_place: bool,
    /// Deterministic mode's seed (`None`: not deterministic).
    seed: Option<u64>,
    guest: Guest,
}

impl Default for WasmBackendBuilder {
    fn default() -> Self {
        WasmBackendBuilder {
            cache_dir: default_cache_dir(),
            warm_pool: 0,
            max_instances: engine::DEFAULT_MAX_INSTANCES,
            meter_fuel: true,
            reset_in_place: true,
            seed: None,
            guest: Guest::builtin(),
        }
    }
}

impl WasmBackendBuilder {
    /// Where compiled artifacts are cached; `None` compiles in every process. Default:
    /// [`default_cache_dir`].
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// Keeps `n` guest instances instantiated ahead of time (default 0: none). A run takes a
    /// never-used instance, so its latency is only its execution; instances are never reused.
    /// Without fuel metering the pool also primes each instance in the background (it runs
    /// a constant snippet once), which makes a short run about three times faster than in an
    /// unprimed instance.
    pub fn warm_pool(mut self, n: usize) -> Self {
        self.warm_pool = n;
        self
    }

    /// The most guest instances alive at once, including the warm pool (default 1000). The
    /// pooling allocator reserves address space for this many up front.
    pub fn max_instances(mut self, n: u32) -> Self {
        self.max_instances = n.max(1);
        self
    }

    /// Meters fuel (default true). Without metering, runs report no fuel and refuse fuel
    /// budgets; the compiled code is a little faster (see `pycage bench`).
    pub fn meter_fuel(mut self, meter: bool) -> Self {
        self.meter_fuel = meter;
        self
    }

    /// Makes every run reproducible (default: not deterministic). Same code, inputs, files,
    /// seed and tool results give the same stdout, stderr, value, files and fuel, byte for
    /// byte, on any machine and under any load, pooled or fresh:
    ///
    /// - both of the guest's clocks read one virtual time, starting at 2000-01-01T00:00:00Z
    ///   (monotonic: 0) in each instance, moved on 1 µs by each reading and by exactly the
    ///   time asked for by a sleep, which returns at once;
    /// - random bytes (`os.urandom`, so `random`, `secrets` and `uuid.uuid4()`; and WASI's
    ///   insecure random) come from ChaCha20 keyed by `seed`;
    /// - the engine canonicalizes NaNs and uses deterministic relaxed SIMD (a separate
    ///   compiled artifact);
    /// - fuel is metered ([`meter_fuel`](Self::meter_fuel) is ignored), and the warm pool,
    ///   which never primes a metered instance, hands out instances identical to new ones.
    ///
    /// The wall-clock limit still applies in real time: on a slower machine a run can end as
    /// a timeout where a faster one finished, but never with a different output.
    pub fn deterministic(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Lets used instances' memory slots be reset in place where that is sound against swap
    /// (default true; see [`WasmBackend::resets_slots_in_place`]). With `false` every slot is
    /// released after its run: fresh runs fault in more of the guest's heap, and no page of a
    /// run can reach the slot's next guest through a page the kernel was migrating at the
    /// moment of the reset (a race SECURITY.md describes). For hosts serving several tenants.
    pub fn reset_slots_in_place(mut self, allow: bool) -> Self {
        self.reset_in_place = allow;
        self
    }

    /// Runs `guest` instead of the guest built into this library (default
    /// [`Guest::builtin`]): one with packages baked in, built by `pycage guest build` and
    /// checked by [`Guest::from_path`]. Its compiled artifact is cached by its digest, as the
    /// built-in guest's is.
    pub fn guest(mut self, guest: Guest) -> Self {
        self.guest = guest;
        self
    }

    /// Creates the backend (the guest itself is loaded on first use, or by
    /// [`WasmBackend::prepare`]).
    ///
    /// # Errors
    ///
    /// When the engine cannot be created.
    pub fn build(self) -> Result<WasmBackend, WasmError> {
        let reset = if self.reset_in_place {
            SlotReset::for_this_host()
        } else {
            SlotReset::Release
        };
        Ok(WasmBackend {
            inner: Arc::new(Inner::new(self, reset)?),
        })
    }
}

impl WasmBackend {
    /// A builder with the defaults: the default cache directory, no warm pool.
    pub fn builder() -> WasmBackendBuilder {
        WasmBackendBuilder::default()
    }

    /// A backend with its own engine, caching compiled artifacts in `cache_dir` (`None`: no
    /// cache; every process compiles the guest).
    ///
    /// # Errors
    ///
    /// When the engine cannot be created (for example, the host cannot start a thread).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, WasmError> {
        Self::builder().cache_dir(cache_dir).build()
    }

    /// The process-wide backend with the default cache directory ([`default_cache_dir`]).
    /// Every [`Runner`](crate::Runner) built without an explicit backend shares it. A failure
    /// is not kept: the next call tries again (the host may have freed address space).
    ///
    /// # Errors
    ///
    /// As for [`WasmBackend::new`].
    pub fn shared() -> Result<Self, WasmError> {
        static SHARED: Mutex<Option<WasmBackend>> = Mutex::new(None);
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(backend) = &*shared {
            return Ok(backend.clone());
        }
        let backend = WasmBackend::builder().build()?;
        *shared = Some(backend.clone());
        Ok(backend)
    }

    /// The cache directory, if any.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.inner.settings.cache_dir.as_deref()
    }

    /// Where this backend's compiled artifact lives (or would live) in the cache.
    pub fn artifact_path(&self) -> Option<PathBuf> {
        let digest = self.guest().digest();
        self.cache_dir()
            .map(|dir| cache::artifact_path(dir, &self.inner.engine, digest))
    }

    /// True when a compiled artifact for the guest is in the cache, so preparing is fast.
    pub fn is_cached(&self) -> bool {
        self.inner.prepared.initialized()
            || cache::is_cached(&self.inner.engine, self.guest().digest(), self.cache_dir())
    }

    /// The guest this backend runs.
    pub fn guest(&self) -> &Guest {
        &self.inner.settings.guest
    }

    /// Whether used instances' memory slots are reset in place (the snapshot copied back over
    /// the pages a run wrote, which stay resident) rather than released. Only on Linux 6.7+
    /// without swap, unless [`WasmBackendBuilder::reset_slots_in_place`] said no. Releasing
    /// makes fresh runs fault in more of the guest's heap: 168 faults per fresh `pass`
    /// instead of 10, and less than half the fresh runs a second with two callers (503-505
    /// against 1,116-1,128, side by side), on the machine we measured.
    pub fn resets_slots_in_place(&self) -> bool {
        self.inner.latest().reset == SlotReset::InPlace
    }

    /// How many pre-instantiated guests are waiting in the warm pool.
    pub fn warm_instances(&self) -> usize {
        self.inner.latest().pool.as_ref().map_or(0, WarmPool::ready)
    }

    /// Loads (or compiles, then caches) the guest, and starts filling the warm pool. Runs do
    /// this on first use; call it to pay the cost up front. Compiling takes seconds and runs
    /// on a blocking thread.
    ///
    /// # Errors
    ///
    /// [`WasmError`] when the guest cannot be compiled or linked; its message is for the
    /// operator.
    pub async fn prepare(&self) -> Result<ArtifactSource, WasmError> {
        self.inner.prepare().await
    }

    /// The guest component's imports, by full name (prepares the guest first).
    ///
    /// # Errors
    ///
    /// As for [`WasmBackend::prepare`].
    pub async fn guest_imports(&self) -> Result<Vec<String>, WasmError> {
        self.prepare().await?;
        let prepared = self
            .inner
            .prepared
            .get()
            .ok_or_else(|| WasmError::Interrupted("the guest is not prepared".into()))?;
        let component = prepared.pre.instance_pre().component();
        Ok(component
            .component_type()
            .imports(&self.inner.engine)
            .map(|(name, _)| name.to_owned())
            .collect())
    }

    /// Runs one job with its tool calls going to `gate` rather than to a local broker: for a
    /// worker process that runs the engine inside an OS sandbox while the broker stays with
    /// the host. `tool_calls` in the result is 0; the broker's owner knows the count.
    pub async fn run_gated(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunResult {
        let started = Instant::now();
        let fail = |error| RunResult::failed(self.name(), error, started.elapsed());
        // The first run of a process pays for loading (or compiling) the guest; the wall
        // clock starts after that, when the guest does.
        let inner = match self.inner.current().await {
            Ok(inner) => inner,
            Err(e) => {
                tracing::error!(error = %e, "pycage: the wasm guest could not be prepared");
                return fail(RunError::new(
                    ErrorKind::BackendError,
                    "the wasm sandbox could not be prepared",
                ));
            }
        };
        // A short run (most runs) completes within a single poll: the guest computes on this
        // thread and nothing it awaits is pending. Without a yield, a task running sandboxes
        // back to back never gave its worker thread back, and other tasks on the runtime did
        // not start until it stopped (`callers_running_back_to_back_take_turns`). Longer
        // runs also yield at each epoch tick or fuel interval.
        tokio::task::yield_now().await;
        let (pooled, _refill) = match &inner.pool {
            Some(pool) => {
                let (fresh, refill) = pool.take();
                (fresh, Some(refill))
            }
            None => (None, None),
        };
        let fresh = match pooled {
            Some(fresh) => fresh,
            None => match inner.instantiate().await {
                Ok(fresh) => fresh,
                Err(e) => {
                    tracing::error!(error = ?e, "pycage: instantiating the guest failed");
                    return fail(RunError::new(
                        ErrorKind::BackendError,
                        "the sandbox could not start",
                    ));
                }
            },
        };
        let outcome = fresh.run(job, gate).await;
        RunResult::builder(self.name(), outcome.value)
            .stdout(outcome.stdout)
            .stderr(outcome.stderr)
            .fuel_consumed(outcome.fuel_consumed)
            .files(outcome.files)
            .duration(started.elapsed())
            .build()
    }
}

impl WasmBackend {
    /// Starts a session's guest: a fresh instance (never from the warm pool, whose instances
    /// may be primed for one-shot runs) kept until its session drops it.
    async fn open(&self, limits: Limits) -> Result<Box<dyn BackendSession>, RunError> {
        let inner = self.inner.current().await.map_err(|e| {
            tracing::error!(error = %e, "pycage: the wasm guest could not be prepared");
            RunError::new(
                ErrorKind::BackendError,
                "the wasm sandbox could not be prepared",
            )
        })?;
        let fresh = inner.instantiate().await.map_err(|e| {
            tracing::error!(error = ?e, "pycage: instantiating the guest failed");
            RunError::new(ErrorKind::BackendError, "the sandbox could not start")
        })?;
        let fresh = fresh
            .into_session(&limits, inner.interrupt_sites.clone())
            .map_err(|e| {
                tracing::error!(error = ?e, "pycage: the guest's run export does not fit");
                RunError::new(ErrorKind::BackendError, "the sandbox could not start")
            })?;
        Ok(Box::new(WasmSession {
            guest: Some(fresh),
            running: false,
            _inner: inner,
        }))
    }
}

/// A session's guest: one instance, dropped (to the reaper) when a run poisons it.
struct WasmSession {
    guest: Option<Fresh>,
    /// Set while a run is in the guest: still set when a run starts, the last run's future
    /// was dropped mid-call (its caller gave up), and the engine unwound the guest there.
    running: bool,
    /// The engine and its compiled guest, kept while the instance lives.
    _inner: Arc<Inner>,
}

impl BackendSession for WasmSession {
    fn run(&mut self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async move {
            let started = Instant::now();
            if std::mem::take(&mut self.running) {
                self.guest = None;
                return crate::backend::cancelled_run_ended("wasm", started.elapsed());
            }
            let Some(guest) = self.guest.as_mut() else {
                let error = RunError::new(ErrorKind::SessionEnded, "the session's guest is gone");
                return RunResult::failed("wasm", error, started.elapsed());
            };
            // As for a one-shot run: give the runtime a turn before the guest computes.
            tokio::task::yield_now().await;
            self.running = true;
            let outcome = guest.run_in(job, gate, true).await;
            self.running = false;
            if outcome.poisoned {
                self.guest = None;
            }
            RunResult::builder("wasm", outcome.value)
                .stdout(outcome.stdout)
                .stderr(outcome.stderr)
                .fuel_consumed(outcome.fuel_consumed)
                .files(outcome.files)
                .session_ended(outcome.poisoned)
                .duration(started.elapsed())
                .build()
        })
    }
}

impl Inner {
    /// An engine for `settings` that resets its slots as `reset` says (or releases them, where
    /// the pooling allocator is unavailable); the guest is loaded on first use.
    fn new(settings: WasmBackendBuilder, reset: SlotReset) -> Result<Inner, WasmError> {
        let max_instances = settings.max_instances.max(settings.warm_pool as u32 + 1);
        let (engine, reset) = engine::new_engine(
            max_instances,
            settings.meter_fuel || settings.seed.is_some(),
            settings.seed.is_some(),
            reset,
        )
        .map_err(|e| WasmError::Engine(e.to_string()))?;
        Ok(Inner {
            engine,
            reset,
            successor: tokio::sync::OnceCell::new(),
            prepared: tokio::sync::OnceCell::new(),
            pool: (settings.warm_pool > 0)
                // Priming changes the fuel a run takes; metered pools do not prime.
                .then(|| {
                    WarmPool::new(
                        settings.warm_pool,
                        !settings.meter_fuel && settings.seed.is_none(),
                    )
                }),
            settings,
            interrupt_sites: interrupt::SiteCell::default(),
        })
    }

    /// Loads (or compiles) the guest once, and starts the warm pool's filler.
    async fn prepare(self: &Arc<Self>) -> Result<ArtifactSource, WasmError> {
        let inner = self.clone();
        let prepared = self
            .prepared
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || prepare_blocking(&inner))
                    .await
                    .map_err(|e| WasmError::Interrupted(e.to_string()))?
            })
            .await?;
        if let Some(pool) = &self.pool {
            pool.ensure_filler(Arc::downgrade(self));
        }
        Ok(prepared.source)
    }

    /// The prepared engine a new run should use: this one, unless it resets slots in place
    /// and the host has started swapping since it was created. Then a successor that
    /// releases its slots takes over for good (created once; it loads the guest again), and
    /// this engine's used stores are never recycled (`reaper::dispose`). Checked on every
    /// run: a run that started here after its engine's last slot was kept could not start.
    async fn current(self: &Arc<Self>) -> Result<Arc<Inner>, WasmError> {
        self.prepare().await?;
        if self.reset != SlotReset::InPlace || !swap::in_use() {
            return Ok(self.clone());
        }
        let next = self
            .successor
            .get_or_try_init(|| async {
                tracing::warn!(
                    "pycage: the host turned on swap after the wasm engine started; \
                     moving new runs to an engine that releases its memory slots"
                );
                Inner::new(self.settings.clone(), SlotReset::Release).map(Arc::new)
            })
            .await?;
        next.prepare().await?;
        Ok(next.clone())
    }

    /// The engine that serves runs now: the successor, once there is one.
    fn latest(self: &Arc<Self>) -> &Arc<Inner> {
        self.successor.get().unwrap_or(self)
    }

    /// A fresh guest instance. Requires `prepared`.
    async fn instantiate(&self) -> wasmtime::Result<Fresh> {
        let prepared = self
            .prepared
            .get()
            .ok_or_else(|| wasmtime::format_err!("the guest is not prepared"))?;
        let reaped = reaper::reaped();
        let meter_fuel = self.settings.meter_fuel || self.settings.seed.is_some();
        let seed = self.settings.seed;
        let fresh = || {
            let (pre, run) = (&prepared.pre, prepared.run);
            Fresh::new(&self.engine, pre, run, meter_fuel, self.reset, seed)
        };
        match fresh().await {
            // Used instances give their slots back on the reaper thread: when every slot is
            // taken, some may be waiting there, or have just come free.
            Err(_) if reaper::pending() || reaper::reaped() != reaped => {
                reaper::drained().await;
                fresh().await
            }
            result => result,
        }
    }

    /// A fresh instance for the warm pool, primed if the pool primes.
    async fn instantiate_for_pool(&self) -> wasmtime::Result<Fresh> {
        let mut fresh = self.instantiate().await?;
        if self.pool.as_ref().is_some_and(WarmPool::primes) {
            fresh.prime().await?;
        }
        Ok(fresh)
    }
}

fn prepare_blocking(inner: &Inner) -> Result<Prepared, WasmError> {
    let started = Instant::now();
    let guest = &inner.settings.guest;
    let (component, source) = cache::load_or_compile(
        &inner.engine,
        guest.bytes(),
        guest.digest(),
        inner.settings.cache_dir.as_deref(),
    )
    .map_err(|e| WasmError::Compile(e.to_string()))?;
    let loaded = started.elapsed();
    let linker =
        linker::build(&inner.engine, &component).map_err(|e| WasmError::Link(e.to_string()))?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|e| WasmError::Link(format!("pre-instantiating: {e}")))?;
    let pre = SandboxPre::new(pre)
        .map_err(|e| WasmError::Link(format!("the guest does not fit the contract: {e}")))?;
    tracing::debug!(?source, ?loaded, total = ?started.elapsed(), "pycage: guest prepared");
    let run = RunExport::find(pre.instance_pre().component()).map_err(WasmError::Link)?;
    Ok(Prepared { pre, run, source })
}

impl Backend for WasmBackend {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn provides_isolation(&self) -> bool {
        true
    }

    fn availability(&self) -> Availability {
        Availability::Available
    }

    fn run(&self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(self.run_gated(job, gate))
    }

    fn deterministic_seed(&self) -> Option<u64> {
        self.inner.settings.seed
    }

    fn packages(&self) -> Vec<String> {
        self.guest().manifest().map_or_else(Vec::new, |m| {
            m.packages
                .iter()
                .map(|p| match p.modules.as_slice() {
                    [] => format!("`{}` {}", p.name, p.version),
                    [one] if *one == p.name => format!("`{one}` {}", p.version),
                    modules => format!(
                        "`{}` {} (import {})",
                        p.name,
                        p.version,
                        modules
                            .iter()
                            .map(|m| format!("`{m}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
                .collect()
        })
    }

    fn supports_sessions(&self) -> bool {
        true
    }

    fn open_session(&self, limits: &Limits) -> SessionFuture<'_> {
        Box::pin(self.open(limits.clone()))
    }
}

/// The WASI and custom interfaces the host implements for real (unversioned names).
pub fn granted_interfaces() -> &'static [&'static str] {
    linker::GRANTED
}

//! The wasm backend: CPython compiled to WASI, run by wasmtime inside this process.
//!
//! # Security
//!
//! The guest is a WebAssembly component. It has no host syscalls: it reaches the host only
//! through the imports the linker defines (see [`linker`]): captured stdio, clocks, random,
//! an empty environment, a filesystem with nothing in it, and the broker's `call-tool`.
//! Memory, fuel and wall-clock limits are enforced by the engine and the store, never by the
//! guest. Each run gets a fresh store and instance; a store is dropped after its run, trapped
//! or not, and never re-entered.

mod bindings;
mod cache;
mod classify;
mod engine;
mod linker;
mod output;
mod state;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde_json::Value;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

pub use self::cache::{ArtifactSource, ENV_CACHE_DIR, default_cache_dir};
pub use self::linker::CapabilityDenied;

use self::bindings::SandboxPre;
use self::bindings::exports::pycage::sandbox::guest::{
    Failure, FailureKind, RunRequest, ToolBinding,
};
use self::classify::{Ending, Evidence};
use self::output::CapturePipe;
use self::state::{GuestLimiter, MAX_RESOURCES, RunState};
use crate::backend::{Availability, Backend, Job, RunFuture};
use crate::broker::Broker;
use crate::{ErrorKind, RunError, RunResult};

include!(concat!(env!("OUT_DIR"), "/component_digest.rs"));

/// The guest component, built from `guest-python/` by this crate's build script.
static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pycage-guest.wasm"));

/// The most random bytes the guest may ask for in one call (a host-side buffer).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// Host-side caps on the guest's failure texts (the guest caps them too; it is not trusted to).
const MAX_MESSAGE_CHARS: usize = 2000;
const MAX_TRACEBACK_CHARS: usize = 16_000;

/// The wasm backend. Cheap to clone; clones share the engine and the compiled guest.
#[derive(Clone)]
pub struct WasmBackend {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    cache_dir: Option<PathBuf>,
    prepared: tokio::sync::OnceCell<Prepared>,
}

struct Prepared {
    pre: SandboxPre<RunState>,
    source: ArtifactSource,
}

impl std::fmt::Debug for WasmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmBackend")
            .field("cache_dir", &self.inner.cache_dir)
            .finish_non_exhaustive()
    }
}

impl WasmBackend {
    /// A backend with its own engine, caching compiled artifacts in `cache_dir` (`None`: no
    /// cache; every process compiles the guest).
    ///
    /// # Errors
    ///
    /// When the engine cannot be created (for example, the host cannot start a thread).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, String> {
        let engine = engine::new_engine().map_err(|e| format!("creating the wasm engine: {e}"))?;
        Ok(WasmBackend {
            inner: Arc::new(Inner {
                engine,
                cache_dir,
                prepared: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The process-wide backend with the default cache directory ([`default_cache_dir`]).
    /// Every [`Runner`](crate::Runner) built without an explicit backend shares it.
    ///
    /// # Errors
    ///
    /// As for [`WasmBackend::new`].
    pub fn shared() -> Result<Self, String> {
        static SHARED: OnceLock<Result<WasmBackend, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| WasmBackend::new(default_cache_dir()))
            .clone()
    }

    /// The cache directory, if any.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.inner.cache_dir.as_deref()
    }

    /// True when a compiled artifact for the guest is in the cache, so preparing is fast.
    pub fn is_cached(&self) -> bool {
        self.inner.prepared.initialized()
            || cache::is_cached(&self.inner.engine, COMPONENT_DIGEST, self.cache_dir())
    }

    /// Loads (or compiles, then caches) the guest. Runs do this on first use; call it to pay
    /// the cost up front. Compiling takes seconds and runs on a blocking thread.
    ///
    /// # Errors
    ///
    /// When the guest cannot be compiled or linked; the message is for the operator.
    pub async fn prepare(&self) -> Result<ArtifactSource, String> {
        let inner = self.inner.clone();
        let prepared = self
            .inner
            .prepared
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || prepare_blocking(&inner))
                    .await
                    .map_err(|e| format!("preparing the guest panicked: {e}"))?
            })
            .await?;
        Ok(prepared.source)
    }

    /// The guest component's imports, by full name (prepares the guest first).
    ///
    /// # Errors
    ///
    /// As for [`WasmBackend::prepare`].
    pub async fn guest_imports(&self) -> Result<Vec<String>, String> {
        self.prepare().await?;
        let prepared = self
            .inner
            .prepared
            .get()
            .ok_or("the guest is not prepared")?;
        let component = prepared.pre.instance_pre().component();
        Ok(component
            .component_type()
            .imports(&self.inner.engine)
            .map(|(name, _)| name.to_owned())
            .collect())
    }

    async fn run_job(&self, job: Job, broker: Arc<Broker>) -> RunResult {
        let started = Instant::now();
        let fail = |error| RunResult::failed(self.name(), error, started.elapsed());
        // The first run of a process pays for loading (or compiling) the guest; the wall
        // clock starts after that, when the guest does.
        if let Err(e) = self.prepare().await {
            tracing::error!(error = %e, "pycage: the wasm guest could not be prepared");
            return fail(RunError::new(
                ErrorKind::BackendError,
                "the wasm sandbox could not be prepared",
            ));
        }
        let Some(prepared) = self.inner.prepared.get() else {
            return fail(RunError::new(
                ErrorKind::BackendError,
                "the wasm sandbox is not ready",
            ));
        };
        let limits = &job.limits;
        let deadline = Instant::now() + limits.wall_timeout();
        let stdout = CapturePipe::new(limits.max_output_bytes());
        let stderr = CapturePipe::new(limits.max_output_bytes());
        let mut store = match new_store(
            &self.inner.engine,
            &job,
            &broker,
            deadline,
            &stdout,
            &stderr,
        ) {
            Ok(store) => store,
            Err(e) => {
                tracing::error!(error = ?e, "pycage: creating a store failed");
                return fail(RunError::new(
                    ErrorKind::BackendError,
                    "the sandbox could not start",
                ));
            }
        };
        let request = RunRequest {
            code: job.code,
            vars_json: Value::Object(job.vars).to_string(),
            tools: broker
                .tools()
                .bindings()
                .iter()
                .filter_map(|b| {
                    Some(ToolBinding {
                        binding: b.binding.clone()?,
                        qualified: b.qualified.clone(),
                        description: b.description.clone(),
                    })
                })
                .collect(),
            max_value_bytes: limits.max_value_bytes(),
        };

        let outcome = {
            let run = async {
                let sandbox = prepared.pre.instantiate_async(&mut store).await?;
                sandbox
                    .pycage_sandbox_guest()
                    .call_run(&mut store, &request)
                    .await
            };
            // Epoch interruption stops a guest that computes; this stops one that waits in a
            // host call (a sleep, a slow tool), where no epoch check runs.
            tokio::time::timeout_at(deadline.into(), run).await
        };

        let fuel_left = store.get_fuel().unwrap_or(0);
        let fuel_start = limits.fuel().unwrap_or(u64::MAX);
        let state = store.data();
        let evidence = Evidence {
            memory_denied: state.limiter.denied,
            fuel_budget: limits.fuel(),
        };
        let ending = match outcome {
            Err(_elapsed) => Err(RunError::new(
                ErrorKind::Timeout,
                "the wall-clock limit was reached",
            )),
            Ok(Err(error)) => match classify::classify(&error, evidence) {
                Ending::CleanExit => Ok(Value::Null),
                Ending::Failed(e) => Err(e),
            },
            Ok(Ok(Err(failure))) => Err(failure_error(failure, state)),
            Ok(Ok(Ok(json))) => decode_value(&json, limits.max_value_bytes()),
        };
        let out = stdout.captured();
        let err = stderr.captured();
        let (ok, value, error) = match ending {
            Ok(value) => (true, value, None),
            Err(e) => (false, Value::Null, Some(e)),
        };
        RunResult {
            ok,
            value,
            stdout: out.text,
            stderr: err.text,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            timed_out: error.as_ref().is_some_and(|e| e.kind == ErrorKind::Timeout),
            error,
            tool_calls: broker.executed(),
            fuel_consumed: Some(fuel_start.saturating_sub(fuel_left)),
            duration: started.elapsed(),
            backend: self.name().to_owned(),
        }
    }
}

fn prepare_blocking(inner: &Inner) -> Result<Prepared, String> {
    let (component, source) = cache::load_or_compile(
        &inner.engine,
        COMPONENT,
        COMPONENT_DIGEST,
        inner.cache_dir.as_deref(),
    )
    .map_err(|e| format!("compiling the guest: {e}"))?;
    let linker =
        linker::build(&inner.engine, &component).map_err(|e| format!("linking the guest: {e}"))?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|e| format!("pre-instantiating the guest: {e}"))?;
    let pre =
        SandboxPre::new(pre).map_err(|e| format!("the guest does not fit the contract: {e}"))?;
    Ok(Prepared { pre, source })
}

fn new_store(
    engine: &Engine,
    job: &Job,
    broker: &Arc<Broker>,
    deadline: Instant,
    stdout: &CapturePipe,
    stderr: &CapturePipe,
) -> wasmtime::Result<Store<RunState>> {
    // Deny by construction: no args, no environment, no preopened directories, stdin closed.
    let wasi = WasiCtx::builder()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .max_random_size(MAX_RANDOM_BYTES)
        .build();
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_RESOURCES);
    let state = RunState {
        wasi,
        table,
        limiter: GuestLimiter::new(job.limits.memory_bytes()),
        broker: broker.clone(),
        deadline,
        denied_capability: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.set_fuel(job.limits.fuel().unwrap_or(u64::MAX))?;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        if Instant::now() >= ctx.data().deadline {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    Ok(store)
}

/// Maps the guest's own report of a failed run, checking it against what the host saw.
fn failure_error(failure: Failure, state: &RunState) -> RunError {
    let exception = failure.exception.map(|e| cap_chars(&e, 200));
    let kind = match failure.kind {
        FailureKind::SyntaxError => ErrorKind::SyntaxError,
        FailureKind::InvalidInput => ErrorKind::InvalidInput,
        FailureKind::ValueTooLarge => ErrorKind::ValueTooLarge,
        FailureKind::GuestException => match exception.as_deref() {
            Some("MemoryError") if state.limiter.denied => ErrorKind::MemoryLimit,
            Some("PermissionError") if state.denied_capability.is_some() => {
                ErrorKind::CapabilityDenied
            }
            _ => ErrorKind::GuestException,
        },
    };
    let mut message = cap_chars(&failure.message, MAX_MESSAGE_CHARS);
    if kind == ErrorKind::CapabilityDenied
        && let Some(import) = &state.denied_capability
    {
        message = format!("{message} (the sandbox does not grant `{import}`)");
    }
    RunError {
        kind,
        message,
        traceback: failure
            .traceback
            .map(|t| cap_chars(&t, MAX_TRACEBACK_CHARS)),
        exception,
    }
}

/// The guest's value JSON, checked on the host: within the cap, and valid JSON.
fn decode_value(json: &str, max_bytes: u64) -> Result<Value, RunError> {
    if json.len() as u64 > max_bytes {
        return Err(RunError::new(
            ErrorKind::ValueTooLarge,
            format!(
                "the return value is {} bytes of JSON; the limit is {max_bytes}",
                json.len()
            ),
        ));
    }
    serde_json::from_str(json).map_err(|_| {
        RunError::new(
            ErrorKind::GuestException,
            "the return value is not valid JSON",
        )
    })
}

fn cap_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
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

    fn run(&self, job: Job, broker: Arc<Broker>) -> RunFuture<'_> {
        Box::pin(self.run_job(job, broker))
    }
}

/// The WASI and custom interfaces the host implements for real (unversioned names).
pub fn granted_interfaces() -> &'static [&'static str] {
    linker::GRANTED
}

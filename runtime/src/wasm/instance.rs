//! One guest instance: created fresh, used for exactly one run, then dropped.
//!
//! A [`Fresh`] instance is instantiated before its run is known (possibly ahead of time, by
//! the warm pool), so everything run-specific — limits, broker, deadline, output caps — is set
//! when the run starts. Fuel is counted from that moment too, so a pooled and an unpooled run
//! of the same code report the same fuel.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

use super::bindings::SandboxPre;
use super::bindings::exports::pycage::sandbox::guest::Failure;
use super::classify::{self, Ending, Evidence};
use super::clock::VirtualClock;
use super::engine::{FUEL_YIELD_INTERVAL, SlotReset};
use super::fs::ScratchSlot;
use super::interrupt;
use super::noted::Noted;
use super::reaper::GuestStore;
use super::slot::MemoryNote;
use super::state::{GuestLimiter, MAX_RESOURCES, RunState};
use crate::backend::Job;
use crate::broker::ToolGate;
use crate::capture::CapturePipe;
use crate::result::decode_value;
use crate::{ErrorKind, MAX_MEMORY_BYTES, RunError};

/// The most random bytes the guest may ask for in one call (a host-side buffer).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// How long instantiating may take before it counts as hung.
const INSTANTIATE_TIMEOUT: Duration = Duration::from_secs(30);

/// An instantiated guest that has never run.
pub(crate) struct Fresh {
    store: GuestStore,
    /// A session's way into the guest (see [`Fresh::into_session`]); its interrupt is the
    /// store's (`RunState::interrupt`).
    session_run: Option<SessionRun>,
    /// The guest's `run` export, called with code that notes where the guest's memory is as
    /// it is lowered (`super::noted`), for the slot's reset.
    run: OneShotRun,
    meter_fuel: bool,
}

/// How one-shot runs (and the warm pool's priming run) enter the guest.
type OneShotRun = GuestRun<Arc<MemoryNote>>;

/// How a session's runs enter the guest: with code that also arms the run's interrupt as it
/// is lowered.
type SessionRun = GuestRun<(Arc<interrupt::Probe>, Arc<MemoryNote>)>;

/// The guest's `run` export, its code shown to `N` as it is lowered (`super::noted`).
type GuestRun<N> = wasmtime::component::TypedFunc<(Noted<N>, String), (Result<String, Failure>,)>;

/// What one run produced, before the backend wraps it in a `RunResult`.
pub(crate) struct Outcome {
    pub value: Result<Value, RunError>,
    pub stdout: crate::capture::Captured,
    pub stderr: crate::capture::Captured,
    pub fuel_consumed: Option<u64>,
    pub files: Vec<crate::OutputFile>,
    /// The instance may not run again (a trap, an exit, or its deadline cut it).
    pub poisoned: bool,
}

impl Fresh {
    /// Instantiates a guest in a new store. Deny by construction: no args, no environment, no
    /// preopened directories, stdin closed, stdout and stderr captured. `reset` is how
    /// `engine` resets its slots; `run_export` is where `pre`'s `run` is. With a `seed` the
    /// instance is deterministic: its clocks are virtual (see `super::clock`) and its random
    /// bytes, secure and insecure, come from ChaCha20 streams keyed by the seed.
    pub async fn new(
        engine: &Engine,
        pre: &SandboxPre<RunState>,
        run_export: RunExport,
        meter_fuel: bool,
        reset: SlotReset,
        seed: Option<u64>,
    ) -> wasmtime::Result<Fresh> {
        let stdout = CapturePipe::new(0);
        let stderr = CapturePipe::new(0);
        let mut wasi = WasiCtx::builder();
        if let Some(seed) = seed {
            use rand_core::SeedableRng;
            // Two streams of one key: the secure one on stream 0, the insecure one on 1.
            let mut insecure = chacha20::ChaCha20Rng::seed_from_u64(seed);
            insecure.set_stream(1);
            wasi.secure_random(chacha20::ChaCha20Rng::seed_from_u64(seed))
                .insecure_random(insecure)
                .insecure_random_seed(u128::from(seed));
        }
        let wasi = wasi
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .max_random_size(MAX_RANDOM_BYTES)
            // File calls reach only the run's scratch directory, a local directory whose
            // calls are short: on the run's own thread they took a 10 MiB read from 44 ms
            // to ... (a hop to the blocking pool per call cost more than the call).
            .allow_blocking_current_thread(true)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        let instantiated_by = Instant::now() + INSTANTIATE_TIMEOUT;
        let state = RunState {
            wasi,
            table,
            limiter: GuestLimiter::new(MAX_MEMORY_BYTES),
            gate: None,
            deadline: instantiated_by,
            denied_capability: None,
            stdout,
            stderr,
            reset,
            scratch: ScratchSlot::None,
            virtual_clock: seed.map(|_| VirtualClock::default()),
            interrupt: None,
            memory: Arc::default(),
        };
        let mut store = GuestStore::new(Store::new(engine, state));
        store.limiter(|s| &mut s.limiter);
        if meter_fuel {
            // No epoch checks in this engine (see `engine::config`): the guest yields every
            // interval of fuel, and the run's async deadline ends it at a yield.
            store.set_fuel(u64::MAX)?;
            store.fuel_async_yield_interval(Some(FUEL_YIELD_INTERVAL))?;
        } else {
            store.set_epoch_deadline(1);
            store.epoch_deadline_callback(|ctx| {
                let now = Instant::now();
                let state = ctx.data();
                if now < state.deadline {
                    return Ok(UpdateDeadline::Yield(1));
                }
                // Past the deadline a one-shot run traps. A session's run is interrupted by
                // the run's driver (`until`) at its next poll, which this yield gives it, and
                // traps only if it has not stopped within the grace period.
                let grace = state.interrupt.as_ref().filter(|p| p.armed());
                if grace.is_some_and(|p| now < p.stop_at(state.deadline)) {
                    Ok(UpdateDeadline::Yield(1))
                } else {
                    Ok(UpdateDeadline::Interrupt)
                }
            });
        }
        let instance = until(
            instantiated_by,
            pre.instance_pre().instantiate_async(&mut *store),
            || false,
            None,
        )
        .await
        .map_err(|_| wasmtime::format_err!("instantiating the guest timed out"))??;
        let run = run_export.typed(&instance, &mut store)?;
        Ok(Fresh {
            store,
            session_run: None,
            run,
            meter_fuel,
        })
    }

    /// Runs a constant snippet (`print('primed')`, with one variable and eight tool bindings,
    /// never called) through the guest's run path, so that a later run starts on pages this
    /// instance has already written.
    ///
    /// Every instance maps the guest's heap snapshot copy-on-write, so the first write to each
    /// snapshot page (a reference count, an allocator header, the interpreter's frame stack)
    /// is a page fault that copies the page and, with the process running on other cores, a
    /// TLB shootdown: about 265 of them in a short run. In a fresh instance those faults were
    /// most of the run: a warm-pool `print('hi')` took about 1.25 ms, and about 0.4 ms in a
    /// primed instance. The warm pool primes in the background, so the faults are paid there.
    ///
    /// A primed instance has run trusted constant code and nothing else: no run's code,
    /// variables or tools (the captured output is cleared when the run starts). It does start
    /// from different allocator and collector state than an unprimed one, so the same code
    /// can take different fuel; a backend that meters fuel does not prime (pooled and
    /// unpooled runs report the same fuel).
    pub async fn prime(&mut self) -> wasmtime::Result<()> {
        const CODE: &str = "print('primed')";
        // Eight tool bindings with descriptions, about what a policy exposes: priming with
        // one left ~39 page faults in a run exposing the five math tools, eight leave ~12
        // (and a run 0.65 -> 0.45 ms).
        const REQUEST: &str = concat!(
            r#"{"vars": {"v": 1}, "max_value_bytes": 64, "tools": ["#,
            r#"["t0", "p.t0", "A tool that the priming run defines and never calls."],"#,
            r#"["t1", "p.t1", "A tool that the priming run defines and never calls."],"#,
            r#"["t2", "p.t2", "A tool that the priming run defines and never calls."],"#,
            r#"["t3", "p.t3", "A tool that the priming run defines and never calls."],"#,
            r#"["t4", "p.t4", "A tool that the priming run defines and never calls."],"#,
            r#"["t5", "p.t5", "A tool that the priming run defines and never calls."],"#,
            r#"["t6", "p.t6", "A tool that the priming run defines and never calls."],"#,
            r#"["t7", "p.t7", "A tool that the priming run defines and never calls."]]}"#,
        );
        let code = Noted {
            text: CODE.into(),
            noter: self.store.data().memory.clone(),
        };
        self.run
            .call_async(&mut *self.store, (code, REQUEST.into()))
            .await?
            .0
            .map(drop)
            .map_err(|f| wasmtime::format_err!("priming failed in the guest: {}", f.message))
    }

    /// Runs one job in this instance, consuming it.
    pub async fn run(mut self, job: Job, gate: Arc<dyn ToolGate>) -> Outcome {
        let outcome = self.run_in(job, gate, false).await;
        // To the reaper thread (see `GuestStore`).
        drop(self);
        outcome
    }

    /// Makes this instance a session's guest: its scratch directory, made on first use (or
    /// by the first run with input files), has `limits`' budgets for the session's life, and
    /// a run that passes its deadline is interrupted (where `sites` has the guest's interrupt
    /// sites) before it is trapped.
    pub fn into_session(
        mut self,
        limits: &crate::Limits,
        sites: interrupt::SiteCell,
    ) -> wasmtime::Result<Fresh> {
        // The same export, typed for a session's code.
        self.session_run = Some(self.run.func().typed(&*self.store)?);
        let state = self.store.data_mut();
        state.scratch = ScratchSlot::Lazy(limits.clone());
        state.interrupt = Some(Arc::new(interrupt::Probe::new(sites)));
        Ok(self)
    }

    /// Runs one job in this instance, which stays usable unless the outcome says it is
    /// poisoned. In a session (`session`), the code runs in the globals earlier runs left,
    /// the scratch directory is the session's, and the produced files are those this run
    /// created or changed.
    pub async fn run_in(
        &mut self,
        mut job: Job,
        gate: Arc<dyn ToolGate>,
        session: bool,
    ) -> Outcome {
        let meter_fuel = self.meter_fuel;
        let store = &mut self.store;
        let noted_run = &self.run;
        let limits = &job.limits;
        let deadline = Instant::now() + limits.wall_timeout();
        let budget = limits.fuel().unwrap_or(u64::MAX);
        {
            let state = store.data_mut();
            state.limiter.set_limit(limits.memory_bytes());
            state.limiter.denied = false;
            state.denied_capability = None;
            state.stdout.reset(limits.max_output_bytes());
            state.stderr.reset(limits.max_output_bytes());
            if let Some(meter) = &job.output_meter {
                meter.attach(&state.stdout, &state.stderr);
            }
            state.deadline = deadline;
            state.gate = Some(gate.clone());
        }
        let files = std::mem::take(&mut job.files);
        let scratch = store.data_mut().scratch.place(files, limits, session);
        let refused = if let Err(e) = scratch {
            Some(e)
        } else if store.data().limiter.over_limit() {
            Some(RunError::new(
                ErrorKind::MemoryLimit,
                "the memory limit is below what the interpreter needs to start",
            ))
        } else if limits.fuel().is_some() && !meter_fuel {
            Some(RunError::new(
                ErrorKind::InvalidInput,
                "a fuel budget needs a backend that meters fuel",
            ))
        } else {
            None
        };
        if let Some(error) = refused {
            store.data_mut().gate = None;
            return Outcome {
                value: Err(error),
                stdout: store.data().stdout.captured(),
                stderr: store.data().stderr.captured(),
                fuel_consumed: None,
                files: Vec::new(),
                poisoned: false,
            };
        }
        if !meter_fuel {
            // The deadline counts from this instance's creation, which for a pooled instance
            // may be many ticks ago: restart it, or the run's first epoch check yields at once.
            store.set_epoch_deadline(1);
        }
        let fuel_set = if meter_fuel {
            store.set_fuel(budget)
        } else {
            Ok(())
        };
        let mut request = serde_json::json!({
            "vars": Value::Object(std::mem::take(&mut job.vars)),
            "tools": crate::policy::wire_bindings(&job.tools),
            "max_value_bytes": limits.max_value_bytes(),
        });
        if session {
            request["session"] = Value::Bool(true);
        }
        let request = request.to_string();

        let probe = store.data().interrupt.clone();
        let outcome = match (fuel_set, &self.session_run, &probe) {
            (Err(e), ..) => Ok(Err(e)),
            (Ok(()), Some(session_run), Some(probe)) => {
                let code = Noted {
                    text: std::mem::take(&mut job.code),
                    noter: (probe.clone(), store.data().memory.clone()),
                };
                let run = async {
                    session_run
                        .call_async(&mut **store, (code, request))
                        .await
                        .map(|(r,)| r)
                };
                until(deadline, run, || gate.halted(), Some(probe)).await
            }
            (Ok(()), ..) => {
                let code = Noted {
                    text: std::mem::take(&mut job.code),
                    noter: store.data().memory.clone(),
                };
                let run = async {
                    noted_run
                        .call_async(&mut **store, (code, request))
                        .await
                        .map(|(r,)| r)
                };
                until(deadline, run, || gate.halted(), None).await
            }
        };

        let fuel_consumed =
            meter_fuel.then(|| budget.saturating_sub(store.get_fuel().unwrap_or(0)));
        let state = store.data();
        let evidence = Evidence {
            memory_denied: state.limiter.denied,
            fuel_budget: limits.fuel(),
            denied_capability: state.denied_capability.as_deref(),
        };
        // A trap, an exit or a run cut at its deadline leaves the instance unusable: the
        // engine unwound it mid-call.
        let poisoned = !matches!(outcome, Ok(Ok(_)));
        let interrupted = probe.as_ref().is_some_and(|p| p.interrupted());
        let value = match outcome {
            _ if interrupted => {
                let failure = match &outcome {
                    Ok(Ok(Err(failure))) => Some(failure.clone()),
                    _ => None,
                };
                Err(classify::interrupted(failure, &evidence, poisoned))
            }
            Err(Stopped::Halted) => Err(RunError::new(
                ErrorKind::Suspended,
                "the run stopped at a tool call",
            )),
            Err(Stopped::DeadlinePassed) => Err(classify::deadline_passed()),
            Ok(Err(error)) => match classify::classify(&error, &evidence) {
                Ending::CleanExit => Ok(Value::Null),
                Ending::Failed(e) => Err(e),
            },
            Ok(Ok(Err(failure))) => Err(classify::guest_failure(failure, &evidence)),
            Ok(Ok(Ok(json))) => decode_value(&json, limits.max_value_bytes()),
        };
        // The guest saw a refused write as an `OSError`; its stderr says why.
        if let Some(usage) = state.scratch.get().map(|s| s.usage())
            && let (count @ 1.., Some(first)) = usage.refusals()
        {
            state.stderr.push(usage.notice(count, first).as_bytes());
        }
        // Whatever the run's end, what it wrote comes back (a trap does not undo a file).
        let files = state
            .scratch
            .get()
            .map(|s| s.produced(limits.max_returned_bytes()))
            .unwrap_or_default();
        if !poisoned && let Some(probe) = &probe {
            // The code may have returned before it handled the interrupt.
            probe.finish();
        }
        let state = store.data();
        let outcome = Outcome {
            value,
            stdout: state.stdout.captured(),
            stderr: if poisoned {
                classify::without_runtime_panic(state.stderr.captured())
            } else {
                state.stderr.captured()
            },
            fuel_consumed,
            files,
            poisoned,
        };
        let state = store.data_mut();
        if session && let ScratchSlot::Ready(scratch) = &mut state.scratch {
            scratch.rebase();
        }
        // The broker goes back to its owner now, not when the instance is dropped.
        state.gate = None;
        outcome
    }
}

/// Why a run's driver stopped its guest before it returned.
enum Stopped {
    /// The run's deadline passed.
    DeadlinePassed,
    /// The run's gate halted it at a tool call.
    Halted,
}

/// Drives `run` (a run, or an instantiation) until it completes or `deadline` passes.
///
/// A metered guest that computes yields every [`FUEL_YIELD_INTERVAL`] of fuel, and an
/// unmetered one at every epoch tick past its deadline, which polls this future again: the
/// clock is read at each poll, so the deadline holds to within one interval without depending
/// on when the runtime's timer driver next runs. The timer covers a guest waiting in a host
/// call (a sleep, a slow tool), where no check in its code runs. An unmetered guest that
/// computes past its deadline (and, in a session, its grace period) is stopped by its epoch
/// check instead, which traps.
///
/// A session's run may be interrupted (`interrupt`, which the run arms as its code is
/// lowered): then the deadline interrupts the code (see `super::interrupt`) between two
/// polls, while the guest is suspended, unless a wait the deadline cut short did first, and
/// the run is stopped only [`interrupt::GRACE`] after the interrupt if it has not returned by
/// then.
///
/// `halted` is asked after each poll: a gate that halted the run at a call leaves the guest
/// parked in it, and the run stops there.
async fn until<F: Future>(
    deadline: Instant,
    run: F,
    halted: impl Fn() -> bool,
    interrupt: Option<&interrupt::Probe>,
) -> Result<F::Output, Stopped> {
    let mut run = pin!(run);
    let mut stop_at = deadline;
    let mut timer = pin!(tokio::time::sleep_until(deadline.into()));
    poll_fn(|cx| {
        if let Poll::Ready(out) = run.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if halted() {
            return Poll::Ready(Err(Stopped::Halted));
        }
        let now = Instant::now();
        if now >= deadline
            && let Some(interrupt) = interrupt.filter(|p| p.armed())
        {
            interrupt.raise(now);
            interrupt.remind();
            let grace_ends = interrupt.stop_at(deadline);
            if stop_at != grace_ends {
                stop_at = grace_ends;
                timer.as_mut().reset(stop_at.into());
            }
        }
        if now >= stop_at || timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Stopped::DeadlinePassed));
        }
        Poll::Pending
    })
    .await
}

/// Where the guest's `run` export is in its component: found once, when the guest is
/// prepared, and typed in each instance.
///
/// Looked up by name in each instance, beside a load of the whole contract
/// (`SandboxIndices::load`), it was part of every fresh run. `run` is the contract's one
/// export, and typing it checks its signature in each instance, as the load did.
#[derive(Clone, Copy)]
pub(crate) struct RunExport(wasmtime::component::ComponentExportIndex);

impl RunExport {
    /// `run` in the guest interface `component` exports, or why it has none.
    pub fn find(component: &wasmtime::component::Component) -> Result<RunExport, String> {
        const INTERFACE: &str = "pycage:sandbox/guest@0.1.0";
        let guest = component
            .get_export_index(None, INTERFACE)
            .ok_or_else(|| format!("the guest exports no `{INTERFACE}`"))?;
        let run = component
            .get_export_index(Some(&guest), "run")
            .ok_or_else(|| format!("the guest's `{INTERFACE}` exports no `run`"))?;
        Ok(RunExport(run))
    }

    /// The export in `instance`, its code shown to `N` as it is lowered.
    fn typed<N: super::noted::Noter>(
        self,
        instance: &wasmtime::component::Instance,
        store: &mut GuestStore,
    ) -> wasmtime::Result<GuestRun<N>> {
        instance.get_typed_func(&mut **store, self.0)
    }
}

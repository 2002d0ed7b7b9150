//! What the guest can reach: the one custom import, the WASI interfaces the host grants, and
//! denial stubs for every other import.
//!
//! # Security
//!
//! The linker is the guest's whole world. Granted are the WASI interfaces CPython needs to
//! run: clocks, random, stdio (captured), an empty environment, `exit`, and the filesystem
//! interfaces with no preopened directory (so no path resolves to anything). Everything else
//! the component imports (today: all of `wasi:sockets`) is linked to stubs that touch nothing
//! on the host: a function whose result can carry the error `access-denied` returns it, so the
//! guest sees an ordinary `PermissionError`; a function that returns a denied resource gets an
//! inert handle; any other function traps with [`CapabilityDenied`].

use std::collections::BTreeSet;

use wasmtime::component::types::{ComponentFunc, ComponentItem};
use wasmtime::component::{
    Component, HasData, HasSelf, Linker, Resource, ResourceAny, ResourceType, Val,
};
use wasmtime::{Engine, StoreContextMut};
use wasmtime_wasi::cli::{WasiCli, WasiCliView};
use wasmtime_wasi::p2::bindings as wasi;
use wasmtime_wasi::random::{WasiRandom, WasiRandomView};
use wasmtime_wasi::{ResourceTable, WasiView};
use wasmtime_wasi_io::bindings::wasi::io::poll::{Host as PollHost, HostPollable};
use wasmtime_wasi_io::poll::DynPollable;

use super::bindings::pycage::sandbox::host;
use super::clock::GuestClocks;
use super::fs::ScratchFs;
use super::interrupt::Probe;
use super::state::RunState;
use crate::broker::CallError;

/// The guest's imports the host implements for real, by interface name without version.
pub(crate) const GRANTED: &[&str] = &[
    "pycage:sandbox/host",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stderr",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stderr",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/preopens",
    "wasi:filesystem/types",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
];

/// A trap: the guest called a capability the sandbox does not grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityDenied {
    /// The import, as `interface#function`.
    pub import: String,
}

impl std::fmt::Display for CapabilityDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the sandbox does not grant `{}`", self.import)
    }
}

impl std::error::Error for CapabilityDenied {}

/// The host type behind every resource of a denied interface. Never holds anything.
struct DeniedResource;

struct Io;

impl HasData for Io {
    type Data<'a> = &'a mut ResourceTable;
}

/// `wasi:io/poll` as wasmtime-wasi has it, except that in a session a wait still going at the
/// run's deadline ends then: the host sends the run's interrupt (`super::interrupt`) and the
/// guest goes back to its code, which raises `KeyboardInterrupt` at its next bytecode, instead
/// of sleeping through its grace period in the host. To the guest the wait ended early
/// (`time.sleep` returns, a selector wakes with nothing ready).
struct Waits;

impl HasData for Waits {
    type Data<'a> = WaitView<'a>;
}

struct WaitView<'a> {
    table: &'a mut ResourceTable,
    cut: Cut<'a>,
}

/// A session run's deadline and its interrupt: what ends a host call at the deadline (see
/// [`cut_at_deadline`]). `None` in a one-shot run, whose driver stops the whole run there.
type Cut<'a> = Option<(std::time::Instant, &'a Probe)>;

/// The [`Cut`] of a run whose state has `interrupt` and `deadline` (fields, so that a caller
/// can borrow the rest of the state beside it).
fn cut(interrupt: &Option<std::sync::Arc<Probe>>, deadline: std::time::Instant) -> Cut<'_> {
    interrupt.as_deref().map(|probe| (deadline, probe))
}

/// `wait`, or, if `cut`'s deadline comes first, `early()`, with the run cut short there: the
/// guest, suspended in this host call, gets the run's interrupt at its next bytecode (or as
/// soon as it no longer holds interrupts), and the wait's future is dropped.
async fn cut_at_deadline<F: Future>(
    cut: Cut<'_>,
    wait: F,
    early: impl FnOnce() -> F::Output,
) -> F::Output {
    let Some((at, probe)) = cut else {
        return wait.await;
    };
    tokio::select! {
        biased;
        done = wait => done,
        () = tokio::time::sleep_until(at.into()) => {
            probe.cut(std::time::Instant::now());
            early()
        }
    }
}

impl PollHost for WaitView<'_> {
    async fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        let cut = self.cut.filter(|_| !pollables.is_empty());
        cut_at_deadline(cut, PollHost::poll(self.table, pollables), || Ok(vec![0])).await
    }
}

impl HostPollable for WaitView<'_> {
    async fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        cut_at_deadline(self.cut, HostPollable::block(self.table, pollable), || {
            Ok(())
        })
        .await
    }

    async fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        HostPollable::ready(self.table, pollable).await
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        HostPollable::drop(self.table, pollable)
    }
}

/// The interface name without its `@version`.
pub(crate) fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Builds the linker for `component`: grants, the broker's `call-tool`, and denial stubs.
pub(crate) fn build(engine: &Engine, component: &Component) -> wasmtime::Result<Linker<RunState>> {
    let mut linker = Linker::<RunState>::new(engine);
    link_granted_wasi(&mut linker)?;
    host::add_to_linker::<RunState, HasSelf<RunState>>(&mut linker, |s| s)?;

    let granted: BTreeSet<&str> = GRANTED.iter().copied().collect();
    let ty = component.component_type();
    // Resources of granted interfaces (such as `pollable`) also appear in denied interfaces
    // that use them; those keep their real definitions.
    let granted_resources: Vec<ResourceType> = ty
        .imports(engine)
        .filter(|(name, _)| granted.contains(unversioned(name)))
        .filter_map(|(_, item)| match item.ty {
            ComponentItem::ComponentInstance(i) => Some(i),
            _ => None,
        })
        .flat_map(|i| {
            i.exports(engine)
                .filter_map(|(_, e)| match e.ty {
                    ComponentItem::Resource(r) => Some(r),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for (name, item) in ty.imports(engine) {
        if granted.contains(unversioned(name)) {
            continue;
        }
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            wasmtime::bail!("the guest imports `{name}`, which is not an interface");
        };
        let mut stubs = linker.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(func) => {
                    let import = format!("{}#{export}", unversioned(name));
                    let deny = denial_for(&func);
                    let import: std::sync::Arc<str> = import.into();
                    stubs.func_new_async(export, move |store, _ty, params, results| {
                        let import = import.clone();
                        Box::new(
                            async move { deny_call(store, &import, deny, params, results).await },
                        )
                    })?;
                }
                ComponentItem::Resource(r) if !granted_resources.contains(&r) => {
                    stubs.resource(
                        export,
                        ResourceType::host::<DeniedResource>(),
                        |_, _| Ok(()),
                    )?;
                }
                _ => {}
            }
        }
    }
    Ok(linker)
}

fn link_granted_wasi(l: &mut Linker<RunState>) -> wasmtime::Result<()> {
    use wasmtime_wasi_io::bindings::wasi::io;
    io::error::add_to_linker::<RunState, Io>(l, |t| t.ctx().table)?;
    io::poll::add_to_linker::<RunState, Waits>(l, |t| WaitView {
        cut: cut(&t.interrupt, t.deadline),
        table: &mut t.table,
    })?;
    io::streams::add_to_linker::<RunState, Io>(l, |t| t.ctx().table)?;
    wasi::clocks::wall_clock::add_to_linker::<RunState, GuestClocks>(l, RunState::guest_clocks)?;
    wasi::clocks::monotonic_clock::add_to_linker::<RunState, GuestClocks>(
        l,
        RunState::guest_clocks,
    )?;
    wasi::random::random::add_to_linker::<RunState, WasiRandom>(l, RunState::random)?;
    wasi::filesystem::types::add_to_linker::<RunState, ScratchFs>(l, RunState::scratch_fs)?;
    wasi::filesystem::preopens::add_to_linker::<RunState, ScratchFs>(l, RunState::scratch_fs)?;
    wasi::cli::exit::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::environment::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::stdin::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::stdout::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::stderr::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::terminal_input::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::terminal_output::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::terminal_stdin::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::terminal_stdout::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    wasi::cli::terminal_stderr::add_to_linker::<RunState, WasiCli>(l, RunState::cli)?;
    Ok(())
}

/// How a denied function answers.
#[derive(Debug, Clone, Copy)]
enum Denial {
    /// Return `err(access-denied)`.
    AccessDenied,
    /// Return an inert handle of a denied resource.
    InertHandle,
    /// Trap with [`CapabilityDenied`].
    Trap,
}

fn denial_for(func: &ComponentFunc) -> Denial {
    use wasmtime::component::types::Type;
    let mut results = func.results();
    match (results.next(), results.next()) {
        (Some(Type::Result(r)), None) => match r.err() {
            Some(Type::Enum(e)) if e.names().any(|n| n == "access-denied") => Denial::AccessDenied,
            _ => Denial::Trap,
        },
        (Some(Type::Own(_)), None) => Denial::InertHandle,
        _ => Denial::Trap,
    }
}

async fn deny_call(
    mut store: StoreContextMut<'_, RunState>,
    import: &str,
    deny: Denial,
    params: &[Val],
    results: &mut [Val],
) -> wasmtime::Result<()> {
    // Handles the guest lends or gives us must be released, or the call cannot return.
    for param in params {
        if let Val::Resource(handle) = param {
            handle.resource_drop_async(&mut store).await?;
        }
    }
    tracing::info!(
        target: "pycage::audit",
        run = store.data().gate.as_ref().map_or("-", |g| g.run_id()),
        import,
        "capability denied"
    );
    store
        .data_mut()
        .denied_capability
        .get_or_insert_with(|| import.to_owned());
    match (deny, results.first_mut()) {
        (Denial::AccessDenied, Some(slot)) => {
            *slot = Val::Result(Err(Some(Box::new(Val::Enum("access-denied".into())))));
            Ok(())
        }
        (Denial::InertHandle, Some(slot)) => {
            let handle = Resource::<DeniedResource>::new_own(0);
            *slot = Val::Resource(ResourceAny::try_from_resource(handle, &mut store)?);
            Ok(())
        }
        _ => Err(wasmtime::Error::new(CapabilityDenied {
            import: import.to_owned(),
        })),
    }
}

impl host::Host for RunState {
    async fn call_tool(
        &mut self,
        name: String,
        args_json: String,
    ) -> Result<String, host::ToolError> {
        let Some(gate) = self.gate.clone() else {
            return Err(host::ToolError::Denied("no run is in progress".into()));
        };
        // In a session, a call still going at the run's deadline is cut there (dropping it
        // cancels the tool). The call fails, and the run's interrupt reaches the code once
        // the call is back in Python (the guest holds it back until then).
        let early = || {
            Err(CallError::Failed(
                "the run's wall-clock limit was reached during this call".into(),
            ))
        };
        let at_deadline = cut(&self.interrupt, self.deadline);
        let outcome = cut_at_deadline(at_deadline, gate.call(&name, &args_json), early).await;
        if gate.halted() {
            // The run stopped at this call (suspended, or off its journal): the guest waits
            // here until the run's driver sees the halt and drops the instance.
            std::future::pending::<()>().await;
        }
        outcome.map_err(|e| match e {
            CallError::NotFound(m) => host::ToolError::NotFound(m),
            CallError::InvalidArguments(m) => host::ToolError::InvalidArguments(m),
            CallError::Denied(m) => host::ToolError::Denied(m),
            CallError::Failed(m) => host::ToolError::Failed(m),
            CallError::LimitExceeded(m) => host::ToolError::LimitExceeded(m),
        })
    }
}

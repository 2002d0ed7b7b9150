//! Interrupting a session's run at its deadline, as Ctrl-C interrupts a notebook cell.
//!
//! A one-shot run that passes its deadline is trapped: its instance is thrown away anyway. A
//! session's instance holds the state of every earlier run, and a trap would end it. So past a
//! session run's deadline the host does, from outside, what a SIGINT does inside CPython: it
//! sets the signal's `tripped` flag, the interpreter's `is_tripped`, and the signals bit of
//! the main thread's eval breaker, in the guest's linear memory. At its next check (each
//! backward jump and call) the eval loop calls the SIGINT handler the guest installed
//! (`signal.default_int_handler`, see `guest-default/python/pycage_wasm.py`), which raises
//! `KeyboardInterrupt` in the running code. The run ends as a timeout and the session lives.
//! Code that does not stop within [`GRACE`] (it swallows the exception, or computes in C,
//! where the eval loop does not check) is trapped as before, and that ends the session.
//!
//! The run's driver (`until` in `super::instance`) writes these between two polls of the
//! run, while the guest is suspended at a fuel or epoch yield (or in a host call), so nothing
//! else touches its memory (see [`Armed`]). Every write is bounds-checked against the guest's
//! own memory; a wrong address could harm only the guest itself. A guest waiting in a host
//! call (a long sleep, a slow tool) sees the interrupt only when the call returns; if that is
//! after the grace period, the run is stopped there and the session ends.
//!
//! **Finding the memory.** The component model gives an embedder no handle on a component's
//! core memory, and a trap (as in a core dump) would end the instance. So a session's runs
//! pass their code as `super::noted::Noted`, which shows the guest's memory to the run's
//! [`Probe`] while wasmtime lowers it.
//!
//! **Finding the places.** The guest's snapshot holds a marked table (`_interrupt_table` in
//! `pycage_wasm.py`): the interpreter's version, `NSIG`, the handler's address and the
//! address of `0` (the interpreter's SIG_DFL object). The signals state (`struct
//! _signals_runtime_state`) is then the one place where a handler entry holds that handler,
//! and `NSIG` entries later come the wakeup descriptor, `is_tripped` and the SIG_DFL object.
//! The main thread state is found through `_PyRuntime`'s debug offsets, which CPython keeps
//! for out-of-process debuggers ("xdebugpy"), and checked by its pointer back to its
//! interpreter. Every instance of one compiled guest has these at the same
//! addresses (they are in the snapshot), so they are found once, when the first session's
//! first run is lowered, before any code ran in its instance. The table also holds a word the
//! guest sets while an interrupt must wait: while a tool call is in the host, and while a
//! failed run's result is built. componentize-py's glue finishes both in Python and cannot
//! take an exception there (it aborts the guest), so the interrupt waits until the word is
//! clear. If any check fails, sessions of
//! that guest trap at their deadline as one-shot runs do, and the log says why.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long code may take to stop after it has been interrupted before it is trapped.
pub(crate) const GRACE: Duration = crate::backend::INTERRUPT_GRACE;

/// Marks the guest's table; `_INTERRUPT_MAGIC` in `guest-default/python/pycage_wasm.py`.
const MAGIC: [u32; 2] = [0x65746E69, 0x70757272];

/// SIGINT's number in WASI's emulated signals (as on Linux).
const SIGINT: usize = 2;

/// The eval breaker's "signals pending" bit (`_PY_SIGNALS_PENDING_BIT`, CPython 3.13+).
const SIGNALS_PENDING: u32 = 1 << 1;

/// Marks `_PyRuntime`'s debug offsets, its first field.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Where, in every instance of one compiled guest, the interpreter keeps what SIGINT sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sites {
    /// `handlers[SIGINT].tripped`.
    sigint_tripped: usize,
    /// `is_tripped`.
    is_tripped: usize,
    /// The main thread state's `eval_breaker`.
    eval_breaker: usize,
    /// The guest's word that says an interrupt must wait (a tool call is in the host, or a
    /// failed run's result is being built).
    held: usize,
}

fn word(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn dword(data: &[u8], at: usize) -> Option<u64> {
    let bytes = data.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// What the guest's table says.
#[derive(Debug, Clone, Copy)]
struct Table {
    hexversion: u32,
    nsig: usize,
    handler: u32,
    sig_dfl: u32,
    /// Where the guest's "interrupts held" word is.
    held: usize,
}

impl Table {
    fn find(data: &[u8]) -> Option<Table> {
        let mut magic = [0u8; 8];
        magic[..4].copy_from_slice(&MAGIC[0].to_le_bytes());
        magic[4..].copy_from_slice(&MAGIC[1].to_le_bytes());
        let mut found = None;
        for at in memchr::memmem::find_iter(data, &magic) {
            let w = |i: usize| word(data, at + 4 * i);
            if at % 4 != 0 || w(7) != Some(!MAGIC[0]) {
                continue;
            }
            let table = Table {
                hexversion: w(2)?,
                nsig: usize::try_from(w(3)?)
                    .ok()
                    .filter(|n| (SIGINT + 1..=1024).contains(n))?,
                handler: w(4)?,
                sig_dfl: w(5)?,
                held: at + 4 * 6,
            };
            if found.replace(table).is_some() {
                return None;
            }
        }
        found
    }
}

impl Sites {
    /// Finds the sites in a guest memory that no code has run in yet.
    pub(crate) fn find(data: &[u8]) -> Result<Sites, &'static str> {
        let table = Table::find(data).ok_or("the guest's interrupt table is missing")?;
        let (sigint_tripped, is_tripped) =
            signal_state(data, &table).ok_or("the interpreter's signal state was not found")?;
        let eval_breaker =
            eval_breaker(data, &table).ok_or("the main thread's state was not found")?;
        Ok(Sites {
            sigint_tripped,
            is_tripped,
            eval_breaker,
            held: table.held,
        })
    }
}

/// `handlers[SIGINT].tripped` and `is_tripped`: the one place where a handler entry
/// (`{int tripped; PyObject *func}`, 8 bytes) holds the SIGINT handler with `tripped` clear,
/// and `NSIG` entries on come the wakeup descriptor (-1), `warn_on_full_buffer` (1), a clear
/// `is_tripped`, and the SIG_DFL object (`default_handler`).
fn signal_state(data: &[u8], table: &Table) -> Option<(usize, usize)> {
    let mut found = None;
    for func in memchr::memmem::find_iter(data, &table.handler.to_le_bytes()) {
        if func % 4 != 0 || func < 4 + 8 * SIGINT {
            continue;
        }
        let tripped = func - 4;
        let base = tripped - 8 * SIGINT;
        let after = base + 8 * table.nsig;
        let matches = word(data, tripped) == Some(0)
            && word(data, after) == Some(u32::MAX)
            && word(data, after + 4) == Some(1)
            && word(data, after + 8) == Some(0)
            && word(data, after + 12) == Some(table.sig_dfl);
        if matches && found.replace((tripped, after + 8)).is_some() {
            return None;
        }
    }
    found
}

/// The main thread state's `eval_breaker`, the field after `prev`, `next` and `interp` (in
/// `struct _ts` since CPython 3.13). The thread is the head of the main interpreter's list,
/// both found by `_PyRuntime`'s debug offsets: the cookie, then `version`, `free_threaded`,
/// `runtime_state {size, finalizing, interpreters_head}` and `interpreter_state {size, id,
/// next, threads_head, ...}`, each a `uint64_t`.
fn eval_breaker(data: &[u8], table: &Table) -> Option<usize> {
    let mut found = None;
    for runtime in memchr::memmem::find_iter(data, DEBUG_COOKIE) {
        if runtime % 8 != 0 || dword(data, runtime + 8) != Some(u64::from(table.hexversion)) {
            continue;
        }
        let offset = |field: usize| usize::try_from(dword(data, runtime + field)?).ok();
        let interp = word(data, runtime.checked_add(offset(40)?)?)? as usize;
        let tstate = word(data, interp.checked_add(offset(72)?)?)? as usize;
        let back = word(data, tstate.checked_add(8)?)? as usize;
        let single = word(data, tstate)? == 0 && word(data, tstate + 4)? == 0;
        if interp != 0 && back == interp && single && found.replace(tstate + 12).is_some() {
            return None;
        }
    }
    found
}

/// Where a session's interrupt sites are, for every session of one compiled guest (`None`:
/// they were not found, and its runs trap at their deadline).
pub(crate) type SiteCell = Arc<OnceLock<Option<Sites>>>;

/// A session's interrupt: armed by each run as its code is lowered, sent at the run's
/// deadline by whichever comes first, the run's driver (between two polls) or a wait or tool
/// call that the deadline cut short (in that host call, see `super::linker`).
pub(crate) struct Probe {
    sites: SiteCell,
    run: Mutex<RunInterrupt>,
}

/// The interrupt of the session's current run.
#[derive(Default)]
struct RunInterrupt {
    armed: Option<Armed>,
    /// When it was sent, if it was.
    sent: Option<Instant>,
    /// The deadline cut a wait or a tool call short: the run is a timeout whatever it returns.
    cut: bool,
}

impl Probe {
    pub(crate) fn new(sites: SiteCell) -> Probe {
        Probe {
            sites,
            run: Mutex::new(RunInterrupt::default()),
        }
    }

    fn run(&self) -> std::sync::MutexGuard<'_, RunInterrupt> {
        // A panic while holding the lock leaves nothing half-written that matters here.
        self.run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends the run's interrupt, once, if the run armed it and the guest does not hold
    /// interrupts (then it waits for a later call of this); returns when it was sent.
    ///
    /// Called only while the guest is suspended: between two polls of the run's future, on
    /// the thread that polls it, or in a host call the guest made. Its code runs only inside
    /// a poll, outside host calls, so nothing else reads or writes its memory now, and
    /// wasmtime keeps no Rust reference to a linear memory's bytes across a suspension or
    /// during an async host call (host calls get owned copies of their arguments).
    pub(crate) fn raise(&self, now: Instant) -> Option<Instant> {
        let mut run = self.run();
        if run.sent.is_none()
            && let Some(armed) = &mut run.armed
            && armed.raise()
        {
            run.sent = Some(now);
        }
        run.sent
    }

    /// Whether the current run can be interrupted (it armed its interrupt).
    pub(crate) fn armed(&self) -> bool {
        self.run().armed.is_some()
    }

    /// When the current run is to be stopped at the latest, past `deadline`: the grace period
    /// after its interrupt, or after the deadline while the interrupt waits to be sent.
    pub(crate) fn stop_at(&self, deadline: Instant) -> Instant {
        self.run().sent.unwrap_or(deadline).max(deadline) + GRACE
    }

    /// Sets the eval breaker's signals bit again while the signal is still unhandled: code
    /// that read the breaker before it was raised and wrote it back after would have cleared
    /// it. Called as [`raise`](Self::raise) is.
    pub(crate) fn remind(&self) {
        if let Some(armed) = &mut self.run().armed {
            armed.remind();
        }
    }

    /// The deadline cut a wait or a tool call of the current run short, at `now`: the run is
    /// a timeout, and its interrupt is sent (or waits to be, see [`raise`](Self::raise)).
    pub(crate) fn cut(&self, now: Instant) {
        self.run().cut = true;
        self.raise(now);
    }

    /// Whether the current run was interrupted (or cut short) at its deadline.
    pub(crate) fn interrupted(&self) -> bool {
        let run = self.run();
        run.sent.is_some() || run.cut
    }

    /// Ends the current run: takes back an interrupt the code did not handle (it returned
    /// first), so that the next run does not start interrupted. Called after the run's future
    /// finished, with the instance still usable.
    pub(crate) fn finish(&self) {
        let mut run = self.run();
        if run.sent.take().is_some()
            && let Some(armed) = &mut run.armed
        {
            armed.clear();
        }
        run.armed = None;
        run.cut = false;
    }

    fn note(&self, memory: &mut [u8]) {
        let sites = *self.sites.get_or_init(|| {
            Sites::find(memory)
                .inspect_err(|why| {
                    tracing::warn!(
                        why,
                        "pycage: session runs cannot be interrupted, and trap at their deadline"
                    );
                })
                .ok()
        });
        let mut run = self.run();
        run.sent = None;
        run.cut = false;
        run.armed = sites.map(|sites| Armed {
            base: memory.as_mut_ptr(),
            len: memory.len(),
            sites,
        });
    }
}

impl super::noted::Noter for Arc<Probe> {
    fn note(&self, memory: &mut [u8]) {
        Probe::note(self, memory);
    }
}

/// One run's interrupt: where to write it in the guest's memory, by address, because the
/// writes happen while the run's future holds the store.
///
/// The address is the memory's base, from the mutable view of it that wasmtime gave the run's
/// lowering. It stays valid for the run: the store that owns the memory outlives the run's
/// future, and the engine is configured so that memories never move (`memory_may_move(false)`
/// in `super::engine`), so growth does not relocate it. Accesses are in bounds of the size the
/// memory had then (memories never shrink).
pub(crate) struct Armed {
    base: *mut u8,
    len: usize,
    sites: Sites,
}

// SAFETY: `Armed` is an address in a guest memory, usable from any thread; it is used only
// while that guest is suspended (see `Probe::raise`).
unsafe impl Send for Armed {}

impl Armed {
    /// Raises SIGINT in the guest, as CPython's signal handler would have, unless the guest
    /// holds interrupts (then false: it waits). Called only as [`Probe::raise`] says.
    fn raise(&mut self) -> bool {
        let s = self.sites;
        if self.read(s.held) != Some(0) {
            return false;
        }
        self.write(s.sigint_tripped, 1);
        self.write(s.is_tripped, 1);
        self.breaker();
        true
    }

    fn remind(&mut self) {
        let s = self.sites;
        if self.read(s.sigint_tripped) == Some(1) && self.read(s.held) == Some(0) {
            self.breaker();
        }
    }

    fn clear(&mut self) {
        let s = self.sites;
        self.write(s.sigint_tripped, 0);
        self.write(s.is_tripped, 0);
        if let Some(bits) = self.read(s.eval_breaker) {
            self.write(s.eval_breaker, bits & !SIGNALS_PENDING);
        }
    }

    fn breaker(&mut self) {
        let at = self.sites.eval_breaker;
        if let Some(bits) = self.read(at) {
            self.write(at, bits | SIGNALS_PENDING);
        }
    }

    fn read(&self, at: usize) -> Option<u32> {
        (at.checked_add(4)? <= self.len).then(|| {
            // SAFETY: in bounds (checked above) of a live memory nothing else touches now (see
            // `Probe::raise` and the type's documentation).
            u32::from_le(unsafe { self.base.add(at).cast::<u32>().read_unaligned() })
        })
    }

    fn write(&mut self, at: usize, value: u32) {
        if at.checked_add(4).is_some_and(|end| end <= self.len) {
            // SAFETY: as in `read`.
            unsafe {
                self.base
                    .add(at)
                    .cast::<u32>()
                    .write_unaligned(value.to_le())
            }
        }
    }
}

//! Used stores are dropped on a background thread, off the run's critical path.
//!
//! Dropping a store returns its instance's slots to the pooling allocator, which resets the
//! linear memory there and then: a page-map scan, the snapshot's bytes copied back over the
//! pages the run wrote, `madvise` for the rest (before that, `super::slot` keeps the written
//! pages within the regions the scan follows). That measured about 130 µs (p50) of a 1.6 ms
//! warm-pool run, all of it after the result was known. The queue is bounded: when the
//! reaper falls behind, a run drops its own store, so used instances never pile up.
//!
//! Every store is dropped through [`dispose`], which refuses to recycle a slot whose reset
//! would be unsound (see [`super::swap`]).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use wasmtime::Store;

use super::engine::SlotReset;
use super::state::RunState;
use super::swap;

/// A guest's store, from its creation on: however it is dropped (after a run, a refused run,
/// a failed instantiation, an unused warm-pool instance), it goes to [`retire`].
pub(crate) struct GuestStore(Option<Store<RunState>>);

impl GuestStore {
    pub fn new(store: Store<RunState>) -> Self {
        GuestStore(Some(store))
    }
}

impl Deref for GuestStore {
    type Target = Store<RunState>;
    #[allow(clippy::expect_used, reason = "`Drop` is the only taker")]
    fn deref(&self) -> &Store<RunState> {
        self.0
            .as_ref()
            .expect("a guest store is only taken when it drops")
    }
}

impl DerefMut for GuestStore {
    #[allow(clippy::expect_used, reason = "`Drop` is the only taker")]
    fn deref_mut(&mut self) -> &mut Store<RunState> {
        self.0
            .as_mut()
            .expect("a guest store is only taken when it drops")
    }
}

impl Drop for GuestStore {
    fn drop(&mut self) {
        if let Some(mut store) = self.0.take() {
            // The scratch directory goes now, on this thread: a store still waiting for the
            // reaper when the process exits (or kept by `dispose`) would leave it on disk.
            // Most runs never made one, and this costs them nothing.
            drop(std::mem::take(&mut store.data_mut().scratch));
            retire(store);
        }
    }
}

/// How many used stores may wait for the reaper before runs drop their own.
const BACKLOG: usize = 64;

/// Stores handed to the reaper and not yet dropped.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Stores the reaper has dropped.
static REAPED: AtomicUsize = AtomicUsize::new(0);

/// Makes the calling thread one that, woken, never preempts the thread running: Linux's
/// `SCHED_BATCH`, the same share of the CPU as any thread otherwise.
///
/// A run hands its store to the reaper as it ends. Woken on the run's own CPU, the reaper
/// (scheduled normally) took that CPU at once, with the other idle: the run's caller waited
/// out the store's reset (about 90 µs of `perf sched timehist`, fresh `pass` runs 1 ms
/// apart) before it saw the result.
fn no_wakeup_preemption() {
    #[cfg(target_os = "linux")]
    {
        // The system call, not libc's wrapper: musl's wrapper (the static build's) fails with
        // ENOSYS by design. The kernel reads the priority (0) from the first field only; the
        // rest of musl's larger `sched_param` is zero.
        // SAFETY: an all-zero `sched_param` is a valid value of a plain C struct.
        let param: libc::sched_param = unsafe { std::mem::zeroed() };
        // SAFETY: `sched_setscheduler(0, ..)` reads `param` and sets the calling thread's
        // policy; it writes no memory.
        let set = unsafe {
            libc::syscall(
                libc::SYS_sched_setscheduler,
                0,
                libc::SCHED_BATCH,
                &raw const param,
            )
        };
        if set != 0 {
            let error = std::io::Error::last_os_error();
            tracing::debug!(%error, "pycage: the reaper keeps the default scheduling policy");
        }
    }
}

/// Drops `store`, on the reaper thread when it has room.
fn retire(store: Store<RunState>) {
    static REAPER: OnceLock<Option<SyncSender<Store<RunState>>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = sync_channel::<Store<RunState>>(BACKLOG);
        std::thread::Builder::new()
            .name("pycage-reaper".into())
            .spawn(move || {
                no_wakeup_preemption();
                for store in rx {
                    dispose(store);
                    REAPED.fetch_add(1, Ordering::AcqRel);
                    PENDING.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| tracing::warn!(error = %e, "pycage: no reaper thread; runs drop their own stores"))
            .ok()
            .map(|_| tx)
    });
    let Some(tx) = reaper else {
        return dispose(store);
    };
    PENDING.fetch_add(1, Ordering::AcqRel);
    if let Err(TrySendError::Full(store) | TrySendError::Disconnected(store)) = tx.try_send(store) {
        PENDING.fetch_sub(1, Ordering::AcqRel);
        // A full queue or a dead reaper hands the store back: it is dropped here.
        dispose(store);
    }
}

/// Drops a used store, returning its slots to the pool, unless the slots reset in place and
/// the host now has swap: a page the guest wrote may be in swap, where the reset would miss
/// it and the slot's next guest would read it. Such a store is kept (leaked) instead, its
/// slots never reused; the backend moves new runs to an engine that releases its slots
/// (`Inner::current`), so this happens only to the stores alive when swap was turned on.
///
/// Checked just before the reset: swap turned on and a page of this slot swapped out in the
/// microseconds between the check and the reset's scan would still be missed.
fn dispose(mut store: Store<RunState>) {
    if store.data().reset == SlotReset::InPlace && swap::in_use() {
        store.data_mut().gate = None;
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "pycage: the host has swap now; used sandboxes of the engine created without \
                 it are kept, not recycled (their memory is not returned)"
            );
        });
        std::mem::forget(store);
        return;
    }
    if store.data().reset == SlotReset::InPlace {
        super::slot::merge(&store.data().memory);
    }
    drop(store);
}

/// Whether some used stores still hold their slots.
pub(crate) fn pending() -> bool {
    PENDING.load(Ordering::Acquire) > 0
}

/// How many stores the reaper has dropped so far: a slot may have come free since a caller
/// last read it.
pub(crate) fn reaped() -> usize {
    REAPED.load(Ordering::Acquire)
}

/// Waits until the reaper has dropped every store handed to it so far (or more arrive than
/// it keeps up with for a second: the caller then sees its own error again).
pub(crate) async fn drained() {
    let until = Instant::now() + Duration::from_secs(1);
    while pending() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

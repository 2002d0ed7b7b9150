//! The warm pool: guest instances instantiated ahead of time, so a run's latency is only its
//! execution.
//!
//! Instances are never reused: a run takes a never-used instance out of the pool and drops it
//! afterwards, and a background task instantiates a replacement. The pool only moves the
//! instantiation cost off the run's critical path; it does not change what a run can see.
//!
//! Unless the backend meters fuel, the filler also primes each instance (see
//! [`Fresh::prime`]): it runs a constant snippet once, so the copy-on-write page faults a
//! run would take on its first writes happen in the background too.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::Inner;
use super::instance::Fresh;

/// Ready instances plus the task that keeps them topped up.
pub(crate) struct WarmPool {
    target: usize,
    primed: bool,
    ready: Mutex<Vec<Fresh>>,
    wake: Arc<Notify>,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl WarmPool {
    /// A pool of `target` instances; `primed` when the filler primes them.
    pub fn new(target: usize, primed: bool) -> Self {
        WarmPool {
            target,
            primed,
            ready: Mutex::new(Vec::with_capacity(target)),
            wake: Arc::new(Notify::new()),
            filler: Mutex::new(None),
        }
    }

    /// A ready instance, if the pool has one, and the promise to replace it.
    ///
    /// A pool of primed instances replaces the instance after the run, when the returned
    /// [`Refill`] is dropped, unless the pool is now empty (so a burst does not wait for runs
    /// to finish). Instantiating and priming beside a short run slowed it: deferring took a
    /// primed warm-pool `print('hi')` from about 0.77 to 0.60 ms (p50), its p99 from 1.3 to
    /// 0.8 ms. An unprimed run, which takes hundreds of copy-on-write faults, measured the
    /// other way (2.2 ms beside the refill, 2.4-3.0 ms after it), so unprimed pools refill at
    /// once.
    pub fn take(&self) -> (Option<Fresh>, Refill<'_>) {
        let (fresh, left) = {
            let mut ready = lock(&self.ready);
            let fresh = ready.pop();
            (fresh, ready.len())
        };
        if left == 0 || !self.primed {
            self.wake.notify_one();
        }
        (fresh, Refill(self))
    }

    /// Whether the filler primes the instances (see [`Fresh::prime`]).
    pub fn primes(&self) -> bool {
        self.primed
    }

    /// How many instances are ready now.
    pub fn ready(&self) -> usize {
        lock(&self.ready).len()
    }

    /// Starts the filler on the current tokio runtime unless one is running. A filler dies
    /// with the runtime it was spawned on, so this is checked on every run.
    pub fn ensure_filler(&self, backend: Weak<Inner>) {
        let mut filler = lock(&self.filler);
        if filler.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        *filler = Some(tokio::spawn(fill(backend)));
    }
}

/// Wakes the filler when dropped: after the run it was taken for, however that run ends.
pub(crate) struct Refill<'a>(&'a WarmPool);

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        self.0.wake.notify_one();
    }
}

async fn fill(backend: Weak<Inner>) {
    loop {
        let Some(b) = backend.upgrade() else { return };
        let Some(pool) = b.pool.as_ref() else { return };
        let wake = pool.wake.clone();
        while pool.ready() < pool.target {
            match b.instantiate_for_pool().await {
                Ok(fresh) => lock(&pool.ready).push(fresh),
                Err(e) => {
                    tracing::error!(error = %e, "pycage: the warm pool could not instantiate a guest");
                    return;
                }
            }
        }
        // Hold no strong reference while idle, so the backend can be dropped. A wake-up sent
        // in between is kept by `Notify` as a permit, so none is lost.
        drop(b);
        wake.notified().await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

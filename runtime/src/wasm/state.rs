//! The per-run host state: the `T` of each run's `Store<T>`.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use wasmtime_wasi::filesystem::WasiFilesystemCtxView;

use super::clock::VirtualClock;
use super::engine::SlotReset;
use super::fs::{ScratchSlot, ScratchView};
use super::interrupt::Probe;
use super::slot::MemoryNote;
use crate::broker::ToolGate;
use crate::capture::CapturePipe;

/// The most WASI resources (streams, pollables, descriptors) a guest may hold at once. Each
/// costs host memory, so the table is bounded like every other host-side buffer.
pub(crate) const MAX_RESOURCES: usize = 10_000;

/// The most elements any guest table may grow to. CPython's function table holds some tens of
/// thousands of entries; this bounds host memory spent on tables.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Everything one run's store holds on the host side.
pub(crate) struct RunState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: GuestLimiter,
    /// Where the run's tool calls go (its broker); `None` until a run starts.
    pub gate: Option<Arc<dyn ToolGate>>,
    /// The wall-clock deadline, checked at every epoch tick (in an engine without fuel).
    pub deadline: Instant,
    /// Set when the guest called a WASI capability the sandbox does not grant.
    pub denied_capability: Option<String>,
    pub stdout: CapturePipe,
    pub stderr: CapturePipe,
    /// How the engine resets this store's slots when it is dropped.
    pub reset: SlotReset,
    /// The guest's scratch directory (its working directory, and its files in and out).
    pub scratch: ScratchSlot,
    /// In deterministic mode, the time both of the guest's clocks read (see `super::clock`);
    /// `None`: the host's clocks.
    pub virtual_clock: Option<VirtualClock>,
    /// A session's interrupt: its run is interrupted at its deadline and given a grace period
    /// before it is trapped (see `super::interrupt`). `None`: a one-shot run, trapped at once.
    pub interrupt: Option<Arc<Probe>>,
    /// Where the guest's memory is, once its first call has been lowered (see `super::slot`).
    pub memory: Arc<MemoryNote>,
}

impl RunState {
    /// The guest's filesystem: wasmtime-wasi's, behind the scratch directory's budgets.
    pub fn scratch_fs(&mut self) -> ScratchView<'_> {
        ScratchView {
            fs: WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            scratch: &mut self.scratch,
        }
    }
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Enforces the run's memory limit across all of the guest's linear memories, and remembers
/// whether it had to refuse a growth (which turns a later `MemoryError` or crash into a
/// `memory_limit` result).
#[derive(Debug)]
pub(crate) struct GuestLimiter {
    limit: usize,
    used: usize,
    pub denied: bool,
}

impl GuestLimiter {
    pub fn new(limit: u64) -> Self {
        GuestLimiter {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            used: 0,
            denied: false,
        }
    }

    /// Sets the limit for the run about to start. Memory already held counts against it.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = usize::try_from(limit).unwrap_or(usize::MAX);
    }

    /// True when the guest already holds more than the limit.
    pub fn over_limit(&self) -> bool {
        self.used > self.limit
    }

    /// Bytes of linear memory the guest holds.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn used(&self) -> usize {
        self.used
    }
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.denied = true;
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_counts_all_memories_and_remembers_refusals() {
        let mut l = GuestLimiter::new(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        assert!(l.memory_growing(0, 30, None).unwrap());
        assert_eq!(l.used(), 90);
        assert!(!l.denied);
        assert!(
            !l.memory_growing(60, 80, None).unwrap(),
            "90 - 60 + 80 > 100"
        );
        assert!(l.denied);
        assert_eq!(l.used(), 90);
        assert!(l.memory_growing(30, 40, None).unwrap());
        assert_eq!(l.used(), 100);
    }
}

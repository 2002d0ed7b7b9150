//! Whether the host can swap: the condition under which resetting a memory slot in place is
//! unsound.
//!
//! wasmtime 48 resets a pooled slot in place (see `engine::pooling`) by asking the kernel,
//! with `PAGEMAP_SCAN`, for the pages the guest wrote that are *present*, copying the
//! snapshot back over those, and releasing the rest of the slot only past where the scan
//! stopped. A page the guest wrote that the kernel has moved to swap is not present: it is
//! neither copied over nor released, and the next guest in the slot reads it back from swap.
//! Measured with a 1 GiB swap file and `MADV_PAGEOUT` during a run: the next two runs in the
//! slot saw a trap (`uninitialized element`) and then 11 of the first run's 288 module
//! changes; `tests/swap_isolation.rs` stages the same (there the next run trapped with an out
//! of bounds memory access). Without a swap area, written pages cannot leave memory, so the
//! scan sees them all, except one the kernel is migrating at that instant: a race this check
//! cannot see (SECURITY.md, residual risks).

/// Whether any swap area is active on the host. `sysinfo(2)` is not namespaced, so inside a
/// container this is the host's swap, which is the one that matters. About 0.7 µs (timed
/// through `ctypes` against `getppid`); engines that reset in place pay it twice a run.
#[cfg(target_os = "linux")]
pub(crate) fn in_use() -> bool {
    rustix::system::sysinfo().totalswap > 0
}

/// Elsewhere slots are never reset in place (`PAGEMAP_SCAN` is Linux's), so the answer only
/// has to be safe.
#[cfg(not(target_os = "linux"))]
pub(crate) fn in_use() -> bool {
    true
}

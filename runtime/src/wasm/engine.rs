//! The engine-wide pieces: one `Engine` configuration and one epoch ticker per engine.

use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig,
    WasmBacktraceDetails,
};

use crate::MAX_MEMORY_BYTES;

/// The default ceiling on guest instances alive at once.
pub(crate) const DEFAULT_MAX_INSTANCES: u32 = 1000;

/// The most dirty bytes of a memory slot restored in place (rather than released) when an
/// instance is dropped.
const KEEP_RESIDENT_BYTES: usize = 32 << 20;

/// Core module instances in one guest component (7 today: the heap snapshot's module, the
/// guest's libraries linked into one, componentize-py's WASI adapter and import shims); with
/// headroom for a new componentize-py.
const CORE_INSTANCES_PER_GUEST: u32 = 32;

/// Tables in one guest component: the guest's function table (owned by its code, so wasmtime
/// fills it lazily; see `guest-build/src/link/mod.rs`), the table the heap snapshot's module
/// keeps for a few trampolines, and the import shim's.
const TABLES_PER_GUEST: u32 = 3;

/// How often the ticker advances the engine's epoch. Each tick lets a running guest check its
/// deadline and yield to the async runtime, so this is both the wall-clock precision and the
/// longest a guest can hold an executor thread without yielding.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The most native stack the guest's wasm code may use. CPython recurses on the C stack for
/// nested expressions, `json` and `repr`; this leaves room for what CPython itself allows.
const MAX_WASM_STACK: usize = 64 << 20;

/// The stack each run's fiber gets: well above `MAX_WASM_STACK`, so a guest stack overflow is
/// a trap and the host functions it calls still have room.
const ASYNC_STACK: usize = MAX_WASM_STACK + (2 << 20);

/// How much fuel a metered guest burns between yields to the async runtime: about 1.3-2.8 ms
/// of guest execution on the machine we measured (3.6-7.6 billion units a second, whether the
/// guest computes, copies memory or allocates).
pub(crate) const FUEL_YIELD_INTERVAL: u64 = 10_000_000;

/// The configuration every pycage engine uses. The compiled-artifact cache key includes it.
///
/// A guest that computes is stopped at its deadline by one of two checks compiled into its
/// code, never both. Without fuel metering, epoch interruption: a check at each function
/// entry and loop header against the epoch the engine's ticker advances. With metering, the
/// fuel counter Cranelift already maintains at every basic block: the store yields every
/// [`FUEL_YIELD_INTERVAL`] units and the run's async deadline ends it there. Compiling in
/// both checks cost 21-31% on the compute case over the unmetered engine; fuel alone costs
/// 1-8% (`pycage bench --only fuel_overhead`, side by side).
///
/// A `deterministic` engine also canonicalizes NaNs and makes relaxed SIMD deterministic, so
/// float results do not depend on the host's CPU.
pub(crate) fn config(meter_fuel: bool, deterministic: bool) -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .cranelift_nan_canonicalization(deterministic)
        .relaxed_simd_deterministic(deterministic)
        .consume_fuel(meter_fuel)
        .epoch_interruption(!meter_fuel)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(ASYNC_STACK)
        .wasm_backtrace_details(WasmBacktraceDetails::Disable)
        // A session's interrupt writes into the guest's memory by address while the run's
        // future holds the store, so memories never move (`super::interrupt`).
        .memory_may_move(false);
    // No `compiler_inlining`: with the guest's libraries linked into one module
    // (`guest-build/src/link`), Cranelift could inline across what were library calls, and the
    // compute case ran 15% faster (metered 177-183 -> 151-154 ms, side by side), but the
    // first compile took 23 s instead of 6 s and 8.2 GB of memory instead of 0.4 GB (4.2 GB
    // and 9% faster with the callee-size limit at 500), a poor trade for the desktops and edge
    // hosts that compile the guest once and then run it. The default guest is inlined at its
    // build instead, once, by binaryen (`guest-build/src/optimize.rs`).
    // For profiling: `PYCAGE_PERFMAP=1 perf record ...` names the guest's functions.
    if std::env::var_os("PYCAGE_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

/// How a pooled slot's memory is put back to the snapshot when its instance is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotReset {
    /// Find the pages the run wrote (`PAGEMAP_SCAN`, Linux 6.7+) and copy the snapshot back
    /// over them, so the next instance in the slot starts without faulting them in. Sound
    /// only while the host has no swap (see [`super::swap`]).
    InPlace,
    /// Release the slot's pages (`madvise(MADV_DONTNEED)`): swapped-out pages go too, and the
    /// next instance faults in what it touches.
    Release,
}

impl SlotReset {
    /// In place where the kernel can scan and the host has no swap; release otherwise.
    pub(crate) fn for_this_host() -> SlotReset {
        if PoolingAllocationConfig::is_pagemap_scan_available() && !super::swap::in_use() {
            SlotReset::InPlace
        } else {
            SlotReset::Release
        }
    }
}

/// The pooling allocator, sized for the CPython guest: instances, memories, tables and fiber
/// stacks come from slots reserved once, so creating an instance maps memory instead of
/// allocating it, and the guest's 30 MiB heap snapshot is a copy-on-write image.
fn pooling(max_instances: u32, reset: SlotReset) -> PoolingAllocationConfig {
    let mut p = PoolingAllocationConfig::new();
    p.total_component_instances(max_instances)
        .max_core_instances_per_component(CORE_INSTANCES_PER_GUEST)
        .total_core_instances(max_instances.saturating_mul(16))
        .max_memories_per_component(4)
        .total_memories(max_instances)
        .max_tables_per_component(TABLES_PER_GUEST + 1)
        .total_tables(max_instances.saturating_mul(TABLES_PER_GUEST))
        // The guest's function table: about 5,700 entries for CPython alone; a guest with
        // C extensions linked in holds theirs too (13,775 with numpy, 19,135 with numpy and
        // pandas). Only a table's used entries are reset; the bound costs address space.
        .table_elements(32 * 1024)
        .max_memory_size(MAX_MEMORY_BYTES as usize)
        // A run can need a second fiber: a denied WASI call releases the guest's handles
        // asynchronously from inside the guest's own fiber.
        .total_stacks(max_instances.saturating_mul(2));
    // A run dirties pages of the guest's heap snapshot, and reads many more. Releasing them
    // means the next instance in the slot page-faults (and copies) them all again. Resetting
    // in place copies the snapshot back over the written pages and keeps the rest mapped: 10
    // faults per fresh `pass` against 168 when released (`perf stat`, the difference between
    // a long and a short run), and twice the fresh runs a second with two callers. wasmtime
    // 48 keeps at most 32 separate written regions this way and releases everything after
    // the 32nd, read-only mappings included. The guest's build keeps a short run below that
    // (an immortal snapshot, its still-written code packed together: see
    // `guest-default/python/pycage_wasm.py`), and before a used store is dropped the smallest
    // gaps between the regions its slot holds are filled so that they stay within it
    // (`super::slot`). Without PAGEMAP_SCAN,
    // keeping pages resident would `memset` the whole region on every drop, which costs more
    // than it saves. With swap, resetting in place is unsound (see `super::swap`).
    match reset {
        SlotReset::InPlace => {
            p.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
                .table_keep_resident(64 * 1024);
        }
        SlotReset::Release => {
            p.pagemap_scan(Enabled::No);
        }
    }
    p
}

/// Creates an engine and, unless it meters fuel, starts its one epoch ticker. The ticker
/// holds only a weak reference and stops when the engine is dropped. The pooling allocator is
/// used where the host lets it reserve its address space; otherwise instances are allocated on
/// demand (each memory is unmapped when its instance is dropped: [`SlotReset::Release`]).
/// Returns the engine and how it resets its slots.
pub(crate) fn new_engine(
    max_instances: u32,
    meter_fuel: bool,
    deterministic: bool,
    reset: SlotReset,
) -> wasmtime::Result<(Engine, SlotReset)> {
    let mut pooled = config(meter_fuel, deterministic);
    pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(
        max_instances,
        reset,
    )));
    let (engine, reset) = match Engine::new(&pooled) {
        Ok(engine) => (engine, reset),
        Err(e) => {
            tracing::warn!(error = %e, "pycage: pooling allocator unavailable; allocating on demand");
            (
                Engine::new(&config(meter_fuel, deterministic))?,
                SlotReset::Release,
            )
        }
    };
    tracing::debug!(?reset, "pycage: wasm engine");
    if meter_fuel {
        return Ok((engine, reset));
    }
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("pycage-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .map_err(|e| wasmtime::format_err!("starting the epoch ticker: {e}"))?;
    Ok((engine, reset))
}

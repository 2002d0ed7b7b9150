//! The engine-wide pieces: one `Engine` configuration and one epoch ticker per engine.

use std::time::Duration;

use wasmtime::{Config, Engine, WasmBacktraceDetails};

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

/// The configuration every pycage engine uses. The compiled-artifact cache key includes it.
pub(crate) fn config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(ASYNC_STACK)
        .wasm_backtrace_details(WasmBacktraceDetails::Disable);
    config
}

/// Creates an engine and starts its one epoch ticker. The ticker holds only a weak reference
/// and stops when the engine is dropped.
pub(crate) fn new_engine() -> wasmtime::Result<Engine> {
    let engine = Engine::new(&config())?;
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
    Ok(engine)
}

//! Fuzzes the broker's request path: name resolution, the size cap, argument decoding, the
//! call ceiling and result handling. The properties are in `pycage::fuzzing::broker_calls`,
//! which the regression tests replay too.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(pycage::fuzzing::broker_calls(data));
});

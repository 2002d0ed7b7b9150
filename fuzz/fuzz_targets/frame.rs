//! Fuzzes the OS backends' socket protocol as a hostile peer sees it: the length check and the
//! request decoder. The properties are in `pycage::fuzzing::socket_frames`, which the
//! regression tests replay too.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| pycage::fuzzing::socket_frames(data));

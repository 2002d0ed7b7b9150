//! Rust bindings for the WIT contract in `wit/pycage.wit`.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "wit",
    world: "sandbox",
    imports: { default: async },
    exports: { default: async },
});

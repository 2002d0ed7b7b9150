//! Build-time linking of the guest's libraries into one core module.
//!
//! componentize-py builds the guest the way a dynamic linker would: libc, libpython, its own
//! runtime and a few small libraries stay separate core modules ("libraries" here), each
//! importing one shared memory and one shared function table from a `main` module that also
//! holds the heap snapshot. Each library puts its function pointers into that imported table
//! through an element segment at an imported offset (`__table_base`), reaches the other
//! libraries' functions through imports, and their data through imported globals
//! (`__memory_base` and the `GOT.mem`/`GOT.func` entries, which componentize-py's `__init`
//! module filled in at build time and the snapshot keeps).
//!
//! That costs every instantiation. wasmtime fills a table lazily, on the first call through
//! each slot, only when the module that *defines* the table initializes it at constant
//! offsets; a segment into an imported table is applied in full when the module is
//! instantiated, one function reference at a time, each found by searching the compiled
//! code's tables. For this guest that was about 5,700 references built for every fresh
//! sandbox, whichever few the run would call: about half the host's CPU in a profile of
//! back-to-back fresh runs.
//!
//! [`link_libraries`] finishes the link at build time:
//!
//! - The libraries become one core module that defines its own function table, laid out slot
//!   for slot as the shared one, with every segment at the constant offset the snapshot's
//!   `__table_base` values give. wasmtime fills it lazily.
//! - The globals the snapshot fixed (`__memory_base`, `__table_base`, the `GOT` entries)
//!   become the merged module's own, constant wherever no code writes them, so the compiler
//!   folds them into addresses; the stack pointer becomes its own mutable global.
//! - A call from one library to another becomes a direct call, also where componentize-py
//!   routed it through one of `main`'s trampolines (a function that calls through a fixed
//!   table slot, for symbols defined by a library instantiated later).
//!
//! Everything else stays: `main` keeps the memory, the snapshot and its own table. Code
//! outside the libraries still calls some of `main`'s trampolines (the WASI adapter calls
//! `cabi_realloc`); a small module that takes `__init`'s place fills just those slots of
//! `main`'s table. `__init` itself only ran at build time, before the snapshot was taken.
//!
//! The component keeps its index spaces, so nothing that refers to an index needs renumbering:
//! the merged module is instantiated where the first library was, the other libraries'
//! instances become empty export bags, and every alias of a library's export names the
//! merged instance's export of it instead. Every external the merged module imports must
//! come from an instance defined before the first library; one defined later fails the
//! build, as does anything else this code does not expect of componentize-py's output.

mod component;
mod emit;
mod merge;
mod module;

use wasmparser::{ExternalKind, Operator};

type Result<T> = std::result::Result<T, String>;

/// Links the libraries of a componentize-py component into one core module (see the module
/// docs), passes that module through `optimize` (which must keep its imports, exports and
/// table as they are: `crate::optimize`), and returns the new component, validated.
pub fn link_libraries(
    component: &[u8],
    optimize: impl FnOnce(Vec<u8>) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let top = component::Top::parse(component)?;
    let group = merge::Group::find(&top)?;
    let plan = merge::Linker::new(&top, &group).plan()?;
    let mut linked = emit::emit(&plan)?;
    linked.merged = optimize(std::mem::take(&mut linked.merged))?;
    let out = component::rewrite(&top, &group, &linked)?;
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&out)
        .map_err(|e| format!("the linked component does not validate: {e}"))?;
    Ok(out)
}

/// The value of a constant expression that is one `i32.const`.
fn const_i32(expr: &wasmparser::ConstExpr<'_>) -> Option<i32> {
    let mut ops = expr.get_operators_reader();
    match (ops.read().ok()?, ops.read().ok()?) {
        (Operator::I32Const { value }, Operator::End) => Some(value),
        _ => None,
    }
}

/// Whether two kinds name the same index space (`FuncExact` is a function).
fn same_kind(a: ExternalKind, b: ExternalKind) -> bool {
    let space = |k| match k {
        ExternalKind::FuncExact => ExternalKind::Func,
        k => k,
    };
    space(a) == space(b)
}

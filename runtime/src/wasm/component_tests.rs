//! The embedded guest is linked for cheap instantiation (see `guest-build/src/link/mod.rs`).

use wasmparser::{ElementItems, ElementKind, Encoding, Operator, Parser, Payload, TypeRef};

use super::COMPONENT;

/// What one core module of the guest does with function tables.
#[derive(Default, Debug)]
struct Module {
    is_library: bool,
    imported_functions: u32,
    defined_functions: usize,
    imported_table: bool,
    /// The minimum size of the table it defines, if it defines one.
    defined_table: Option<u64>,
    /// Function references wasmtime can put in place lazily: segments into the module's own
    /// table at constant offsets within its size, up to the first segment that is not.
    lazy: usize,
    /// References to the module's own functions that instantiation builds up front: each
    /// costs a search of the compiled code. (An imported function's reference costs none.)
    eager: usize,
}

fn modules() -> Vec<Module> {
    let mut modules: Vec<Module> = Vec::new();
    for payload in Parser::new(0).parse_all(COMPONENT) {
        let payload = payload.expect("the embedded component parses");
        if let Payload::Version {
            encoding: Encoding::Module,
            ..
        } = payload
        {
            modules.push(Module::default());
            continue;
        }
        let Some(m) = modules.last_mut() else {
            continue;
        };
        match payload {
            Payload::CustomSection(c) if c.name() == "dylink.0" => m.is_library = true,
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    match import.unwrap().ty {
                        TypeRef::Func(_) | TypeRef::FuncExact(_) => m.imported_functions += 1,
                        TypeRef::Table(_) => m.imported_table = true,
                        _ => {}
                    }
                }
            }
            Payload::FunctionSection(reader) => m.defined_functions = reader.count() as usize,
            Payload::TableSection(reader) => {
                m.defined_table = reader.into_iter().next().map(|t| t.unwrap().ty.initial);
            }
            Payload::ElementSection(reader) => {
                let mut still_lazy = true;
                for element in reader {
                    let element = element.unwrap();
                    let ElementKind::Active { offset_expr, .. } = element.kind else {
                        continue;
                    };
                    let ElementItems::Functions(funcs) = element.items else {
                        still_lazy = false;
                        continue;
                    };
                    let funcs: Vec<u32> = funcs.into_iter().map(Result::unwrap).collect();
                    let offset = match offset_expr.get_operators_reader().read() {
                        Ok(Operator::I32Const { value }) => Some(value as u64),
                        _ => None,
                    };
                    still_lazy &= !m.imported_table
                        && matches!((offset, m.defined_table),
                            (Some(o), Some(min)) if o + funcs.len() as u64 <= min);
                    if still_lazy {
                        m.lazy += funcs.len();
                    } else {
                        m.eager += funcs.iter().filter(|&&f| f >= m.imported_functions).count();
                    }
                }
            }
            _ => {}
        }
    }
    modules
}

#[test]
fn instantiating_the_guest_builds_few_function_references() {
    let modules = modules();
    assert!(
        modules.iter().all(|m| !m.is_library),
        "a library module is left unlinked: {modules:#?}"
    );
    let code = modules
        .iter()
        .max_by_key(|m| m.defined_functions)
        .expect("the guest has core modules");
    // CPython, libc and componentize-py's runtime together: 9,156 functions once wasm-opt has
    // inlined away those with one caller, over 10,000 before.
    assert!(code.defined_functions > 8_000, "{code:?}");
    assert!(
        code.defined_table.is_some() && !code.imported_table,
        "the guest's code does not own its function table: {code:?}"
    );
    // The guest's function table holds about 5,700 references; all of them are lazy.
    assert!(code.lazy > 5_000, "{code:?}");
    let eager: usize = modules.iter().map(|m| m.eager).sum();
    assert!(
        eager <= 16,
        "instantiating the guest builds {eager} references up front: {modules:#?}"
    );
}

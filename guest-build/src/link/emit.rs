//! Encoding the merged module, and the module that fills `main`'s table for code outside the
//! libraries.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use wasm_encoder::reencode::{Error as ReencodeError, Reencode, RoundtripReencoder};
use wasm_encoder::{
    CodeSection, ConstExpr, ElementMode, ElementSection, ElementSegment, Elements, EntityType,
    ExportKind, ExportSection, FunctionSection, GlobalSection, GlobalType, ImportSection,
    Instruction, Module, NameMap, NameSection, RefType, TableSection, TableType, TypeSection,
};
use wasmparser::{ElementItems, ElementKind, ExternalKind, Operator};

use super::Result;
use super::merge::{Export, Func, Global, Plan};

/// The filler's import module for `main`'s table, and for the merged module's functions.
pub const FILLER_TABLE: &str = "main";
pub const FILLER_FUNCS: &str = "libraries";

/// The merged module's import module for an outside instance.
pub fn outside_module(instance: u32) -> String {
    format!("instance{instance}")
}

/// What the rewritten component needs of the merged module.
pub struct Linked {
    pub merged: Vec<u8>,
    /// The module that takes `__init`'s place (see [`filler`]).
    pub filler: Vec<u8>,
    /// The instances the merged module imports from, each under [`outside_module`].
    pub outside: BTreeSet<u32>,
    /// For each library export the component aliases, (library, name): the merged module's
    /// export name for it.
    pub exports: HashMap<(usize, String), String>,
}

/// The merged module's index spaces: imported functions, then each library's functions;
/// copies of `main`'s globals, then each library's globals; each library's types.
struct Layout {
    func_base: Vec<u32>,
    /// `main`'s global -> its copy's index (the first globals of the merged module).
    main_globals: HashMap<u32, u32>,
    global_base: Vec<u32>,
    type_base: Vec<u32>,
}

impl Layout {
    fn new(plan: &Plan) -> Layout {
        let bases = |start: u32, sizes: &mut dyn Iterator<Item = usize>| {
            let mut next = start;
            sizes
                .map(|n| {
                    let base = next;
                    next += n as u32;
                    base
                })
                .collect::<Vec<u32>>()
        };
        Layout {
            func_base: bases(
                plan.func_imports.len() as u32,
                &mut plan.libs.iter().map(|l| l.functions.len()),
            ),
            main_globals: (0..)
                .zip(&plan.main_globals)
                .map(|(i, &g)| (g, i))
                .collect(),
            global_base: bases(
                plan.main_globals.len() as u32,
                &mut plan.libs.iter().map(|l| l.globals.len()),
            ),
            type_base: bases(0, &mut plan.libs.iter().map(|l| l.types.len())),
        }
    }

    fn func(&self, f: Func) -> u32 {
        match f {
            Func::Import(n) => n as u32,
            Func::Defined(lib, i) => self.func_base[lib] + i,
        }
    }

    fn global(&self, g: Global) -> u32 {
        match g {
            // The linker lists every `main` global it hands out as `Global::Main`.
            Global::Main(m) => self.main_globals[&m],
            Global::Defined(lib, i) => self.global_base[lib] + i,
        }
    }
}

pub fn emit(plan: &Plan) -> Result<Linked> {
    let layout = Layout::new(plan);
    let mut maps: Vec<IndexMap> = (0..plan.libs.len())
        .map(|lib| IndexMap {
            types: layout.type_base[lib],
            funcs: plan.funcs[lib].iter().map(|&f| layout.func(f)).collect(),
            globals: plan.globals[lib]
                .iter()
                .map(|&g| layout.global(g))
                .collect(),
            elements: Vec::new(),
            ref_funcs: BTreeSet::new(),
            written: BTreeSet::new(),
        })
        .collect();
    let mut next_element = 0u32;
    for (lib, map) in maps.iter_mut().enumerate() {
        let n = plan.libs[lib].elements.len() as u32;
        map.elements = (next_element..next_element + n).collect();
        next_element += n;
    }

    // The code first: it tells which globals are written and which functions `ref.func`
    // takes.
    let mut code = CodeSection::new();
    for (lib, map) in maps.iter_mut().enumerate() {
        for body in &plan.libs[lib].bodies {
            map.parse_function_body(&mut code, body.clone())
                .map_err(|e| {
                    format!(
                        "re-encoding a function of {}: {e:?}",
                        plan.group.libs[lib].name
                    )
                })?;
        }
    }
    let written: BTreeSet<u32> = maps
        .iter()
        .flat_map(|m| m.written.iter().copied())
        .collect();

    let mut module = Module::new();
    let mut types = TypeSection::new();
    for (lib, map) in maps.iter_mut().enumerate() {
        if let Some(reader) = plan.libs[lib].type_section.clone() {
            map.parse_type_section(&mut types, reader)
                .map_err(|e| format!("re-encoding types: {e:?}"))?;
        }
    }
    module.section(&types);

    let (imports, outside) = imports(plan, &layout)?;
    module.section(&imports);

    let mut functions = FunctionSection::new();
    for (lib, parsed) in plan.libs.iter().enumerate() {
        for &ty in &parsed.functions {
            functions.function(layout.type_base[lib] + ty);
        }
    }
    module.section(&functions);

    // `main`'s table, defined here, with its size.
    let (_, main_table) = plan.group.main.only_export(ExternalKind::Table)?;
    let main_table = plan
        .group
        .main
        .tables
        .get(main_table as usize)
        .ok_or("`main` exports an imported table")?;
    let mut tables = TableSection::new();
    tables.table(TableType {
        element_type: RefType::FUNCREF,
        table64: false,
        minimum: main_table.initial,
        maximum: main_table.maximum,
        shared: false,
    });
    module.section(&tables);

    module.section(&globals(plan, &layout, &written, &mut maps)?);
    let (export_section, exports) = exports(plan, &layout);
    module.section(&export_section);
    module.section(&elements(plan, &layout, &written, &maps)?);
    module.section(&code);
    module.section(&names(plan, &maps));

    Ok(Linked {
        merged: module.finish(),
        filler: filler(plan)?,
        outside,
        exports,
    })
}

/// `main`'s memory, then the functions of outside instances.
fn imports(plan: &Plan, layout: &Layout) -> Result<(ImportSection, BTreeSet<u32>)> {
    let main = &plan.group.main;
    let (memory_name, _) = main.only_export(ExternalKind::Memory)?;
    let memory = *main.memories.first().ok_or("`main` defines no memory")?;
    let mut memory = RoundtripReencoder
        .memory_type(memory)
        .map_err(|e| format!("{e:?}"))?;
    // An import's limits need only be met; the memory is already larger than its minimum.
    memory.minimum = 0;
    let mut imports = ImportSection::new();
    let mut outside = BTreeSet::from([plan.group.main_instance]);
    imports.import(
        &outside_module(plan.group.main_instance),
        memory_name,
        EntityType::Memory(memory),
    );
    for &(instance, name, (lib, ty)) in &plan.func_imports {
        outside.insert(instance);
        imports.import(
            &outside_module(instance),
            name,
            EntityType::Function(layout.type_base[lib] + ty),
        );
    }
    Ok((imports, outside))
}

/// Copies of `main`'s globals (constant where no code writes them), then each library's.
fn globals(
    plan: &Plan,
    layout: &Layout,
    written: &BTreeSet<u32>,
    maps: &mut [IndexMap],
) -> Result<GlobalSection> {
    let main = &plan.group.main;
    let mut globals = GlobalSection::new();
    fn err<E: std::fmt::Debug>(e: ReencodeError<E>) -> String {
        format!("re-encoding a global: {e:?}")
    }
    for &g in &plan.main_globals {
        let defined = g - main.imported_count(ExternalKind::Global);
        let global = &main.globals[defined as usize];
        let init = RoundtripReencoder
            .const_expr(global.init_expr.clone())
            .map_err(err)?;
        let val_type = RoundtripReencoder
            .val_type(global.ty.content_type)
            .map_err(err)?;
        globals.global(
            GlobalType {
                val_type,
                mutable: written.contains(&layout.global(Global::Main(g))),
                shared: false,
            },
            &init,
        );
    }
    for (lib, map) in maps.iter_mut().enumerate() {
        for global in &plan.libs[lib].globals {
            let ty = map.global_type(global.ty).map_err(err)?;
            let init = map.const_expr(global.init_expr.clone()).map_err(err)?;
            globals.global(ty, &init);
        }
    }
    Ok(globals)
}

/// The library exports the component aliases, as `<library>:<name>`, and the functions the
/// filler puts in `main`'s table, as `slot:<index>`.
fn exports(plan: &Plan, layout: &Layout) -> (ExportSection, HashMap<(usize, String), String>) {
    let mut section = ExportSection::new();
    let mut names = HashMap::new();
    for (lib, name, export) in &plan.exports {
        let as_name = format!("{}:{name}", plan.group.libs[*lib].name);
        match *export {
            Export::Func(f) => section.export(&as_name, ExportKind::Func, layout.func(f)),
            Export::Global(g) => section.export(&as_name, ExportKind::Global, layout.global(g)),
        };
        names.insert((*lib, name.to_string()), as_name);
    }
    for &(slot, f) in &plan.slots {
        section.export(&slot_export(slot), ExportKind::Func, layout.func(f));
    }
    (section, names)
}

fn slot_export(slot: u32) -> String {
    format!("slot:{slot}")
}

/// Every library's segments and `__init`'s, at constant offsets into the merged module's own
/// table, so that wasmtime fills it lazily; then one declaring what `ref.func` takes.
fn elements(
    plan: &Plan,
    layout: &Layout,
    written: &BTreeSet<u32>,
    maps: &[IndexMap],
) -> Result<ElementSection> {
    let mut section = ElementSection::new();
    for (lib, map) in maps.iter().enumerate() {
        for (element, offset) in plan.libs[lib].elements.iter().zip(&plan.offsets[lib]) {
            let ElementItems::Functions(funcs) = &element.items else {
                return Err("a library segment of expressions".into());
            };
            let items = funcs
                .clone()
                .into_iter()
                .map(|f| f.map(|f| map.funcs[f as usize]).map_err(|e| e.to_string()))
                .collect::<Result<Vec<u32>>>()?;
            let offset_expr;
            let mode = match (offset, &element.kind) {
                (Some(offset), _) => {
                    if let Some(g) = offset.from
                        && written.contains(&layout.global(g))
                    {
                        return Err(format!(
                            "a segment of library {} is at a global the code writes",
                            plan.group.libs[lib].name
                        ));
                    }
                    offset_expr = ConstExpr::i32_const(offset.value);
                    ElementMode::Active {
                        table: None,
                        offset: &offset_expr,
                    }
                }
                (None, ElementKind::Passive) => ElementMode::Passive,
                (None, _) => ElementMode::Declared,
            };
            section.segment(ElementSegment {
                mode,
                elements: Elements::Functions(items.into()),
            });
        }
    }
    for (offset, funcs) in &plan.init_segments {
        let items: Vec<u32> = funcs.iter().map(|&f| layout.func(f)).collect();
        section.segment(ElementSegment {
            mode: ElementMode::Active {
                table: None,
                offset: &ConstExpr::i32_const(*offset),
            },
            elements: Elements::Functions(items.into()),
        });
    }
    let declared: BTreeSet<u32> = maps
        .iter()
        .flat_map(|m| m.ref_funcs.iter().copied())
        .collect();
    if !declared.is_empty() {
        section.segment(ElementSegment {
            mode: ElementMode::Declared,
            elements: Elements::Functions(declared.into_iter().collect::<Vec<_>>().into()),
        });
    }
    Ok(section)
}

/// The libraries' function names, so that traps and profiles still name the guest's code. A
/// function takes the name its own library gives it; an import, the first importer's name.
fn names(plan: &Plan, maps: &[IndexMap]) -> NameSection {
    let mut by_index = BTreeMap::new();
    for defined in [true, false] {
        for (lib, parsed) in plan.libs.iter().enumerate() {
            let imported = parsed.imported_count(ExternalKind::Func);
            let mut names: Vec<(u32, &str)> = parsed
                .names
                .iter()
                .map(|(&f, &name)| (f, name))
                .filter(|&(f, _)| (f >= imported) == defined)
                .collect();
            names.sort_unstable();
            for (f, name) in names {
                if let Some(&index) = maps[lib].funcs.get(f as usize) {
                    by_index.entry(index).or_insert(name);
                }
            }
        }
    }
    let mut functions = NameMap::new();
    for (index, name) in by_index {
        functions.append(index, name);
    }
    let mut names = NameSection::new();
    names.module("pycage-guest-libraries");
    names.functions(&functions);
    names
}

/// The module that takes `__init`'s place. It fills the slots of `main`'s table that code
/// outside the libraries calls through (via `main`'s trampolines) with the merged module's
/// functions. Its segment is applied at instantiation, but it is short and holds only
/// imported functions, which wasmtime references without a lookup.
fn filler(plan: &Plan) -> Result<Vec<u8>> {
    let main = &plan.group.main;
    let (table_name, _) = main.only_export(ExternalKind::Table)?;
    let mut types = TypeSection::new();
    let mut imports = ImportSection::new();
    let mut elements = ElementSection::new();
    imports.import(
        FILLER_TABLE,
        table_name,
        EntityType::Table(TableType {
            element_type: RefType::FUNCREF,
            table64: false,
            minimum: 0,
            maximum: None,
            shared: false,
        }),
    );
    let val_types = |types: &[wasmparser::ValType]| {
        types
            .iter()
            .map(|&t| RoundtripReencoder.val_type(t))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| format!("{e:?}"))
    };
    for (i, &(slot, _)) in plan.slots.iter().enumerate() {
        let ty = &main.types[main.func_type(main.trampoline_to(slot)?)? as usize];
        types
            .ty()
            .function(val_types(ty.params())?, val_types(ty.results())?);
        imports.import(
            FILLER_FUNCS,
            &slot_export(slot),
            EntityType::Function(i as u32),
        );
        elements.segment(ElementSegment {
            mode: ElementMode::Active {
                table: None,
                offset: &ConstExpr::i32_const(slot as i32),
            },
            elements: Elements::Functions(vec![i as u32].into()),
        });
    }
    let mut module = Module::new();
    module.section(&types);
    module.section(&imports);
    module.section(&elements);
    Ok(module.finish())
}

/// Re-encodes one library's code and constants into the merged module's index spaces, noting
/// the globals it writes and the functions it takes references to.
struct IndexMap {
    types: u32,
    funcs: Vec<u32>,
    globals: Vec<u32>,
    elements: Vec<u32>,
    /// Functions `ref.func` takes (merged indices).
    ref_funcs: BTreeSet<u32>,
    /// Globals `global.set` writes (merged indices).
    written: BTreeSet<u32>,
}

fn lookup(
    space: &[u32],
    index: u32,
    what: &str,
) -> std::result::Result<u32, ReencodeError<String>> {
    space
        .get(index as usize)
        .copied()
        .ok_or_else(|| ReencodeError::UserError(format!("{what} {index} out of range")))
}

impl Reencode for IndexMap {
    type Error = String;

    fn type_index(&mut self, ty: u32) -> std::result::Result<u32, ReencodeError<String>> {
        Ok(self.types + ty)
    }

    fn function_index(&mut self, f: u32) -> std::result::Result<u32, ReencodeError<String>> {
        lookup(&self.funcs, f, "function")
    }

    fn global_index(&mut self, g: u32) -> std::result::Result<u32, ReencodeError<String>> {
        lookup(&self.globals, g, "global")
    }

    fn element_index(&mut self, e: u32) -> std::result::Result<u32, ReencodeError<String>> {
        lookup(&self.elements, e, "element segment")
    }

    /// A library's only table and memory are `main`'s: the merged module's table and memory.
    fn table_index(&mut self, _: u32) -> std::result::Result<u32, ReencodeError<String>> {
        Ok(0)
    }

    fn memory_index(&mut self, _: u32) -> std::result::Result<u32, ReencodeError<String>> {
        Ok(0)
    }

    fn instruction<'a>(
        &mut self,
        op: Operator<'a>,
    ) -> std::result::Result<Instruction<'a>, ReencodeError<String>> {
        match op {
            Operator::RefFunc { function_index } => {
                let f = self.function_index(function_index)?;
                self.ref_funcs.insert(f);
            }
            Operator::GlobalSet { global_index } => {
                let g = self.global_index(global_index)?;
                self.written.insert(g);
            }
            Operator::MemoryInit { .. } | Operator::DataDrop { .. } => {
                return Err(ReencodeError::UserError(
                    "a library uses passive data, which the merged module does not hold".into(),
                ));
            }
            _ => {}
        }
        wasm_encoder::reencode::utils::instruction(self, op)
    }
}

//! Finding the libraries and resolving, for each of their imports, what it is in the merged
//! module: one of its own functions or globals, or an import from outside.

use std::collections::{BTreeSet, HashMap};

use wasmparser::{ElementItems, ElementKind, ExternalKind, Operator};

use super::Result;
use super::component::{CoreInstance, Item, Top};
use super::module::{CoreModule, import_kind};

/// One library: a module with a `dylink.0` section, instantiated once.
pub struct Lib<'a> {
    pub module: u32,
    pub instance: u32,
    /// The name `__init` imports it under (`libc.so`, `libpython3.14.so`, ...).
    pub name: &'a str,
}

/// The libraries, `main` and `__init`.
pub struct Group<'a> {
    /// In instantiation order.
    pub libs: Vec<Lib<'a>>,
    /// The libraries' modules, in the same order.
    pub lib_modules: Vec<CoreModule<'a>>,
    pub main_instance: u32,
    pub main: CoreModule<'a>,
    pub init_module: u32,
    pub init_instance: u32,
    pub init: CoreModule<'a>,
    /// `__init`'s instantiation arguments: import module name -> instance.
    init_args: HashMap<&'a str, u32>,
}

/// Where an export reached from a library's import comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source<'a> {
    /// An export of a library (its position in [`Group::libs`]).
    Lib(usize, &'a str),
    /// An export of `main`.
    Main(&'a str),
    /// An export of an instance outside the libraries (a core instance index).
    Outside(u32, &'a str),
}

impl<'a> Group<'a> {
    /// Finds the libraries (modules with a `dylink.0` section), `__init` (the one instance
    /// given library instances themselves as arguments) and `main` (`__init`'s `env`).
    pub fn find(top: &Top<'a>) -> Result<Group<'a>> {
        let mut modules = Vec::new();
        for bytes in &top.modules {
            modules.push(Some(CoreModule::parse(bytes)?));
        }
        let is_lib = |m: u32| modules[m as usize].as_ref().is_some_and(|m| m.is_library);
        let mut lib_instances = Vec::new();
        let mut init = None;
        for (i, instance) in top.instances.iter().enumerate() {
            let CoreInstance::Instantiate { module, args } = instance else {
                continue;
            };
            if is_lib(*module) {
                lib_instances.push((*module, i as u32));
            } else if args.iter().any(|&(_, a)| {
                matches!(top.instances[a as usize], CoreInstance::Instantiate { module, .. } if is_lib(module))
            }) && init.replace((*module, i as u32, args)).is_some()
            {
                return Err("more than one instance is given library instances".into());
            }
        }
        let (init_module, init_instance, init_args) =
            init.ok_or("no `__init` instance (one given the library instances)")?;
        let init_args: HashMap<&str, u32> = init_args.iter().copied().collect();
        let main_instance = *init_args
            .get("env")
            .ok_or("`__init` has no `env` argument (`main`)")?;
        let CoreInstance::Instantiate {
            module: main_module,
            ..
        } = top.instances[main_instance as usize]
        else {
            return Err("`main` is not an instantiated module".into());
        };
        let mut libs: Vec<Lib> = Vec::new();
        for (module, instance) in lib_instances {
            let name = init_args
                .iter()
                .find(|&(_, &i)| i == instance)
                .map(|(&name, _)| name)
                .ok_or_else(|| format!("library instance {instance} is not given to `__init`"))?;
            if libs.iter().any(|lib| lib.module == module) {
                return Err(format!("library {name} is instantiated twice"));
            }
            libs.push(Lib {
                module,
                instance,
                name,
            });
        }
        if libs.is_empty() {
            return Err("the component has no libraries".into());
        }
        let mut take = |m: u32| modules[m as usize].take().ok_or("a module is used twice");
        let main = take(main_module)?;
        let init = take(init_module)?;
        let mut lib_modules = Vec::new();
        for lib in &libs {
            let parsed = take(lib.module)?;
            if parsed.has_data || parsed.has_start || parsed.has_tags {
                return Err(format!(
                    "library {} has data, a start function or tags; the snapshot is expected \
                     to hold all data, with nothing left to run",
                    lib.name
                ));
            }
            if !parsed.tables.is_empty() || !parsed.memories.is_empty() {
                return Err(format!("library {} defines a table or a memory", lib.name));
            }
            lib_modules.push(parsed);
        }
        Ok(Group {
            main,
            init,
            libs,
            lib_modules,
            main_instance,
            init_module,
            init_instance,
            init_args,
        })
    }

    pub fn lib_of_instance(&self, instance: u32) -> Option<usize> {
        self.libs.iter().position(|lib| lib.instance == instance)
    }

    /// The instance the merged module takes the place of: the first library's.
    pub fn first_instance(&self) -> u32 {
        self.libs[0].instance
    }

    /// Where export `name` of core instance `instance` comes from, following export bags
    /// and aliases back to the instance that defines it.
    fn resolve(
        &self,
        top: &Top<'a>,
        instance: u32,
        name: &'a str,
        kind: ExternalKind,
    ) -> Result<Source<'a>> {
        if let Some(lib) = self.lib_of_instance(instance) {
            return Ok(Source::Lib(lib, name));
        }
        if instance == self.main_instance {
            return Ok(Source::Main(name));
        }
        match &top.instances[instance as usize] {
            CoreInstance::Instantiate { .. } => Ok(Source::Outside(instance, name)),
            CoreInstance::Exports(exports) => {
                let &(_, _, index) = exports
                    .iter()
                    .find(|&&(n, k, _)| n == name && super::same_kind(k, kind))
                    .ok_or_else(|| format!("instance {instance} has no export `{name}`"))?;
                match top.items(kind).get(index as usize) {
                    Some(&Item::Alias { instance, name }) => {
                        self.resolve(top, instance, name, kind)
                    }
                    // A canonical function: reachable through the bag that holds it.
                    Some(Item::Canon) => Ok(Source::Outside(instance, name)),
                    None => Err(format!("{kind:?} {index} of the component is undefined")),
                }
            }
        }
    }
}

/// A function of the merged module, before the index spaces are laid out.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Func {
    /// The n-th function the merged module imports.
    Import(usize),
    /// Library `lib`'s defined function `index` (counted from its first defined function).
    Defined(usize, u32),
}

/// A global of the merged module, before the index spaces are laid out.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Global {
    /// `main`'s defined global, copied into the merged module.
    Main(u32),
    /// Library `lib`'s defined global `index`.
    Defined(usize, u32),
}

/// The constant offset of a library's segment, and the global it was read from (which must
/// then stay constant in the merged module).
#[derive(Clone, Copy)]
pub struct Offset {
    pub value: i32,
    pub from: Option<Global>,
}

/// An export of a library the component aliases.
pub enum Export {
    Func(Func),
    Global(Global),
}

/// What the merged module is made of, every index resolved.
pub struct Plan<'g, 'a> {
    pub group: &'g Group<'a>,
    pub libs: &'g [CoreModule<'a>],
    /// Each library's function index space (imports, then defined functions).
    pub funcs: Vec<Vec<Func>>,
    /// Each library's global index space.
    pub globals: Vec<Vec<Global>>,
    /// The functions the merged module imports: (instance, export name, (library, type)).
    pub func_imports: Vec<(u32, &'a str, (usize, u32))>,
    /// `main`'s globals the merged module holds copies of, in order.
    pub main_globals: Vec<u32>,
    /// The library exports the component aliases: (library, name, what it is).
    pub exports: Vec<(usize, &'a str, Export)>,
    /// Each library segment's offset (`None` for a passive or declared segment).
    pub offsets: Vec<Vec<Option<Offset>>>,
    /// `__init`'s segments, with what each slot holds.
    pub init_segments: Vec<(i32, Vec<Func>)>,
    /// The slots of `main`'s table code outside the libraries calls through, with what each
    /// holds.
    pub slots: Vec<(u32, Func)>,
}

/// Resolves the libraries' imports.
pub struct Linker<'g, 'a> {
    top: &'g Top<'a>,
    group: &'g Group<'a>,
    libs: &'g [CoreModule<'a>],
    func_imports: Vec<(u32, &'a str, (usize, u32))>,
    func_import_index: HashMap<(u32, &'a str), usize>,
    /// (library, imported function index) -> what it is.
    func_cache: HashMap<(usize, u32), Func>,
    main_globals: Vec<u32>,
}

impl<'g, 'a> Linker<'g, 'a> {
    pub fn new(top: &'g Top<'a>, group: &'g Group<'a>) -> Linker<'g, 'a> {
        Linker {
            top,
            group,
            libs: &group.lib_modules,
            func_imports: Vec::new(),
            func_import_index: HashMap::new(),
            func_cache: HashMap::new(),
            main_globals: Vec::new(),
        }
    }

    pub fn plan(mut self) -> Result<Plan<'g, 'a>> {
        let mut funcs = Vec::new();
        let mut globals = Vec::new();
        for lib in 0..self.libs.len() {
            self.check_shared(lib)?;
            let n = self.libs[lib].imported_count(ExternalKind::Func)
                + self.libs[lib].functions.len() as u32;
            funcs.push(
                (0..n)
                    .map(|f| self.lib_func(lib, f))
                    .collect::<Result<Vec<_>>>()?,
            );
            let n = self.libs[lib].imported_count(ExternalKind::Global)
                + self.libs[lib].globals.len() as u32;
            globals.push(
                (0..n)
                    .map(|g| self.lib_global(lib, g))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let exports = self.aliased_exports()?;
        let mut offsets = Vec::new();
        for lib in 0..self.libs.len() {
            let mut of_lib = Vec::new();
            for e in 0..self.libs[lib].elements.len() {
                of_lib.push(self.segment_offset(lib, e)?);
            }
            offsets.push(of_lib);
        }
        let init_segments = self.init_segments()?;
        let mut slots = Vec::new();
        for slot in self.outside_slots()? {
            let target = self.slot_target(slot)?;
            slots.push((slot, self.source_func(target, None)?));
        }
        Ok(Plan {
            group: self.group,
            libs: self.libs,
            funcs,
            globals,
            func_imports: self.func_imports,
            main_globals: self.main_globals,
            exports,
            offsets,
            init_segments,
            slots,
        })
    }

    /// Where library `lib`'s import `import` comes from.
    fn import_source(&self, lib: usize, import: &wasmparser::Import<'a>) -> Result<Source<'a>> {
        let Lib { instance, name, .. } = self.group.libs[lib];
        let CoreInstance::Instantiate { args, .. } = &self.top.instances[instance as usize] else {
            return Err(format!("library {name} is not an instantiated module"));
        };
        let &(_, arg) = args
            .iter()
            .find(|&&(n, _)| n == import.module)
            .ok_or_else(|| {
                format!(
                    "library {name} imports from `{}`, which it is not given",
                    import.module
                )
            })?;
        self.group
            .resolve(self.top, arg, import.name, import_kind(import.ty))
    }

    /// Checks that library `lib`'s table and memory are `main`'s.
    fn check_shared(&self, lib: usize) -> Result<()> {
        for import in &self.libs[lib].imports {
            let kind = import_kind(import.ty);
            if !matches!(kind, ExternalKind::Table | ExternalKind::Memory) {
                continue;
            }
            match self.import_source(lib, import)? {
                Source::Main(name) if self.group.main.export(name, kind).is_some() => {}
                other => {
                    return Err(format!(
                        "library {} imports {kind:?} `{}` from {other:?}, not from `main`",
                        self.group.libs[lib].name, import.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The index of library `lib`'s export `name`, which must be of kind `kind`.
    fn lib_export(&self, lib: usize, name: &str, kind: ExternalKind) -> Result<u32> {
        self.libs[lib].export(name, kind).ok_or_else(|| {
            format!(
                "library {} exports no {kind:?} `{name}`",
                self.group.libs[lib].name
            )
        })
    }

    /// What library `lib`'s function `f` is in the merged module.
    fn lib_func(&mut self, lib: usize, f: u32) -> Result<Func> {
        let imported = self.libs[lib].imported_count(ExternalKind::Func);
        if f >= imported {
            return Ok(Func::Defined(lib, f - imported));
        }
        if let Some(&func) = self.func_cache.get(&(lib, f)) {
            return Ok(func);
        }
        let import = *self.libs[lib]
            .imported(ExternalKind::Func)
            .nth(f as usize)
            .ok_or("an imported function out of range")?;
        let source = self.import_source(lib, &import)?;
        let ty = self.libs[lib].func_type(f)?;
        let func = self.source_func(source, Some((lib, ty)))?;
        self.func_cache.insert((lib, f), func);
        Ok(func)
    }

    /// What the function `source` names is in the merged module. `ty` is the importing
    /// library's type for it, which the merged module needs if it must import it.
    fn source_func(&mut self, source: Source<'a>, ty: Option<(usize, u32)>) -> Result<Func> {
        match source {
            Source::Lib(lib, name) => {
                let f = self.lib_export(lib, name, ExternalKind::Func)?;
                self.lib_func(lib, f)
            }
            Source::Main(name) => {
                let main = &self.group.main;
                let f = main
                    .export(name, ExternalKind::Func)
                    .ok_or_else(|| format!("`main` exports no function `{name}`"))?;
                match main.trampoline_slot(f) {
                    Some(slot) => {
                        let target = self.slot_target(slot)?;
                        self.source_func(target, ty)
                    }
                    // Not a trampoline: `main`'s own function.
                    None => self.import_func(self.group.main_instance, name, ty),
                }
            }
            Source::Outside(instance, name) => self.import_func(instance, name, ty),
        }
    }

    fn import_func(
        &mut self,
        instance: u32,
        name: &'a str,
        ty: Option<(usize, u32)>,
    ) -> Result<Func> {
        if let Some(&n) = self.func_import_index.get(&(instance, name)) {
            return Ok(Func::Import(n));
        }
        if instance >= self.group.first_instance() {
            return Err(format!(
                "a library imports `{name}` from instance {instance}, which is defined after \
                 the first library: the merged module, instantiated in its place, cannot take it"
            ));
        }
        let ty = ty.ok_or_else(|| {
            format!("`{name}` of instance {instance} is reached only through `main`'s table")
        })?;
        self.func_imports.push((instance, name, ty));
        self.func_import_index
            .insert((instance, name), self.func_imports.len() - 1);
        Ok(Func::Import(self.func_imports.len() - 1))
    }

    /// Where the function `__init` puts in table slot `slot` comes from.
    fn slot_target(&self, slot: u32) -> Result<Source<'a>> {
        let init = &self.group.init;
        for element in &init.elements {
            let (ElementKind::Active { offset_expr, .. }, ElementItems::Functions(funcs)) =
                (&element.kind, &element.items)
            else {
                continue;
            };
            let Some(i) = super::const_i32(offset_expr).and_then(|o| slot.checked_sub(o as u32))
            else {
                continue;
            };
            let Some(f) = funcs.clone().into_iter().nth(i as usize) else {
                continue;
            };
            let f = f.map_err(|e| e.to_string())?;
            let import = init
                .imported(ExternalKind::Func)
                .nth(f as usize)
                .ok_or_else(|| format!("`__init` puts its own function {f} in slot {slot}"))?;
            let instance = *self
                .group
                .init_args
                .get(import.module)
                .ok_or_else(|| format!("`__init` is not given `{}`", import.module))?;
            return self
                .group
                .resolve(self.top, instance, import.name, ExternalKind::Func);
        }
        Err(format!("no `__init` segment fills table slot {slot}"))
    }

    /// What library `lib`'s global `g` is in the merged module.
    fn lib_global(&mut self, lib: usize, g: u32) -> Result<Global> {
        let imported = self.libs[lib].imported_count(ExternalKind::Global);
        if g >= imported {
            return Ok(Global::Defined(lib, g - imported));
        }
        let import = *self.libs[lib]
            .imported(ExternalKind::Global)
            .nth(g as usize)
            .ok_or("an imported global out of range")?;
        match self.import_source(lib, &import)? {
            Source::Lib(other, name) => {
                let g = self.lib_export(other, name, ExternalKind::Global)?;
                self.lib_global(other, g)
            }
            Source::Main(name) => {
                let g = self
                    .group
                    .main
                    .export(name, ExternalKind::Global)
                    .ok_or_else(|| format!("`main` exports no global `{name}`"))?;
                if g < self.group.main.imported_count(ExternalKind::Global) {
                    return Err(format!("`main` imports the global `{name}` it exports"));
                }
                if !self.main_globals.contains(&g) {
                    self.main_globals.push(g);
                }
                Ok(Global::Main(g))
            }
            Source::Outside(instance, name) => Err(format!(
                "library {} imports the global `{name}` from instance {instance}, outside \
                 the libraries and `main`",
                self.group.libs[lib].name
            )),
        }
    }

    /// The exports of libraries the component aliases, each once, in a stable order.
    fn aliased_exports(&mut self) -> Result<Vec<(usize, &'a str, Export)>> {
        let mut wanted = BTreeSet::new();
        for item in self.top.funcs.iter().chain(&self.top.globals) {
            if let Item::Alias { instance, name } = *item
                && let Some(lib) = self.group.lib_of_instance(instance)
            {
                wanted.insert((lib, name));
            }
        }
        let mut exports = Vec::new();
        for (lib, name) in wanted {
            let export = if let Some(f) = self.libs[lib].export(name, ExternalKind::Func) {
                Export::Func(self.lib_func(lib, f)?)
            } else if let Some(g) = self.libs[lib].export(name, ExternalKind::Global) {
                Export::Global(self.lib_global(lib, g)?)
            } else {
                return Err(format!(
                    "the component aliases `{name}` of library {}, which exports no function \
                     or global of that name",
                    self.group.libs[lib].name
                ));
            };
            exports.push((lib, name, export));
        }
        Ok(exports)
    }

    /// The constant offset of library `lib`'s segment `e`: an `i32.const`, or a global the
    /// snapshot fixed (`__table_base`).
    fn segment_offset(&mut self, lib: usize, e: usize) -> Result<Option<Offset>> {
        let element = &self.libs[lib].elements[e];
        let ElementKind::Active {
            table_index,
            offset_expr,
        } = &element.kind
        else {
            return Ok(None);
        };
        if table_index.unwrap_or(0) != 0 {
            return Err("a library segment for a table other than the shared one".into());
        }
        if !matches!(element.items, ElementItems::Functions(_)) {
            return Err("a library segment of expressions rather than functions".into());
        }
        if let Some(value) = super::const_i32(offset_expr) {
            return Ok(Some(Offset { value, from: None }));
        }
        let mut ops = offset_expr.get_operators_reader();
        let (Ok(Operator::GlobalGet { global_index }), Ok(Operator::End)) =
            (ops.read(), ops.read())
        else {
            return Err("a library segment at an offset neither constant nor a global".into());
        };
        let global = self.lib_global(lib, global_index)?;
        let value = match global {
            Global::Main(g) => self.group.main.global_const(g),
            Global::Defined(other, g) => self.libs[other]
                .global_const(g + self.libs[other].imported_count(ExternalKind::Global)),
        };
        let value = value.ok_or_else(|| {
            format!(
                "a segment of library {} is at a global without a constant value",
                self.group.libs[lib].name
            )
        })?;
        Ok(Some(Offset {
            value,
            from: Some(global),
        }))
    }

    /// `__init`'s segments: the merged table holds every slot `main`'s table held.
    fn init_segments(&mut self) -> Result<Vec<(i32, Vec<Func>)>> {
        let mut segments = Vec::new();
        for element in &self.group.init.elements {
            let (ElementKind::Active { offset_expr, .. }, ElementItems::Functions(funcs)) =
                (&element.kind, &element.items)
            else {
                return Err("an `__init` segment that is not active and of functions".into());
            };
            let offset =
                super::const_i32(offset_expr).ok_or("an `__init` segment at a computed offset")?;
            let mut items = Vec::new();
            for i in 0..funcs.count() {
                let target = self.slot_target(offset as u32 + i)?;
                items.push(self.source_func(target, None)?);
            }
            if !items.is_empty() {
                segments.push((offset, items));
            }
        }
        Ok(segments)
    }

    /// The slots of `main`'s table that code outside the libraries calls through: those of
    /// `main`'s trampolines that a canonical definition names, or that an instance other than
    /// a library or `__init` is given. Fails if such an instance is given `main`'s table or
    /// `main` itself, which would let it call through any slot, or one of the `main` globals
    /// the merged module keeps its own copy of (the stack pointer, say), which the two would
    /// then no longer share.
    fn outside_slots(&self) -> Result<BTreeSet<u32>> {
        let group = self.group;
        let mut used = self.top.canon_uses.clone();
        for instance in &self.top.instances {
            let CoreInstance::Instantiate { module, args } = instance else {
                continue;
            };
            if group.libs.iter().any(|lib| lib.module == *module) || *module == group.init_module {
                continue;
            }
            for &(_, arg) in args {
                if arg == group.main_instance {
                    return Err("an instance outside the libraries is given `main` whole".into());
                }
                let CoreInstance::Exports(exports) = &self.top.instances[arg as usize] else {
                    continue;
                };
                for &(_, kind, index) in exports {
                    match kind {
                        ExternalKind::Func | ExternalKind::FuncExact => used.push(index),
                        ExternalKind::Table => {
                            if let Some(&Item::Alias { instance, .. }) =
                                self.top.tables.get(index as usize)
                                && instance == group.main_instance
                            {
                                return Err(
                                    "an instance outside the libraries is given `main`'s table"
                                        .into(),
                                );
                            }
                        }
                        ExternalKind::Global => {
                            if let Some(&Item::Alias { instance, name }) =
                                self.top.globals.get(index as usize)
                                && instance == group.main_instance
                                && let Some(g) = group.main.export(name, ExternalKind::Global)
                                && self.main_globals.contains(&g)
                            {
                                return Err(format!(
                                    "an instance outside the libraries is given `main`'s global \
                                     `{name}`, which the merged module holds a copy of"
                                ));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let mut slots = BTreeSet::new();
        for f in used {
            if let Some(&Item::Alias { instance, name }) = self.top.funcs.get(f as usize)
                && instance == group.main_instance
                && let Some(f) = group.main.export(name, ExternalKind::Func)
                && let Some(slot) = group.main.trampoline_slot(f)
            {
                slots.insert(slot);
            }
        }
        Ok(slots)
    }
}

//! What the linker reads of one core module.

use std::collections::HashMap;

use wasmparser::{ExternalKind, Name, Operator, Parser, Payload, TypeRef};

use super::Result;

/// The parts of one core module the linker reads.
pub struct CoreModule<'a> {
    pub types: Vec<wasmparser::FuncType>,
    /// The type section as it is, re-encoded into the merged module.
    pub type_section: Option<wasmparser::TypeSectionReader<'a>>,
    pub imports: Vec<wasmparser::Import<'a>>,
    /// The type index of each defined function.
    pub functions: Vec<u32>,
    pub tables: Vec<wasmparser::TableType>,
    pub memories: Vec<wasmparser::MemoryType>,
    pub globals: Vec<wasmparser::Global<'a>>,
    pub exports: HashMap<&'a str, (ExternalKind, u32)>,
    pub elements: Vec<wasmparser::Element<'a>>,
    pub bodies: Vec<wasmparser::FunctionBody<'a>>,
    /// Function names, from the name section.
    pub names: HashMap<u32, &'a str>,
    /// Whether it has data, a start function or tags (a library must have none).
    pub has_data: bool,
    pub has_start: bool,
    pub has_tags: bool,
    pub is_library: bool,
}

impl<'a> CoreModule<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<CoreModule<'a>> {
        let mut m = CoreModule {
            types: Vec::new(),
            type_section: None,
            imports: Vec::new(),
            functions: Vec::new(),
            tables: Vec::new(),
            memories: Vec::new(),
            globals: Vec::new(),
            exports: HashMap::new(),
            elements: Vec::new(),
            bodies: Vec::new(),
            names: HashMap::new(),
            has_data: false,
            has_start: false,
            has_tags: false,
            is_library: false,
        };
        let err = |e: wasmparser::BinaryReaderError| format!("parsing a core module: {e}");
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(err)? {
                Payload::TypeSection(reader) => {
                    for group in reader.clone() {
                        for ty in group.map_err(err)?.into_types() {
                            match ty.composite_type.inner {
                                wasmparser::CompositeInnerType::Func(f) => m.types.push(f),
                                _ => return Err("a core module defines a non-function type".into()),
                            }
                        }
                    }
                    m.type_section = Some(reader);
                }
                Payload::ImportSection(reader) => {
                    for import in reader.into_imports() {
                        m.imports.push(import.map_err(err)?);
                    }
                }
                Payload::FunctionSection(reader) => {
                    for ty in reader {
                        m.functions.push(ty.map_err(err)?);
                    }
                }
                Payload::TableSection(reader) => {
                    for table in reader {
                        m.tables.push(table.map_err(err)?.ty);
                    }
                }
                Payload::MemorySection(reader) => {
                    for memory in reader {
                        m.memories.push(memory.map_err(err)?);
                    }
                }
                Payload::GlobalSection(reader) => {
                    for global in reader {
                        m.globals.push(global.map_err(err)?);
                    }
                }
                Payload::ExportSection(reader) => {
                    for export in reader {
                        let export = export.map_err(err)?;
                        m.exports.insert(export.name, (export.kind, export.index));
                    }
                }
                Payload::ElementSection(reader) => {
                    for element in reader {
                        m.elements.push(element.map_err(err)?);
                    }
                }
                Payload::DataSection(reader) => m.has_data |= reader.count() > 0,
                Payload::StartSection { .. } => m.has_start = true,
                Payload::TagSection(_) => m.has_tags = true,
                Payload::CodeSectionEntry(body) => m.bodies.push(body),
                Payload::CustomSection(c) if c.name() == "dylink.0" => m.is_library = true,
                Payload::CustomSection(c) => {
                    if let wasmparser::KnownCustom::Name(reader) = c.as_known() {
                        for name in reader {
                            if let Ok(Name::Function(map)) = name {
                                for naming in map.into_iter().flatten() {
                                    m.names.insert(naming.index, naming.name);
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(m)
    }

    /// The imports of one kind, in index order.
    pub fn imported(&self, kind: ExternalKind) -> impl Iterator<Item = &wasmparser::Import<'a>> {
        self.imports
            .iter()
            .filter(move |i| super::same_kind(import_kind(i.ty), kind))
    }

    pub fn imported_count(&self, kind: ExternalKind) -> u32 {
        self.imported(kind).count() as u32
    }

    /// Function `f`'s type index, whether imported or defined.
    pub fn func_type(&self, f: u32) -> Result<u32> {
        let imported = self.imported_count(ExternalKind::Func);
        if f < imported {
            match self
                .imported(ExternalKind::Func)
                .nth(f as usize)
                .map(|i| i.ty)
            {
                Some(TypeRef::Func(t) | TypeRef::FuncExact(t)) => Ok(t),
                _ => Err(format!("function {f} is not an imported function")),
            }
        } else {
            self.functions
                .get((f - imported) as usize)
                .copied()
                .ok_or_else(|| format!("function {f} is undefined"))
        }
    }

    /// The export named `name`, if it is of kind `kind`.
    pub fn export(&self, name: &str, kind: ExternalKind) -> Option<u32> {
        match self.exports.get(name) {
            Some(&(k, index)) if super::same_kind(k, kind) => Some(index),
            _ => None,
        }
    }

    /// The name of the one export of kind `kind`.
    pub fn only_export(&self, kind: ExternalKind) -> Result<(&'a str, u32)> {
        let mut found = self.exports.iter().filter(|(_, (k, _))| *k == kind);
        match (found.next(), found.next()) {
            (Some((&name, &(_, index))), None) => Ok((name, index)),
            _ => Err(format!("`main` does not export exactly one {kind:?}")),
        }
    }

    /// Defined global `g`'s initial value, if its initializer is an `i32` constant.
    pub fn global_const(&self, g: u32) -> Option<i32> {
        let defined = g.checked_sub(self.imported_count(ExternalKind::Global))?;
        super::const_i32(&self.globals.get(defined as usize)?.init_expr)
    }

    /// The table slot function `f` calls, if it is a trampoline: a function that passes its
    /// parameters on, in order, to the function at a constant slot of table 0.
    pub fn trampoline_slot(&self, f: u32) -> Option<u32> {
        let defined = f.checked_sub(self.imported_count(ExternalKind::Func))?;
        let body = self.bodies.get(defined as usize)?;
        let params = self
            .types
            .get(self.func_type(f).ok()? as usize)?
            .params()
            .len() as u32;
        let mut ops = body.get_operators_reader().ok()?;
        for i in 0..params {
            match ops.read().ok()? {
                Operator::LocalGet { local_index } if local_index == i => {}
                _ => return None,
            }
        }
        let Operator::I32Const { value: slot } = ops.read().ok()? else {
            return None;
        };
        match (ops.read().ok()?, ops.read().ok()?, ops.eof()) {
            (Operator::CallIndirect { table_index: 0, .. }, Operator::End, true) => {
                Some(slot as u32)
            }
            _ => None,
        }
    }

    /// The defined function that is a trampoline to `slot`.
    pub fn trampoline_to(&self, slot: u32) -> Result<u32> {
        let first = self.imported_count(ExternalKind::Func);
        (first..first + self.functions.len() as u32)
            .find(|&f| self.trampoline_slot(f) == Some(slot))
            .ok_or_else(|| format!("no trampoline of `main` calls slot {slot}"))
    }
}

/// The index space an import adds to.
pub fn import_kind(ty: TypeRef) -> ExternalKind {
    match ty {
        TypeRef::Func(_) | TypeRef::FuncExact(_) => ExternalKind::Func,
        TypeRef::Table(_) => ExternalKind::Table,
        TypeRef::Memory(_) => ExternalKind::Memory,
        TypeRef::Global(_) => ExternalKind::Global,
        TypeRef::Tag(_) => ExternalKind::Tag,
    }
}

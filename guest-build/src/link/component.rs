//! The component's top level: reading its index spaces, and writing it back with the
//! libraries linked.

use std::ops::Range;

use wasm_encoder::reencode::{ReencodeComponent, RoundtripReencoder, component_utils};
use wasm_encoder::{
    Alias, ComponentAliasSection, ExportKind, InstanceSection, ModuleArg, RawSection,
};
use wasmparser::{
    BinaryReader, CanonicalFunction, CanonicalOption, Chunk, ComponentAlias, ExternalKind,
    Instance, Parser, Payload,
};

use super::Result;
use super::emit::Linked;
use super::merge::Group;

/// What a core item (function, table, memory, global) of the component is.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    /// An export of a core instance.
    Alias { instance: u32, name: &'a str },
    /// A canonical function (a lowered import, a resource intrinsic, ...).
    Canon,
}

/// One core instance of the component.
pub enum CoreInstance<'a> {
    Instantiate {
        module: u32,
        args: Vec<(&'a str, u32)>,
    },
    Exports(Vec<(&'a str, ExternalKind, u32)>),
}

/// The component's top-level sections and core index spaces. Nested components are skipped:
/// they cannot name the top level's core items.
pub struct Top<'a> {
    bytes: &'a [u8],
    /// (section id, content range), in order.
    sections: Vec<(u8, Range<usize>)>,
    pub modules: Vec<&'a [u8]>,
    pub instances: Vec<CoreInstance<'a>>,
    pub funcs: Vec<Item<'a>>,
    pub tables: Vec<Item<'a>>,
    pub memories: Vec<Item<'a>>,
    pub globals: Vec<Item<'a>>,
    /// Core functions named by canonical definitions: lifted functions, and `realloc`,
    /// `post-return` and callback options.
    pub canon_uses: Vec<u32>,
}

impl<'a> Top<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Top<'a>> {
        let mut top = Top {
            bytes,
            sections: Vec::new(),
            modules: Vec::new(),
            instances: Vec::new(),
            funcs: Vec::new(),
            tables: Vec::new(),
            memories: Vec::new(),
            globals: Vec::new(),
            canon_uses: Vec::new(),
        };
        let err = |e: wasmparser::BinaryReaderError| format!("parsing the component: {e}");
        let mut parser = Parser::new(0);
        let mut at = 0;
        loop {
            let payload = match parser.parse(&bytes[at..], true).map_err(err)? {
                Chunk::Parsed { consumed, payload } => {
                    at += consumed;
                    payload
                }
                Chunk::NeedMoreData(_) => return Err("the component is truncated".into()),
            };
            if let Some(section) = payload.as_section() {
                top.sections.push(section);
            }
            match payload {
                // The parent parser resumes after a nested module or component whose bytes
                // it is not fed.
                Payload::ModuleSection {
                    unchecked_range, ..
                } => {
                    top.modules.push(&bytes[unchecked_range.clone()]);
                    at += unchecked_range.len();
                }
                Payload::ComponentSection {
                    unchecked_range, ..
                } => at += unchecked_range.len(),
                Payload::InstanceSection(reader) => {
                    for instance in reader {
                        top.instances.push(match instance.map_err(err)? {
                            Instance::Instantiate { module_index, args } => {
                                CoreInstance::Instantiate {
                                    module: module_index,
                                    args: args.iter().map(|a| (a.name, a.index)).collect(),
                                }
                            }
                            Instance::FromExports(exports) => CoreInstance::Exports(
                                exports.iter().map(|e| (e.name, e.kind, e.index)).collect(),
                            ),
                        });
                    }
                }
                Payload::ComponentAliasSection(reader) => {
                    for alias in reader {
                        if let ComponentAlias::CoreInstanceExport {
                            kind,
                            instance_index,
                            name,
                        } = alias.map_err(err)?
                        {
                            let item = Item::Alias {
                                instance: instance_index,
                                name,
                            };
                            match kind {
                                ExternalKind::Func | ExternalKind::FuncExact => {
                                    top.funcs.push(item)
                                }
                                ExternalKind::Table => top.tables.push(item),
                                ExternalKind::Memory => top.memories.push(item),
                                ExternalKind::Global => top.globals.push(item),
                                ExternalKind::Tag => {}
                            }
                        }
                    }
                }
                Payload::ComponentCanonicalSection(reader) => {
                    for canon in reader {
                        top.canonical(canon.map_err(err)?);
                    }
                }
                Payload::End(_) => return Ok(top),
                _ => {}
            }
        }
    }

    fn canonical(&mut self, canon: CanonicalFunction) {
        let options: &[CanonicalOption] = match &canon {
            CanonicalFunction::Lift {
                core_func_index,
                options,
                ..
            } => {
                self.canon_uses.push(*core_func_index);
                options
            }
            CanonicalFunction::Lower { options, .. } => options,
            _ => &[],
        };
        for option in options {
            if let CanonicalOption::Realloc(f)
            | CanonicalOption::PostReturn(f)
            | CanonicalOption::Callback(f) = option
            {
                self.canon_uses.push(*f);
            }
        }
        // Every canonical definition but `lift` defines a core function.
        if !matches!(canon, CanonicalFunction::Lift { .. }) {
            self.funcs.push(Item::Canon);
        }
    }

    /// The items of one core index space (tags are not tracked).
    pub fn items(&self, kind: ExternalKind) -> &[Item<'a>] {
        match kind {
            ExternalKind::Func | ExternalKind::FuncExact => &self.funcs,
            ExternalKind::Table => &self.tables,
            ExternalKind::Memory => &self.memories,
            ExternalKind::Global => &self.globals,
            ExternalKind::Tag => &[],
        }
    }
}

/// The component with the merged module in the first library's place, the filler in
/// `__init`'s, and every alias of a library's export pointed at the merged instance.
pub fn rewrite(top: &Top<'_>, group: &Group<'_>, linked: &Linked) -> Result<Vec<u8>> {
    /// What stands in for a library that is now part of the merged module.
    const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0";
    const MODULE_SECTION: u8 = 1;
    const INSTANCE_SECTION: u8 = 2;
    const ALIAS_SECTION: u8 = 6;
    let merged_instance = group.first_instance();
    let mut component = wasm_encoder::Component::new();
    let mut module_index = 0u32;
    let mut instance_index = 0u32;
    let err = |e: wasmparser::BinaryReaderError| format!("rewriting the component: {e}");
    for (id, range) in &top.sections {
        let data = &top.bytes[range.clone()];
        match *id {
            MODULE_SECTION => {
                let m = module_index;
                module_index += 1;
                let bytes: &[u8] = if m == group.libs[0].module {
                    &linked.merged
                } else if group.libs.iter().any(|lib| lib.module == m) {
                    EMPTY_MODULE
                } else if m == group.init_module {
                    &linked.filler
                } else {
                    data
                };
                component.section(&RawSection {
                    id: MODULE_SECTION,
                    data: bytes,
                });
            }
            INSTANCE_SECTION => {
                let reader =
                    wasmparser::InstanceSectionReader::new(BinaryReader::new(data, range.start))
                        .map_err(err)?;
                let mut section = InstanceSection::new();
                for instance in reader {
                    let instance = instance.map_err(err)?;
                    let i = instance_index;
                    instance_index += 1;
                    if i == merged_instance {
                        let args: Vec<(String, u32)> = linked
                            .outside
                            .iter()
                            .map(|&o| (super::emit::outside_module(o), o))
                            .collect();
                        section.instantiate(
                            group.libs[0].module,
                            args.iter()
                                .map(|(name, o)| (name.as_str(), ModuleArg::Instance(*o))),
                        );
                    } else if group.lib_of_instance(i).is_some() {
                        section.export_items(Vec::<(&str, ExportKind, u32)>::new());
                    } else if i == group.init_instance {
                        section.instantiate(
                            group.init_module,
                            [
                                (
                                    super::emit::FILLER_TABLE,
                                    ModuleArg::Instance(group.main_instance),
                                ),
                                (
                                    super::emit::FILLER_FUNCS,
                                    ModuleArg::Instance(merged_instance),
                                ),
                            ],
                        );
                    } else {
                        RoundtripReencoder
                            .parse_instance(&mut section, instance)
                            .map_err(|e| format!("{e:?}"))?;
                    }
                }
                component.section(&section);
            }
            ALIAS_SECTION => {
                let reader = wasmparser::ComponentAliasSectionReader::new(BinaryReader::new(
                    data,
                    range.start,
                ))
                .map_err(err)?;
                let mut section = ComponentAliasSection::new();
                for alias in reader {
                    match alias.map_err(err)? {
                        ComponentAlias::CoreInstanceExport {
                            kind,
                            instance_index,
                            name,
                        } if group.lib_of_instance(instance_index).is_some() => {
                            let lib = group.lib_of_instance(instance_index).unwrap_or_default();
                            let as_name =
                                linked
                                    .exports
                                    .get(&(lib, name.to_string()))
                                    .ok_or_else(|| {
                                        format!("the merged module does not export `{name}`")
                                    })?;
                            section.alias(Alias::CoreInstanceExport {
                                instance: merged_instance,
                                kind: kind.into(),
                                name: as_name,
                            });
                        }
                        alias => {
                            section.alias(
                                component_utils::component_alias(&mut RoundtripReencoder, alias)
                                    .map_err(|e| format!("{e:?}"))?,
                            );
                        }
                    }
                }
                component.section(&section);
            }
            id => {
                component.section(&RawSection { id, data });
            }
        }
    }
    Ok(component.finish())
}

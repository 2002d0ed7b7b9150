//! [`ToolPolicy`]: which registered tools a run exposes, resolved once into [`ExposedTools`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use pycage_tools::{Tool, ToolRegistry};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which tools the guest may call. Deny by default: the empty policy exposes nothing.
///
/// * `namespace` alone exposes every tool of that namespace;
/// * `allow` alone exposes exactly the listed tools, each a bare `name` (which must be unique
///   across namespaces) or a qualified `namespace.name`;
/// * both pin the namespace and narrow it to the listed tools, which must lie inside it.
///
/// ```
/// let policy = pycage::ToolPolicy::new().namespace("math").allow("add");
/// let exposed = policy.resolve(&pycage_tools::ToolRegistry::with_builtins())?;
/// assert_eq!(exposed.qualified_names(), ["math.add"]);
/// # Ok::<(), pycage::PolicyError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolPolicy {
    /// The pinned namespace, if any.
    pub namespace: Option<String>,
    /// The allowlist entries; empty means "the whole namespace" when one is pinned.
    pub allow: Vec<String>,
    /// Exposed tools whose calls wait for a person's approval (entries as in `allow`): a run
    /// that keeps a journal comes back suspended at such a call; one that does not gets the
    /// call denied.
    pub approve: Vec<String>,
}

impl ToolPolicy {
    /// The empty policy: no tool is exposed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pins the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Adds an allowlist entry (bare `name` or `namespace.name`).
    pub fn allow(mut self, entry: impl Into<String>) -> Self {
        self.allow.push(entry.into());
        self
    }

    /// Adds a tool whose calls need a person's approval (bare `name` or `namespace.name`; it
    /// must be exposed).
    pub fn approve(mut self, entry: impl Into<String>) -> Self {
        self.approve.push(entry.into());
        self
    }

    /// Resolves the policy against a registry.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] when the namespace has no tools, an entry names no tool, a bare entry is
    /// ambiguous, or an entry lies outside the pinned namespace. Typos fail loudly here rather
    /// than silently exposing nothing.
    pub fn resolve(&self, registry: &ToolRegistry) -> Result<ExposedTools, PolicyError> {
        let mut chosen: BTreeMap<String, Arc<dyn Tool>> = BTreeMap::new();
        if let Some(ns) = &self.namespace
            && !registry.iter().any(|t| t.namespace() == ns)
        {
            return Err(PolicyError::EmptyNamespace(ns.clone()));
        }
        if self.allow.is_empty()
            && let Some(ns) = &self.namespace
        {
            for tool in registry.iter().filter(|t| t.namespace() == ns) {
                chosen.insert(qualified(tool.as_ref()), tool.clone());
            }
        }
        for entry in &self.allow {
            let tool = self.resolve_entry(registry, entry)?;
            chosen.insert(qualified(tool.as_ref()), tool);
        }
        let mut approve = BTreeSet::new();
        for entry in &self.approve {
            let name = qualified(self.resolve_entry(registry, entry)?.as_ref());
            if !chosen.contains_key(&name) {
                return Err(PolicyError::ApproveNotExposed {
                    entry: entry.trim().to_owned(),
                });
            }
            approve.insert(name);
        }
        Ok(ExposedTools::new(chosen, &approve))
    }

    fn resolve_entry(
        &self,
        registry: &ToolRegistry,
        entry: &str,
    ) -> Result<Arc<dyn Tool>, PolicyError> {
        let entry = entry.trim();
        if let Some((ns, name)) = entry.split_once('.') {
            if let Some(pinned) = &self.namespace
                && pinned != ns
            {
                return Err(PolicyError::OutsideNamespace {
                    entry: entry.to_owned(),
                    namespace: pinned.clone(),
                });
            }
            return registry
                .get(ns, name)
                .cloned()
                .ok_or_else(|| PolicyError::UnknownTool {
                    entry: entry.to_owned(),
                    namespace: None,
                });
        }
        let mut matches = registry.iter().filter(|t| {
            t.name() == entry
                && self
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| t.namespace() == ns)
        });
        match (matches.next(), matches.next()) {
            (Some(tool), None) => Ok(tool.clone()),
            (None, _) => Err(PolicyError::UnknownTool {
                entry: entry.to_owned(),
                namespace: self.namespace.clone(),
            }),
            (Some(a), Some(b)) => Err(PolicyError::Ambiguous {
                entry: entry.to_owned(),
                candidates: [qualified(a.as_ref()), qualified(b.as_ref())],
            }),
        }
    }
}

fn qualified(tool: &dyn Tool) -> String {
    format!("{}.{}", tool.namespace(), tool.name())
}

/// A policy that does not fit the registry. Each kind names the entry (or namespace) at
/// fault, so a host can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// No registered tool is in the pinned namespace.
    EmptyNamespace(String),
    /// An allowed entry names no registered tool (in `namespace`, when the policy pins one
    /// and the entry is bare).
    UnknownTool {
        /// The entry as written (trimmed).
        entry: String,
        /// The pinned namespace the bare entry was looked up in.
        namespace: Option<String>,
    },
    /// A bare entry names tools in more than one namespace.
    Ambiguous {
        /// The entry as written (trimmed).
        entry: String,
        /// Two of the qualified names it matches.
        candidates: [String; 2],
    },
    /// A qualified entry lies outside the pinned namespace.
    OutsideNamespace {
        /// The entry as written (trimmed).
        entry: String,
        /// The pinned namespace.
        namespace: String,
    },
    /// An `approve` entry names a tool the policy does not expose.
    ApproveNotExposed {
        /// The entry as written (trimmed).
        entry: String,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::EmptyNamespace(ns) => {
                write!(f, "no registered tool is in namespace `{ns}`")
            }
            PolicyError::UnknownTool {
                entry,
                namespace: Some(ns),
            } => write!(
                f,
                "allowed tool `{entry}` is not registered in namespace `{ns}`"
            ),
            PolicyError::UnknownTool {
                entry,
                namespace: None,
            } => write!(f, "allowed tool `{entry}` is not registered"),
            PolicyError::Ambiguous {
                entry,
                candidates: [a, b],
            } => write!(
                f,
                "allowed tool `{entry}` is ambiguous (`{a}` and `{b}`); write `namespace.{entry}`"
            ),
            PolicyError::OutsideNamespace { entry, namespace } => write!(
                f,
                "allowed tool `{entry}` is outside the pinned namespace `{namespace}`"
            ),
            PolicyError::ApproveNotExposed { entry } => write!(
                f,
                "tool `{entry}` needs approval but is not exposed; allow it as well"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

/// The tools one run exposes, with the names the guest may use for each.
///
/// A tool is reachable by its qualified name `namespace.name`, and by its bare name when no
/// other exposed tool shares it. Lookup is exact: no case folding, no trimming.
#[derive(Clone, Default)]
pub struct ExposedTools {
    by_name: BTreeMap<String, Arc<dyn Tool>>,
    bindings: Vec<Binding>,
    approve: BTreeSet<String>,
}

/// How the guest sees one exposed tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Binding {
    /// The global name of the async function in the code; `None` when the bare name is
    /// ambiguous and only `call_tool("namespace.name")` reaches the tool.
    pub binding: Option<String>,
    /// `namespace.name`.
    pub qualified: String,
    /// The tool's one-line description.
    pub description: String,
    /// The JSON schema of the tool's arguments object, as the tool declares it (so a
    /// description for a model can show its parameters).
    #[serde(default)]
    pub parameters: Value,
    /// True when a call of it waits for a person's approval (see [`ToolPolicy::approve`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_approval: bool,
}

impl fmt::Debug for ExposedTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.bindings.iter().map(|b| &b.qualified))
            .finish()
    }
}

impl ExposedTools {
    fn new(chosen: BTreeMap<String, Arc<dyn Tool>>, approve: &BTreeSet<String>) -> Self {
        let mut bare_count: BTreeMap<&str, usize> = BTreeMap::new();
        for tool in chosen.values() {
            *bare_count.entry(tool.name()).or_default() += 1;
        }
        let mut by_name = BTreeMap::new();
        let mut bindings = Vec::new();
        for (q, tool) in &chosen {
            let unique = bare_count[tool.name()] == 1;
            if unique {
                by_name.insert(tool.name().to_owned(), tool.clone());
            }
            by_name.insert(q.clone(), tool.clone());
            bindings.push(Binding {
                binding: unique.then(|| tool.name().to_owned()),
                qualified: q.clone(),
                description: tool.description().to_owned(),
                parameters: tool.parameters().clone(),
                needs_approval: approve.contains(q),
            });
        }
        ExposedTools {
            by_name,
            bindings,
            approve: approve.clone(),
        }
    }

    /// True when calls of the tool `qualified` (`namespace.name`) wait for approval.
    pub fn needs_approval(&self, qualified: &str) -> bool {
        self.approve.contains(qualified)
    }

    /// True when some exposed tool needs approval.
    pub fn any_need_approval(&self) -> bool {
        !self.approve.is_empty()
    }

    /// These tools with `tool` serving calls of the exposed tool of the same qualified name
    /// (`namespace.name`): for one run, a narrower version of a tool the policy exposes. The
    /// bindings stay as they are (the guest sees the same function).
    ///
    /// # Errors
    ///
    /// The qualified name, when no exposed tool has it: a run cannot add a tool.
    pub fn replaced(&self, tool: Arc<dyn Tool>) -> Result<ExposedTools, String> {
        let qualified = format!("{}.{}", tool.namespace(), tool.name());
        if !self.by_name.contains_key(&qualified) {
            return Err(qualified);
        }
        let mut out = self.clone();
        for (name, exposed) in &mut out.by_name {
            if *name == qualified
                || (name == tool.name() && exposed.namespace() == tool.namespace())
            {
                *exposed = tool.clone();
            }
        }
        Ok(out)
    }

    /// The exposed tool the guest's `name` refers to, matched exactly.
    pub fn lookup(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name)
    }

    /// How the guest sees each exposed tool, ordered by qualified name.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// The qualified names of the exposed tools.
    pub fn qualified_names(&self) -> Vec<&str> {
        self.bindings.iter().map(|b| b.qualified.as_str()).collect()
    }

    /// True when nothing is exposed.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

/// The tools as the guest's run request carries them, `[binding, qualified, description]`
/// each: the guest defines the async function `binding` (empty when the bare name is
/// ambiguous) and the attribute `name` of its namespace's object.
pub(crate) fn wire_bindings(tools: &[Binding]) -> Vec<[&str; 3]> {
    tools
        .iter()
        .map(|b| {
            [
                b.binding.as_deref().unwrap_or(""),
                b.qualified.as_str(),
                b.description.as_str(),
            ]
        })
        .collect()
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

//! Host tools for pycage: the [`Tool`] trait, the [`ToolRegistry`], built-in tools and
//! command tools declared in TOML.
//!
//! A tool runs on the host with the host's privileges, on behalf of untrusted guest code. The
//! guest can only reach a tool through pycage's broker, which applies the run's policy
//! (allowlist, namespace, call ceiling, byte caps, timeouts) before a tool sees anything.
//! Arguments arrive as a JSON object that the broker has already size-checked and parsed;
//! a tool must still treat every value in it as hostile input.

#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

pub mod builtin;
pub mod command;
pub mod json;
#[cfg(feature = "net")]
pub mod net;
pub mod process;
pub mod units;

/// The arguments of one tool call: a JSON object.
pub type Args = Map<String, Value>;

/// The future a tool call returns.
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'a>>;

/// Why a tool call failed. The message is shown to the guest: keep it short and free of host
/// details (paths, credentials, backtraces).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments do not fit the tool's parameters.
    InvalidArguments(String),
    /// The tool ran and failed.
    Failed(String),
    /// The tool refused the call by a policy of its own (a host not on `net.fetch`'s
    /// allowlist): the guest sees the kind `denied`, as for the broker's own refusals.
    Denied(String),
    /// The tool asks for the run to wait for a person: a run that keeps a journal stops
    /// here and comes back suspended, with this call pending and the message as the reason;
    /// a resume decides what the call returns. In a run that keeps no journal the call
    /// fails with the message.
    Suspend(String),
}

impl ToolError {
    /// The short message carried by this error.
    pub fn message(&self) -> &str {
        match self {
            ToolError::InvalidArguments(m)
            | ToolError::Failed(m)
            | ToolError::Denied(m)
            | ToolError::Suspend(m) => m,
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::InvalidArguments(m) => write!(f, "invalid arguments: {m}"),
            ToolError::Failed(m) => write!(f, "{m}"),
            ToolError::Denied(m) => write!(f, "denied: {m}"),
            ToolError::Suspend(m) => write!(f, "waiting for approval: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// A host function the guest may call through the broker.
///
/// The pair (`namespace`, `name`) identifies a tool; the guest sees it as an async function
/// called `name` when the run's policy exposes it.
pub trait Tool: Send + Sync + 'static {
    /// The tool's name: a Python identifier, unique within its namespace.
    fn name(&self) -> &str;
    /// The namespace the tool belongs to (for example `math`).
    fn namespace(&self) -> &str;
    /// One line saying what the tool does.
    fn description(&self) -> &str;
    /// A JSON schema for the arguments object.
    fn parameters(&self) -> &Value;
    /// The tool's own time limit for one call, if it has one. The broker applies the smaller
    /// of this and the run's per-call timeout.
    fn timeout(&self) -> Option<Duration> {
        None
    }
    /// Runs the tool on one arguments object.
    fn call(&self, args: Args) -> ToolFuture<'_>;
}

/// Why a tool could not be registered or loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryError {
    /// A tool with this qualified name (`namespace.name`) is already registered.
    Duplicate(String),
    /// A tool's name or namespace is not a valid identifier.
    InvalidName(String),
    /// A tools file could not be read or parsed; the message says where and why.
    Config(String),
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Duplicate(q) => write!(f, "tool `{q}` is registered twice"),
            RegistryError::InvalidName(m) => write!(f, "invalid tool name: {m}"),
            RegistryError::Config(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for RegistryError {}

/// True when `s` is a valid tool or namespace name: an ASCII Python identifier that is not a
/// Python keyword and does not start with an underscore.
pub fn is_valid_name(s: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
        "try", "while", "with", "yield",
    ];
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() => {}
        _ => return false,
    }
    s.len() <= 64 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') && !KEYWORDS.contains(&s)
}

/// A set of tools, keyed by `namespace.name`. Cheap to clone (tools are shared).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry holding the built-in tools (`math.*`, `text.echo`).
    pub fn with_builtins() -> Self {
        let mut registry = Self::new();
        #[allow(clippy::expect_used, reason = "fixed names, checked by the unit tests")]
        builtin::register_all(&mut registry).expect("built-in tool names are valid and unique");
        registry
    }

    /// Adds a tool.
    ///
    /// # Errors
    ///
    /// [`RegistryError::InvalidName`] when the name or namespace is not a valid identifier
    /// (see [`is_valid_name`]), [`RegistryError::Duplicate`] when the qualified name is taken.
    pub fn register(&mut self, tool: impl Tool) -> Result<(), RegistryError> {
        self.register_arc(Arc::new(tool))
    }

    /// Adds a shared tool. See [`ToolRegistry::register`].
    ///
    /// # Errors
    ///
    /// As for [`ToolRegistry::register`].
    pub fn register_arc(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        for part in [tool.namespace(), tool.name()] {
            if !is_valid_name(part) {
                return Err(RegistryError::InvalidName(format!(
                    "`{part}` is not an identifier (letters, digits, `_`; not a keyword)"
                )));
            }
        }
        let qualified = format!("{}.{}", tool.namespace(), tool.name());
        if self.tools.contains_key(&qualified) {
            return Err(RegistryError::Duplicate(qualified));
        }
        self.tools.insert(qualified, tool);
        Ok(())
    }

    /// Registers an async Rust closure as a tool.
    ///
    /// ```
    /// # use pycage_tools::{ToolRegistry, ToolError};
    /// let mut tools = ToolRegistry::new();
    /// tools.register_fn("demo", "greet", "Greets someone", serde_json::json!({"type": "object"}),
    ///     |args| async move {
    ///         let who = args.get("who").and_then(|v| v.as_str())
    ///             .ok_or_else(|| ToolError::InvalidArguments("`who` must be a string".into()))?;
    ///         Ok(serde_json::json!({ "greeting": format!("hello, {who}") }))
    ///     }).unwrap();
    /// assert!(tools.get("demo", "greet").is_some());
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`ToolRegistry::register`].
    pub fn register_fn<F, Fut>(
        &mut self,
        namespace: &str,
        name: &str,
        description: &str,
        parameters: Value,
        f: F,
    ) -> Result<(), RegistryError>
    where
        F: Fn(Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        self.register(FnTool {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
            f,
        })
    }

    /// Merges every tool of `other` into this registry.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Duplicate`] on the first clash; tools before it are kept.
    pub fn extend(&mut self, other: ToolRegistry) -> Result<(), RegistryError> {
        for tool in other.tools.into_values() {
            self.register_arc(tool)?;
        }
        Ok(())
    }

    /// The tool `namespace.name`, if registered.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(&format!("{namespace}.{name}"))
    }

    /// Every tool, ordered by qualified name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// The number of registered tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// True when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// A tool backed by an async closure; made by [`ToolRegistry::register_fn`].
struct FnTool<F> {
    namespace: String,
    name: String,
    description: String,
    parameters: Value,
    f: F,
}

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Args) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn call(&self, args: Args) -> ToolFuture<'_> {
        Box::pin((self.f)(args))
    }
}

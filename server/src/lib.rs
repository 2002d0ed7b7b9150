//! pycage's servers: the `run_python` tool over MCP, for a Rust host to mount in its own
//! process or for the `pycage mcp` command.
//!
//! [`PythonTool`] is the tool apart from any transport (input parsing, limits within the
//! configured maxima, sessions, the bound on concurrent runs, progress); [`mcp`] maps it onto
//! the Model Context Protocol with the official SDK, `rmcp`. Both are made from one
//! [`ServerConfig`].

pub mod clamp;
pub mod config;
mod front_door;
pub mod http;
pub mod input;
mod listener;
pub mod mcp;
pub mod python;
pub mod reply;
mod sandbox;
pub mod schema;
pub mod service;
pub mod suspended;
pub mod upstream;

pub use config::{ConfigError, HttpConfig, PolicyConfig, RunsConfig, ServerConfig};
pub use python::{ApprovalNotice, PendingApproval, Progress, PythonTool, StartError, ToolOutput};
pub use sandbox::guest_backend;
pub use suspended::SuspendedRuns;
pub use upstream::{Upstream, UpstreamConfig, UpstreamError};

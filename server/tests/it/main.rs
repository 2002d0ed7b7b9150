//! pycage-server's end-to-end tests, as one test binary (one link of wasmtime and the guest):
//! the HTTP API over a real socket, the MCP server driven by rmcp's client, the streamable
//! HTTP listener's guards, and code mode against a real upstream process.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

mod http_api;
mod mcp;
mod mcp_http;
mod slow_client;
mod upstream;

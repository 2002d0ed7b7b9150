//! Embedding pycage in a Rust host: a tool written as a closure, a policy, limits, one run.
//!
//! ```text
//! cargo run --example embed
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test reports by panicking"
)]

use std::time::Duration;

use pycage::{Limits, Runner, ToolPolicy};
use pycage_tools::{ToolError, ToolRegistry};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Host tools: the built-ins plus one of our own. The guest can reach only what the
    // policy exposes, and only through the broker.
    let mut tools = ToolRegistry::with_builtins();
    tools.register_fn(
        "crm",
        "lookup",
        "Finds a customer by id",
        json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}),
        |args| async move {
            let id = args
                .get("id")
                .and_then(|v| v.as_i64())
                .ok_or_else(|| ToolError::InvalidArguments("`id` must be an integer".into()))?;
            Ok(json!({"id": id, "name": format!("customer-{id}"), "balance": id * 10}))
        },
    )?;

    let runner = Runner::builder()
        .tools(tools)
        .policy(ToolPolicy::new().allow("crm.lookup").allow("math.add"))
        .limits(
            Limits::builder()
                .wall_timeout(Duration::from_secs(5))
                .build()?,
        )
        .build()?;

    let code = r#"
total = 0
for cid in ids:
    customer = await lookup(id=cid)
    total = (await add(a=total, b=customer["balance"]))["sum"]
print(f"looked up {len(ids)} customers")
return total
"#;
    let mut vars = serde_json::Map::new();
    vars.insert("ids".into(), json!([1, 2, 3]));
    let result = runner.run_with(code, vars, runner.limits()).await;

    println!(
        "ok={} value={} tool_calls={}",
        result.ok, result.value, result.tool_calls
    );
    print!("{}", result.stdout);
    if let Some(error) = &result.error {
        eprintln!("{}: {}", error.kind, error.message);
    }
    Ok(())
}

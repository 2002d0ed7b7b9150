//! The smallest host that embeds pycage: one runner, the built-in `math` tools behind the
//! broker, a wall-clock limit, and one run of the README's seed example (or of a file).
//!
//! ```text
//! cargo run --manifest-path examples/host/Cargo.toml [-- path/to/code.py]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use pycage::pycage_tools::ToolRegistry;
use pycage::{Limits, Runner, ToolPolicy};

/// The README's example: five calls of a brokered host tool.
const SEED: &str = r#"
total = 0
for i in range(1, 6):
    r = await add(a=str(total), b=str(i))   # 'add' is a brokered host tool
    total = r["sum"]
print("the sum of 1..5 through the broker:", total)
return total
"#;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let code = match std::env::args_os().nth(1) {
        Some(path) => std::fs::read_to_string(path)?,
        None => SEED.to_owned(),
    };
    let runner = Runner::builder()
        .tools(ToolRegistry::with_builtins())
        .policy(ToolPolicy::new().namespace("math"))
        .limits(
            Limits::builder()
                .wall_timeout(Duration::from_secs(30))
                .build()?,
        )
        .build()?;
    let result = runner.run(&code).await;
    print!("{}", result.stdout);
    eprint!("{}", result.stderr);
    if !result.ok {
        eprintln!("{}", result.for_model());
        return Ok(ExitCode::FAILURE);
    }
    println!("value: {} ({} tool calls)", result.value, result.tool_calls);
    Ok(ExitCode::SUCCESS)
}

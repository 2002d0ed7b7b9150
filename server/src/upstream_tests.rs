#![allow(clippy::unwrap_used, reason = "a test reports by panicking")]

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use super::*;

#[test]
fn a_flag_splits_like_a_shell_without_running_one() {
    let c = UpstreamConfig::parse_flag("fs=npx -y 'server filesystem' \"/srv/my data\"").unwrap();
    assert_eq!(c.name, "fs");
    assert_eq!(
        c.command,
        ["npx", "-y", "server filesystem", "/srv/my data"]
    );
    assert_eq!(c.timeout, Duration::from_secs(60));
    assert_eq!(c.max_restarts, 3);
    assert!(
        UpstreamConfig::parse_flag("fs")
            .unwrap_err()
            .contains("NAME='COMMAND")
    );
    assert!(
        UpstreamConfig::parse_flag("fs=npx 'open")
            .unwrap_err()
            .contains("fs=npx")
    );
    assert!(
        UpstreamConfig::parse_flag("fs=")
            .unwrap_err()
            .contains("command is empty")
    );
    for bad in ["my-fs", "class", "_fs", "1fs"] {
        let e = UpstreamConfig::parse_flag(&format!("{bad}=server")).unwrap_err();
        assert!(e.contains("identifier"), "{bad}: {e}");
    }
}

#[test]
fn a_url_upstream_is_http_with_a_host_and_nothing_of_a_command() {
    let c = UpstreamConfig::parse_flag("search= http://127.0.0.1:9000/mcp").unwrap();
    assert_eq!(c.url.as_deref(), Some("http://127.0.0.1:9000/mcp"));
    assert!(c.command.is_empty());
    let refused = |toml: &str| {
        let c: UpstreamConfig = toml::from_str(toml).unwrap();
        c.validate().unwrap_err()
    };
    let e = UpstreamConfig::parse_flag("s=https://mcp.example/mcp").unwrap_err();
    assert!(e.contains("https is not supported"), "{e}");
    let e = refused("name = \"s\"\nurl = \"ftp://x/mcp\"");
    assert!(e.contains("must start with http://"), "{e}");
    let e = refused("name = \"s\"\nurl = \"http:///mcp\"");
    assert!(e.contains("upstream `s`"), "{e}");
    let e = refused("name = \"s\"\nurl = \"http://a/mcp\"\ncommand = [\"srv\"]");
    assert!(e.contains("either `command` or `url`"), "{e}");
    let e = refused("name = \"s\"\nurl = \"http://a/mcp\"\nenv = { A = \"1\" }");
    assert!(
        e.contains("`env` and `pass_env` are for a `command`"),
        "{e}"
    );
    let e = refused("name = \"s\"");
    assert!(e.contains("give `command` or `url`"), "{e}");
}

#[test]
fn relative_program_paths_resolve_against_the_config_file_and_bare_names_do_not() {
    let mut c = UpstreamConfig::command("a", vec!["./bin/server".into(), "./x".into()]);
    c.resolve_against(Path::new("/etc/pycage"));
    assert_eq!(c.command, ["/etc/pycage/./bin/server", "./x"]);
    let mut c = UpstreamConfig::command("a", vec!["npx".into()]);
    c.resolve_against(Path::new("/etc/pycage"));
    assert_eq!(c.command, ["npx"]);
}

#[test]
fn tool_names_become_identifiers() {
    assert_eq!(python_name("get-sum"), "get_sum");
    assert_eq!(python_name("read_file"), "read_file");
    assert_eq!(python_name("a.b c"), "a_b_c");
}

#[test]
fn results_reach_the_code_as_values() {
    let mut structured = CallToolResult::success(vec![ContentBlock::text("{\"sum\": 3}")]);
    structured.structured_content = Some(json!({"sum": 3}));
    assert_eq!(value_of(structured).unwrap(), json!({"sum": 3}));
    let text = CallToolResult::success(vec![ContentBlock::text("hi")]);
    assert_eq!(value_of(text).unwrap(), json!("hi"));
    let mixed = CallToolResult::success(vec![
        ContentBlock::text("a"),
        ContentBlock::image("AAAA", "image/png"),
    ]);
    let v = value_of(mixed).unwrap();
    assert_eq!(v[0]["type"], "text");
    assert_eq!(v[1]["mimeType"], "image/png");
    let failed = CallToolResult::error(vec![ContentBlock::text("no such file")]);
    assert_eq!(
        value_of(failed).unwrap_err(),
        ToolError::Failed("no such file".into())
    );
}

#[test]
fn long_error_messages_are_clipped() {
    let long = "x".repeat(5000);
    let clipped = clip(&long);
    assert_eq!(clipped.chars().count(), 1001);
    assert_eq!(clip("short"), "short");
}

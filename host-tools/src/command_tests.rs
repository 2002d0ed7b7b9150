use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::{RegistryError, Tool, ToolError, ToolRegistry};

// ---------------------------------------------------------------- helpers

/// A fresh directory under the system temp dir, removed on drop.
fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pycage-tools-test-")
        .tempdir()
        .expect("a temp dir")
}

/// Every `tracing` event of this test binary, formatted. One global subscriber rather than a
/// scoped one per test: tracing caches each callsite's interest and the maximum level
/// globally, and with a scoped subscriber the event was lost when other tests' threads
/// registered callsites at the same time (seen running the whole suite).
fn captured_log() -> &'static CapturedLog {
    static LOG: std::sync::OnceLock<CapturedLog> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = CapturedLog::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        log
    })
}

/// A shared buffer that formatted `tracing` events are written into.
#[derive(Clone, Default)]
struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn config_error(result: Result<ToolRegistry, RegistryError>) -> String {
    match result {
        Err(RegistryError::Config(message)) => message,
        other => panic!("expected a config error, got {other:?}"),
    }
}

fn sh(script: &str) -> CommandTool {
    CommandTool::new(
        "test",
        "run",
        "Runs a test script.",
        vec!["/bin/sh".into(), "-c".into(), script.into()],
    )
    .expect("valid command")
}

fn args(value: Value) -> Args {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object, not {other}"),
    }
}

fn failed(message: &str) -> Result<Value, ToolError> {
    Err(ToolError::Failed(message.to_owned()))
}

/// True once `pid` no longer runs (gone, or a zombie waiting for its parent).
#[cfg(target_os = "linux")]
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[cfg(target_os = "linux")]
async fn wait_until_dead(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if is_dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Reads a pid a test script wrote to `path`, waiting for it to appear.
#[cfg(target_os = "linux")]
async fn read_pid(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid written to {path:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const FULL: &str = r#"
[[tool]]
name = "count_words"
namespace = "text"
description = "Counts words."
command = ["python3", "-c", "print(1)"]
timeout = "1.5s"
parameters = { type = "object", properties = { text = { type = "string" } }, required = ["text"], additionalProperties = false }

[[tool]]
name = "now"
namespace = "clock"
description = "Says the time."
command = ["/bin/date"]
"#;

// ---------------------------------------------------------------- parsing

#[test]
fn parses_tools_with_all_keys_and_defaults() {
    let registry = parse_toml(FULL, "tools.toml").expect("valid file");
    assert_eq!(registry.len(), 2);

    let words = registry.get("text", "count_words").expect("count_words");
    assert_eq!(words.description(), "Counts words.");
    assert_eq!(words.timeout(), Some(Duration::from_millis(1_500)));
    assert_eq!(
        words.parameters(),
        &json!({
            "type": "object",
            "properties": { "text": { "type": "string" } },
            "required": ["text"],
            "additionalProperties": false,
        })
    );

    let now = registry.get("clock", "now").expect("now");
    assert_eq!(now.timeout(), Some(DEFAULT_TIMEOUT));
    assert_eq!(now.parameters(), &json!({ "type": "object" }));
}

#[test]
fn parameters_may_be_a_sub_table() {
    let text = r#"
[[tool]]
name = "t"
namespace = "n"
description = "d"
command = ["true"]
[tool.parameters]
type = "object"
required = ["x"]
[tool.parameters.properties.x]
type = "integer"
minimum = 0
maximum = 1.5
"#;
    let registry = parse_toml(text, "tools.toml").expect("valid file");
    let tool = registry.get("n", "t").expect("tool");
    assert_eq!(
        tool.parameters(),
        &json!({
            "type": "object",
            "required": ["x"],
            "properties": { "x": { "type": "integer", "minimum": 0, "maximum": 1.5 } },
        })
    );
}

#[test]
fn an_empty_file_has_no_tools() {
    assert!(parse_toml("", "tools.toml").expect("valid").is_empty());
    assert!(
        parse_toml("# nothing\n", "tools.toml")
            .expect("valid")
            .is_empty()
    );
}

#[test]
fn unknown_key_in_a_tool_is_named() {
    let text = FULL.replace("timeout = \"1.5s\"", "timout = \"1.5s\"");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.starts_with("tools.toml: "), "{message}");
    assert!(message.contains("`timout`"), "{message}");
    assert!(message.contains("tool #1 (`count_words`)"), "{message}");
}

#[test]
fn unknown_key_in_a_later_tool_names_that_tool() {
    let text = format!("{FULL}env = {{ HOME = \"/\" }}\n");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.contains("`env`"), "{message}");
    assert!(message.contains("tool #2 (`now`)"), "{message}");
}

#[test]
fn unknown_top_level_key_is_named() {
    let text = format!("version = 2\n{FULL}");
    let message = config_error(parse_toml(&text, "my-tools.toml"));
    assert!(message.starts_with("my-tools.toml: "), "{message}");
    assert!(
        message.contains("unknown top-level key `version`"),
        "{message}"
    );
}

#[test]
fn errors_inside_a_tool_give_its_position() {
    let text = FULL.replace("timeout = \"1.5s\"", "timout = \"1.5s\"");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(
        message.starts_with(
            "tools.toml: line 7, column 1: tool #1 (`count_words`): unknown field `timout`"
        ),
        "{message}"
    );
    let text = FULL.replace("\"1.5s\"", "\"soon\"");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(
        message.starts_with("tools.toml: line 7, column 11: tool #1 (`count_words`): `timeout`"),
        "{message}"
    );
}

#[test]
fn a_top_level_table_after_the_tools_is_not_blamed_on_the_last_tool() {
    for (extra, key) in [("[extra]\nx = 1\n", "extra"), ("[[more]]\nx = 1\n", "more")] {
        let message = config_error(parse_toml(&format!("{FULL}{extra}"), "tools.toml"));
        assert!(message.contains("line 15, column "), "{extra}: {message}");
        assert!(
            message.contains(&format!("unknown top-level key `{key}`")),
            "{extra}: {message}"
        );
        assert!(!message.contains("tool #"), "{extra}: {message}");
    }
}

#[test]
fn an_unknown_sub_table_in_a_tool_names_that_tool() {
    let message = config_error(parse_toml(
        &format!("{FULL}[tool.env]\nx = 1\n"),
        "tools.toml",
    ));
    assert!(message.contains("tool #2 (`now`)"), "{message}");
    assert!(message.contains("`env`"), "{message}");
}

#[test]
fn tools_may_be_inline_tables() {
    let one = r#"{ name = "a", namespace = "n", description = "d", command = ["true"] }"#;
    let registry = parse_toml(&format!("tool = [{one}]\n"), "tools.toml").expect("valid");
    assert!(registry.get("n", "a").is_some());
    let two = r#"{ name = "b", namespace = "n", description = "d", command = ["true"], env = 1 }"#;
    let message = config_error(parse_toml(
        &format!("tool = [{one}, {two}]\n"),
        "tools.toml",
    ));
    assert!(message.contains("tool #2 (`b`)"), "{message}");
    assert!(message.contains("`env`"), "{message}");
}

#[test]
fn tool_must_be_an_array_of_tables() {
    for text in ["[tool]\nname = \"x\"\n", "tool = 5\n", "tool = [1, 2]\n"] {
        let message = config_error(parse_toml(text, "tools.toml"));
        assert!(message.contains("`[[tool]]`"), "{text:?}: {message}");
    }
}

#[test]
fn missing_required_keys_are_named() {
    for key in ["name", "namespace", "description", "command"] {
        let text: String = FULL
            .lines()
            .take(7)
            .filter(|line| !line.starts_with(&format!("{key} =")))
            .map(|line| format!("{line}\n"))
            .collect();
        let message = config_error(parse_toml(&text, "tools.toml"));
        assert!(message.contains("tool #1"), "{key}: {message}");
        assert!(message.contains("missing field"), "{key}: {message}");
        assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
    }
}

#[test]
fn ill_typed_keys_are_rejected() {
    let text = FULL.replace("description = \"Counts words.\"", "description = 5");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.contains("tool #1 (`count_words`)"), "{message}");
    assert!(message.contains("invalid type"), "{message}");

    let text = FULL.replace(r#"["/bin/date"]"#, r#"["/bin/date", 5]"#);
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.contains("tool #2 (`now`)"), "{message}");
}

#[test]
fn empty_command_is_rejected() {
    for command in ["[]", "[\"\"]"] {
        let text = FULL.replace(r#"["/bin/date"]"#, command);
        let message = config_error(parse_toml(&text, "tools.toml"));
        assert!(message.contains("tool #2 (`now`)"), "{message}");
        assert!(message.contains("`command`"), "{message}");
    }
}

#[test]
fn bad_timeouts_are_rejected() {
    for (timeout, reason) in [
        ("10", "a unit is required"),
        ("0s", "greater than zero"),
        ("soon", "invalid duration `soon`"),
        ("-1s", "negative"),
    ] {
        let text = FULL.replace("\"1.5s\"", &format!("\"{timeout}\""));
        let message = config_error(parse_toml(&text, "tools.toml"));
        assert!(message.contains("tool #1 (`count_words`)"), "{message}");
        assert!(message.contains("`timeout`"), "{message}");
        assert!(message.contains(reason), "{timeout}: {message}");
    }
    let text = FULL.replace("\"1.5s\"", "10");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn parameters_must_describe_an_object() {
    for schema in [
        "{ type = \"string\" }",
        "{ properties = {} }",
        "\"object\"",
        "[]",
    ] {
        let text = format!("{FULL}parameters = {schema}\n");
        let message = config_error(parse_toml(&text, "tools.toml"));
        assert!(message.contains("tool #2 (`now`)"), "{message}");
        assert!(message.contains("`parameters`"), "{schema}: {message}");
    }
    let text = format!("{FULL}parameters = {{ type = \"object\", default = nan }}\n");
    let message = config_error(parse_toml(&text, "tools.toml"));
    assert!(message.contains("not a JSON number"), "{message}");
}

#[tokio::test]
async fn expose_stderr_is_read_from_the_file() {
    let tool = |extra: &str| {
        format!(
            "[[tool]]\nname = \"t\"\nnamespace = \"n\"\ndescription = \"d\"\n\
             command = [\"/bin/sh\", \"-c\", \"echo 'the reason' >&2; exit 4\"]\n{extra}"
        )
    };
    for (extra, expected) in [
        ("", "tool exited with status 4"),
        ("expose_stderr = false\n", "tool exited with status 4"),
        ("expose_stderr = true\n", "the reason"),
    ] {
        let registry = parse_toml(&tool(extra), "tools.toml").expect("valid file");
        let t = registry.get("n", "t").expect("tool");
        assert_eq!(t.call(Args::new()).await, failed(expected), "{extra:?}");
    }
    let message = config_error(parse_toml(&tool("expose_stderr = \"yes\"\n"), "tools.toml"));
    assert!(message.contains("tool #1 (`t`)"), "{message}");
    assert!(message.contains("invalid type"), "{message}");
}

/// Issue 37, hole 8: a command tool does not inherit the host's environment (a secret there
/// reached every tool, and through its output the guest): only `PATH` and its kind, and what
/// `pass_env` names. `CARGO_MANIFEST_DIR` stands for the secret: cargo sets it in this test's
/// environment, and it is not one of the inherited names.
#[cfg(unix)]
#[tokio::test]
async fn a_command_tool_gets_only_the_inherited_environment_and_what_pass_env_names() {
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "run by cargo"
    );
    let tool = |extra: &str| {
        format!(
            "[[tool]]\nname = \"t\"\nnamespace = \"n\"\ndescription = \"d\"\n\
             command = [\"sh\", \"-c\", \"printf '{{\\\"secret\\\": \\\"%s\\\", \\\"path\\\": \\\"%s\\\"}}' \\\"$CARGO_MANIFEST_DIR\\\" \\\"$PATH\\\"\"]\n{extra}"
        )
    };
    let path = std::env::var("PATH").expect("PATH is set");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    for (extra, secret) in [
        ("", ""),
        ("pass_env = [\"CARGO_MANIFEST_DIR\"]\n", dir.as_str()),
    ] {
        let registry = parse_toml(&tool(extra), "tools.toml").expect("valid file");
        let t = registry.get("n", "t").expect("tool");
        let result = t.call(Args::new()).await;
        assert_eq!(
            result,
            Ok(json!({"secret": secret, "path": path})),
            "{extra:?}"
        );
    }
}

#[test]
fn syntax_errors_give_a_position() {
    let message = config_error(parse_toml("[[tool]]\nname = \n", "tools.toml"));
    assert!(
        message.starts_with("tools.toml: line 2, column "),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}

#[test]
fn duplicate_tools_are_rejected() {
    let text = format!("{FULL}{FULL}");
    assert_eq!(
        parse_toml(&text, "tools.toml").unwrap_err(),
        RegistryError::Duplicate("text.count_words".into())
    );
}

#[test]
fn invalid_names_are_rejected_with_their_origin() {
    let text = FULL.replace("\"count_words\"", "\"count-words\"");
    match parse_toml(&text, "tools.toml") {
        Err(RegistryError::InvalidName(message)) => {
            assert!(message.contains("`count-words`"), "{message}");
            assert!(message.contains("tools.toml: tool #1"), "{message}");
        }
        other => panic!("expected an invalid name, got {other:?}"),
    }
}

#[test]
fn command_tool_new_rejects_an_empty_argv() {
    assert!(matches!(
        CommandTool::new("n", "t", "d", vec![]),
        Err(RegistryError::Config(_))
    ));
    assert!(matches!(
        CommandTool::new("n", "t", "d", vec![String::new()]),
        Err(RegistryError::Config(_))
    ));
}

// ---------------------------------------------------------------- loading files

#[cfg(unix)]
#[tokio::test]
async fn load_file_resolves_relative_programs_next_to_the_file() {
    let dir = temp_dir();
    std::fs::create_dir(dir.path().join("bin")).expect("mkdir");
    // A symlink to `cat` stands in for a shipped script: it echoes the arguments back.
    std::os::unix::fs::symlink("/bin/cat", dir.path().join("bin/echo_args")).expect("symlink");
    let file = dir.path().join("tools.toml");
    let text = r#"
[[tool]]
name = "relative"
namespace = "t"
description = "d"
command = ["./bin/echo_args"]

[[tool]]
name = "bare"
namespace = "t"
description = "d"
command = ["cat"]

[[tool]]
name = "absolute"
namespace = "t"
description = "d"
command = ["/bin/cat"]
"#;
    std::fs::write(&file, text).expect("write tools file");
    let registry = load_file(&file).expect("valid file");
    for name in ["relative", "bare", "absolute"] {
        let tool = registry.get("t", name).expect("tool");
        let result = tool
            .call(args(json!({"name": name, "x": [1, "two"]})))
            .await;
        assert_eq!(result, Ok(json!({"name": name, "x": [1, "two"]})), "{name}");
    }
}

#[test]
fn only_relative_programs_with_a_slash_are_resolved() {
    let base = Path::new("/etc/pycage");
    let resolve = |program: &str| {
        let argv = vec![program.to_owned(), "--flag".to_owned()];
        config::resolve_program(argv, Some(base)).expect("utf-8")
    };
    assert_eq!(resolve("./tool.py"), ["/etc/pycage/./tool.py", "--flag"]);
    assert_eq!(resolve("bin/tool"), ["/etc/pycage/bin/tool", "--flag"]);
    assert_eq!(resolve("../tool"), ["/etc/pycage/../tool", "--flag"]);
    assert_eq!(resolve("python3"), ["python3", "--flag"]);
    assert_eq!(resolve("/usr/bin/env"), ["/usr/bin/env", "--flag"]);
    // Without a base (parse_toml) nothing changes.
    let argv = vec!["./tool.py".to_owned()];
    assert_eq!(
        config::resolve_program(argv, None),
        Ok(vec!["./tool.py".to_owned()])
    );
}

#[test]
fn load_file_names_a_missing_file() {
    let dir = temp_dir();
    let file = dir.path().join("missing.toml");
    let message = config_error(load_file(&file));
    assert!(message.contains("missing.toml"), "{message}");
    assert!(message.contains("cannot read tools file"), "{message}");
}

// ---------------------------------------------------------------- running commands

#[tokio::test]
async fn echoes_json_through_a_shell_script() {
    let tool = sh("cat");
    let input = json!({"text": "héllo", "n": 3, "nested": {"ok": true}});
    assert_eq!(tool.call(args(input.clone())).await, Ok(input));
}

#[tokio::test]
async fn stdin_is_the_arguments_then_a_newline_then_eof() {
    // `cat` returns only at end of input; what it read is `{}` and a newline, then `x`.
    let tool = sh(r#"input=$(cat; echo x); printf '{"len": %d}' "${#input}""#);
    assert_eq!(tool.call(Args::new()).await, Ok(json!({"len": 4})));
}

#[tokio::test]
async fn runs_a_python_tool_found_on_path() {
    let script = "import json, sys\n\
                  args = json.load(sys.stdin)\n\
                  print(json.dumps({'words': len(args['text'].split())}))";
    let tool = CommandTool::new(
        "text",
        "count_words",
        "Counts words.",
        vec!["python3".into(), "-c".into(), script.into()],
    )
    .expect("valid");
    let result = tool.call(args(json!({"text": "one two  three"}))).await;
    assert_eq!(result, Ok(json!({"words": 3})));
}

#[tokio::test]
async fn nonzero_exit_hides_stderr_from_the_guest_by_default() {
    let tool = sh("echo '/home/secret/x: permission denied' >&2; exit 3");
    assert!(!tool.expose_stderr());
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool exited with status 3")
    );
}

#[tokio::test]
async fn nonzero_exit_reports_the_last_stderr_line_when_exposed() {
    let tool = sh("echo first >&2; echo '  the real reason  ' >&2; printf '\\n \\n' >&2; exit 3")
        .with_expose_stderr(true);
    assert!(tool.expose_stderr());
    assert_eq!(tool.call(Args::new()).await, failed("the real reason"));
}

#[tokio::test]
async fn nonzero_exit_without_stderr_reports_the_status() {
    let tool = sh("echo '{}'; exit 7");
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool exited with status 7")
    );
    let tool = sh("echo '{}'; exit 7").with_expose_stderr(true);
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool exited with status 7")
    );
}

#[tokio::test]
async fn hidden_stderr_goes_to_the_host_log_without_the_arguments() {
    let log = captured_log();
    let tool = CommandTool::new(
        "logs",
        "hidden_stderr",
        "d",
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "cat >/dev/null; echo early >&2; echo '/home/secret/x: no such file' >&2; exit 3"
                .into(),
        ],
    )
    .expect("valid");
    let result = tool.call(args(json!({"password": "hunter2"}))).await;
    assert_eq!(result, failed("tool exited with status 3"));
    let text = log.text();
    let line = text
        .lines()
        .find(|line| line.contains("tool=logs.hidden_stderr"))
        .unwrap_or_else(|| panic!("no log line for the tool in:\n{text}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("/home/secret/x: no such file"), "{line}");
    assert!(!line.contains("early"), "{line}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn stderr_message_is_bounded_and_clean() {
    // A long last line is cut at 500 characters; control characters are dropped.
    let tool = sh("printf 'early\\n' >&2; printf '\\033[31mé%.0s' $(seq 1 600) >&2; exit 1")
        .with_expose_stderr(true);
    let err = tool.call(Args::new()).await.unwrap_err();
    let ToolError::Failed(message) = err else {
        panic!("expected Failed, got {err:?}");
    };
    assert_eq!(message.chars().count(), 500, "{message}");
    assert!(
        message
            .chars()
            .all(|c| c == 'é' || c == '[' || c == '3' || c == '1' || c == 'm')
    );
}

#[tokio::test]
async fn huge_stderr_keeps_only_its_tail() {
    let tool = sh(
        "head -c 1000000 /dev/zero | tr '\\0' 'x' >&2; echo >&2; echo 'final words' >&2; exit 1",
    )
    .with_max_stderr_bytes(1024)
    .with_expose_stderr(true);
    assert_eq!(tool.call(Args::new()).await, failed("final words"));
}

#[cfg(unix)]
#[tokio::test]
async fn killed_by_a_signal_is_reported() {
    let tool = sh("echo dying >&2; kill -TERM $$");
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool was killed by signal 15")
    );
    // The signal says more than the line, so it wins even when stderr is exposed.
    let tool = sh("echo dying >&2; kill -TERM $$").with_expose_stderr(true);
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool was killed by signal 15")
    );
}

#[tokio::test]
async fn invalid_json_output_fails() {
    for script in ["echo not json", "true", "echo '{\"a\": 1} trailing'"] {
        assert_eq!(
            sh(script).call(Args::new()).await,
            failed("tool returned invalid JSON"),
            "{script}"
        );
    }
}

#[tokio::test]
async fn numbers_in_a_result_are_exact_or_refused() {
    assert_eq!(
        sh("echo '[-7.312715117751976e-237, 18446744073709551615]'")
            .call(Args::new())
            .await
            .unwrap()
            .to_string(),
        "[-7.312715117751976e-237,18446744073709551615]"
    );
    let big = sh("echo '{\"n\": 1180591620717411303424}'")
        .call(Args::new())
        .await;
    let Err(ToolError::Failed(message)) = big else {
        panic!("{big:?}")
    };
    assert!(
        message.contains("in the tool's result, the integer 1180591620717411303424 is outside"),
        "{message}"
    );
}

#[tokio::test]
async fn any_json_value_is_a_result() {
    assert_eq!(sh("echo 42").call(Args::new()).await, Ok(json!(42)));
    assert_eq!(sh("echo '\"hi\"'").call(Args::new()).await, Ok(json!("hi")));
}

#[tokio::test]
async fn output_at_the_cap_is_accepted() {
    // `{"a":123}` plus a newline: exactly 10 bytes.
    let tool = sh(r#"echo '{"a":123}'"#).with_max_output_bytes(10);
    assert_eq!(tool.call(Args::new()).await, Ok(json!({"a": 123})));
}

#[tokio::test]
async fn output_over_the_cap_fails() {
    let tool = sh(r#"echo '{"a":1234}'"#).with_max_output_bytes(10);
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool output exceeds 10 bytes")
    );
}

#[tokio::test]
async fn endless_output_stops_at_the_cap() {
    let tool = sh("yes").with_max_output_bytes(1 << 20);
    let started = Instant::now();
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool output exceeds 1048576 bytes")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// On tokio's paused clock: the call's own deadline ends it at exactly its timeout, however
/// slow the machine. (The process-tree tests below stay on the real clock: their scripts must
/// really start, and write their pid file, before the deadline.)
#[tokio::test(start_paused = true)]
async fn timeout_kills_the_command_promptly() {
    let tool = CommandTool::new("t", "slow", "d", vec!["sleep".into(), "30".into()])
        .expect("valid")
        .with_timeout(Duration::from_millis(300));
    assert_eq!(tool.timeout(), Some(Duration::from_millis(300)));
    let started = tokio::time::Instant::now();
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool timed out after 300ms")
    );
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[tokio::test]
async fn command_within_its_timeout_succeeds() {
    let tool = sh("sleep 0.1; echo '{}'").with_timeout(Duration::from_secs(10));
    assert_eq!(tool.call(Args::new()).await, Ok(json!({})));
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = temp_dir();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "sleep 30 & echo $! > '{}'; wait",
        pid_file.to_str().expect("utf-8")
    );
    let tool = sh(&script).with_timeout(Duration::from_millis(500));
    let started = Instant::now();
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool timed out after 500ms")
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let grandchild = read_pid(&pid_file).await;
    assert!(
        wait_until_dead(grandchild).await,
        "grandchild {grandchild} survived"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_cancelled_call_kills_the_whole_process_group() {
    let dir = temp_dir();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "sleep 30 & echo $! > '{}'; wait",
        pid_file.to_str().expect("utf-8")
    );
    let tool = sh(&script).with_timeout(Duration::from_secs(60));
    // The broker's own deadline drops the call future.
    let cancelled = tokio::time::timeout(Duration::from_millis(500), tool.call(Args::new())).await;
    assert!(cancelled.is_err());
    let grandchild = read_pid(&pid_file).await;
    assert!(
        wait_until_dead(grandchild).await,
        "grandchild {grandchild} survived"
    );
}

#[tokio::test]
async fn a_command_that_ignores_large_input_does_not_deadlock() {
    let tool = sh("echo '{\"ignored\": true}'").with_timeout(Duration::from_secs(10));
    let big = "x".repeat(4 << 20);
    assert_eq!(
        tool.call(args(json!({"blob": big}))).await,
        Ok(json!({"ignored": true}))
    );
}

#[tokio::test]
async fn a_missing_program_cannot_be_started() {
    let tool = CommandTool::new(
        "t",
        "missing",
        "d",
        vec!["/nonexistent/pycage/secret-dir/tool".into()],
    )
    .expect("valid");
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool could not be started")
    );
    let tool = CommandTool::new("t", "missing", "d", vec!["pycage-no-such-program".into()])
        .expect("valid");
    assert_eq!(
        tool.call(Args::new()).await,
        failed("tool could not be started")
    );
}

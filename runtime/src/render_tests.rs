use serde_json::{Value, json};

use super::*;
use crate::capture::Captured;
use crate::{ErrorKind, RunError};

fn captured(text: String) -> Captured {
    Captured {
        text,
        truncated: false,
    }
}

fn file(path: &str, size: u64) -> OutputFile {
    OutputFile {
        path: path.to_owned(),
        size,
        bytes: None,
    }
}

/// The number in the first `[... N bytes cut ...]` marker after `from`.
fn cut_after(text: &str, from: &str) -> usize {
    let start = text.find(from).unwrap() + from.len();
    let rest = &text[start..];
    let open = rest.find("[... ").unwrap() + 5;
    let close = rest[open..].find(" bytes cut ...]").unwrap() + open;
    rest[open..close].replace(',', "").parse().unwrap()
}

#[test]
fn a_small_result_is_shown_whole() {
    let ok = RunResult::builder("wasm", Ok(json!({"total": 15})))
        .stdout(captured("hello\n".into()))
        .build();
    assert_eq!(ok.for_model(), "ok\nvalue: {\"total\":15}\nstdout: hello\n");

    let mut error = RunError::new(
        ErrorKind::GuestException,
        "ZeroDivisionError: division by zero",
    );
    error.traceback = Some(
        "Traceback (most recent call last):\n  File \"<code>\", line 1, in <module>\nZeroDivisionError: division by zero\n"
            .into(),
    );
    let mut failed = RunResult::builder("wasm", Err(error)).build();
    failed.tool_calls = 2;
    assert_eq!(
        failed.for_model(),
        "error: guest_exception\ntool calls: 2\nmessage: ZeroDivisionError: division by zero\n\
         traceback (last lines):\nTraceback (most recent call last):\n  File \"<code>\", line 1, \
         in <module>\nZeroDivisionError: division by zero\n"
    );
}

#[test]
fn a_megabyte_of_stdout_is_cut_to_the_bound_keeping_its_end() {
    let stdout: String = (0..100_000).map(|i| format!("line {i:05}\n")).collect();
    assert!(stdout.len() > 1_000_000);
    let result = RunResult::builder("wasm", Ok(Value::Null))
        .stdout(captured(stdout.clone()))
        .build();
    let text = result.for_model();
    assert!(text.len() <= MODEL_TEXT_BYTES, "{}", text.len());
    assert!(
        text.len() > MODEL_TEXT_BYTES - 100,
        "the bound is used: {}",
        text.len()
    );
    assert!(text.contains("line 99999"), "the last line is kept");
    assert!(!text.contains("line 00000"), "the first is cut");
    let cut = cut_after(&text, "stdout:\n");
    let kept = &text[text.find(" bytes cut ...]\n").unwrap() + 16..];
    assert!(
        kept.starts_with("line "),
        "the tail starts at a line: {kept:.20}"
    );
    assert_eq!(
        cut + kept.trim_end().len(),
        stdout.trim_end().len(),
        "the marker says how much"
    );
    assert!(text.contains(" bytes cut ...]") && cut > 1_000_000);
    let custom = result.for_model_within(1000);
    assert!(custom.len() <= 1000 && custom.contains("line 99999"));
}

#[test]
fn an_error_shows_its_kind_message_and_the_end_of_its_traceback() {
    let traceback: String = (0..3000)
        .map(|i| format!("  File \"<code>\", line {i}, in f{i}\n"))
        .chain(["RecursionError: maximum recursion depth exceeded\n".to_owned()])
        .collect();
    let mut error = RunError::new(
        ErrorKind::GuestException,
        "RecursionError: maximum recursion depth exceeded",
    );
    error.traceback = Some(traceback);
    error.exception = Some("RecursionError".into());
    let result = RunResult::builder("wasm", Err(error)).build();
    let text = result.for_model_within(2048);
    assert!(text.len() <= 2048);
    assert!(text.starts_with("error: guest_exception\n"), "{text}");
    assert!(text.contains("message: RecursionError: maximum recursion depth exceeded\n"));
    assert!(
        text.ends_with("line 2999, in f2999\nRecursionError: maximum recursion depth exceeded\n")
    );
    assert!(!text.contains("line 0,"));
    assert!(cut_after(&text, "traceback (last lines):\n") > 100_000);
    assert!(
        !text.contains("value:"),
        "a failed run has no value to show"
    );
}

#[test]
fn a_timeout_says_so() {
    let result = RunResult::builder(
        "wasm",
        Err(RunError::new(
            ErrorKind::Timeout,
            "the run exceeded its 5s wall-clock limit",
        )),
    )
    .build();
    assert_eq!(
        result.for_model(),
        "error: timeout\ntimed out: the wall-clock limit ended the run\n\
         message: the run exceeded its 5s wall-clock limit\n"
    );
}

#[test]
fn produced_files_are_listed_with_their_sizes() {
    let result = RunResult::builder("wasm", Ok(Value::Null))
        .files(vec![file("count.txt", 1), file("out/data.csv", 1_048_576)])
        .build();
    assert_eq!(
        result.for_model(),
        "ok\nvalue: null\nfiles:\n- count.txt (1 bytes)\n- out/data.csv (1,048,576 bytes)\n"
    );

    let many: Vec<OutputFile> = (0..10_000)
        .map(|i| file(&format!("f{i}.txt"), 10))
        .collect();
    let result = RunResult::builder("wasm", Ok(Value::Null))
        .files(many)
        .build();
    let text = result.for_model();
    assert!(text.len() <= MODEL_TEXT_BYTES);
    assert!(text.contains("- f0.txt (10 bytes)\n"));
    assert!(
        text.contains("10,000 files, 100,000 bytes in all ...]"),
        "{text}"
    );
    let shown = text.matches("\n- f").count();
    let rest = crate::result::thousands(10_000 - shown as u64);
    assert!(
        text.contains(&format!("[... and {rest} more files;")),
        "{text}"
    );
}

#[test]
fn the_bound_holds_for_every_part_at_its_worst() {
    // Multi-byte characters everywhere, so that any cut off a boundary would panic.
    let big = |unit: &str, n: usize| unit.repeat(n);
    let value = json!([big("é😀", 200_000), big("ß", 300_000)]);
    let mut error = RunError::new(ErrorKind::ValueTooLarge, big("ü", 2_000));
    error.traceback = Some(big("line 😀\n", 100_000));
    let mut result = RunResult::builder("wasm", Err(error))
        .stdout(captured(big("ő\n", 600_000)))
        .stderr(captured(big("€", 400_000)))
        .files(
            (0..5_000)
                .map(|i| file(&format!("{}/{i}.txt", big("ñ", 100)), u64::MAX / 8))
                .collect(),
        )
        .build();
    result.value = value;
    result.timed_out = true;
    result.tool_calls = 100;
    for max in [0, 1, 7, 50, 120, 300, 1_000, 4_096, 8_192, 65_536] {
        let text = result.for_model_within(max);
        assert!(text.len() <= max, "{} > {max}", text.len());
    }
    let text = result.for_model();
    assert!(text.len() <= MODEL_TEXT_BYTES && text.len() > MODEL_TEXT_BYTES - 200);
    for label in [
        "error: value_too_large\n",
        "timed out:",
        "tool calls: 100\n",
        "message: üü",
        "traceback (last lines):\n[... ",
        "value: [\"é😀",
        "stdout:\n[... ",
        "stderr:\n[... ",
        "files:\n- ñ",
        "more files; 5,000 files,",
    ] {
        assert!(text.contains(label), "`{label}` missing from:\n{text}");
    }
}

#[test]
fn short_parts_are_whole_and_long_ones_share_the_rest() {
    assert_eq!(share(100, &[10, 500, 500]), [10, 45, 45]);
    assert_eq!(share(100, &[500, 10, 30]), [60, 10, 30]);
    assert_eq!(share(100, &[20, 30]), [20, 30]);
    assert_eq!(share(0, &[20, 30]), [0, 0]);
}

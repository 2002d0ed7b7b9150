//! Bad input to the host API: huge, odd or hostile requests get clear errors, never a crash.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use pycage::{ErrorKind, Limits};
use serde_json::json;

#[tokio::test]
async fn a_60_mb_code_string_is_refused_before_the_guest_starts() {
    let code = format!("x = 1\n{}", "#".repeat(60 << 20));
    let started = Instant::now();
    let r = run(&code).await;
    assert_kind(&r, ErrorKind::InvalidInput);
    assert!(r.error.unwrap().message.contains("limit"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(run("return 'alive'").await.value, json!("alive"));
}

#[tokio::test]
async fn a_60_mb_code_string_under_a_raised_limit_ends_cleanly() {
    let limits = Limits::builder()
        .max_code_bytes(64 << 20)
        .wall_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // Sixty megabytes of valid statements: the guest parses what fits its memory.
    let code = "x = 1\n".repeat(10 << 20);
    let r = run_limited(&code, limits).await;
    if !r.ok {
        let kind = r.error.as_ref().unwrap().kind;
        assert!(
            matches!(
                kind,
                ErrorKind::MemoryLimit | ErrorKind::SyntaxError | ErrorKind::Timeout
            ),
            "{:?}",
            r.error
        );
    }
    assert_eq!(run("return 'alive'").await.value, json!("alive"));
}

#[tokio::test]
async fn many_variables_and_odd_values_cross_intact() {
    let mut vars = serde_json::Map::new();
    for i in 0..1000 {
        vars.insert(format!("v{i}"), json!({"i": i, "s": "é\u{0}\u{1f600}"}));
    }
    let r = runner(pycage::ToolPolicy::new(), Limits::default())
        .run_with(
            "return [v0, v999['s'], len([k for k in globals() if k.startswith('v')])]",
            vars,
            &Limits::default(),
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value,
        json!([{"i": 0, "s": "é\u{0}\u{1f600}"}, "é\u{0}\u{1f600}", 1000])
    );
}

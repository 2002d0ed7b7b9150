use super::*;

fn limits(timeout: u64, memory_mib: u64, calls: u32) -> Limits {
    Limits::builder()
        .wall_timeout(Duration::from_secs(timeout))
        .memory_bytes(memory_mib << 20)
        .max_tool_calls(calls)
        .build()
        .unwrap()
}

#[test]
fn nothing_asked_is_the_defaults() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    assert_eq!(apply(&d, &m, None).unwrap(), (d.clone(), vec![]));
    assert_eq!(apply(&d, &m, Some(&Value::Null)).unwrap().0, d);
    assert_eq!(apply(&d, &m, Some(&json!({}))).unwrap().0, d);
}

#[test]
fn values_within_the_maxima_are_taken() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    let asked = json!({"timeout_seconds": 0.5, "memory_mib": 300, "max_tool_calls": 0,
                       "max_output_bytes": 1000, "fuel": 5000});
    let (got, clamped) = apply(&d, &m, Some(&asked)).unwrap();
    assert!(clamped.is_empty());
    assert_eq!(got.wall_timeout(), Duration::from_millis(500));
    assert_eq!(got.memory_bytes(), 300 << 20);
    assert_eq!(got.max_tool_calls(), 0);
    assert_eq!(got.max_output_bytes(), 1000);
    assert_eq!(got.fuel(), Some(5000));
}

#[test]
fn values_above_the_maxima_are_lowered_and_said() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    let asked = json!({"timeout_seconds": 600, "memory_mib": 4096, "max_tool_calls": 7});
    let (got, clamped) = apply(&d, &m, Some(&asked)).unwrap();
    assert_eq!(got.wall_timeout(), Duration::from_secs(60));
    assert_eq!(got.memory_bytes(), 512 << 20);
    assert_eq!(got.max_tool_calls(), 7);
    let fields: Vec<_> = clamped.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, ["timeout_seconds", "memory_mib"]);
    assert_eq!(clamped[0].asked, json!(600));
    assert_eq!(clamped[0].got, json!(60.0));
    assert_eq!(
        note(&clamped).unwrap(),
        "limits lowered to the server's maxima: timeout_seconds 600 → 60.0, memory_mib 4096 → 512"
    );
    assert_eq!(note(&[]), None);
}

#[test]
fn fuel_is_clamped_only_where_the_maxima_meter_it() {
    let d = limits(10, 128, 8);
    let metered = Limits::builder().fuel(Some(1000)).build().unwrap();
    let (got, clamped) = apply(&d, &metered, Some(&json!({"fuel": 5000}))).unwrap();
    assert_eq!((got.fuel(), clamped.len()), (Some(1000), 1));
    let unmetered = limits(60, 512, 100);
    let (got, clamped) = apply(&d, &unmetered, Some(&json!({"fuel": 5000}))).unwrap();
    assert_eq!((got.fuel(), clamped.len()), (Some(5000), 0));
}

#[test]
fn bad_values_are_invalid_input_naming_the_field() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    for (asked, needle) in [
        (json!(3), "`limits` must be an object"),
        (json!({"timeout": 1}), "no field `timeout`"),
        (json!({"timeout_seconds": 0}), "timeout_seconds"),
        (json!({"timeout_seconds": -1}), "timeout_seconds"),
        (json!({"timeout_seconds": "10s"}), "timeout_seconds"),
        (json!({"memory_mib": 0}), "memory_mib"),
        (json!({"memory_mib": 1.5}), "memory_mib"),
        (json!({"max_tool_calls": -1}), "max_tool_calls"),
        (json!({"fuel": 0}), "fuel"),
        // Valid alone, but below the library's floor for memory.
        (
            json!({"memory_mib": 1}),
            "`limits.memory_mib`: must be between",
        ),
    ] {
        let e = apply(&d, &m, Some(&asked)).unwrap_err();
        assert!(matches!(e, InputError::Limits(_)), "{asked}");
        assert!(e.message().contains(needle), "{asked}: {e}");
    }
}

#[test]
fn the_library_names_are_taken_and_clamped_in_their_own_units() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    let asked = json!({"wall_timeout": "2m", "memory_bytes": 300u64 << 20, "max_files": 7});
    let (got, clamped) = apply(&d, &m, Some(&asked)).unwrap();
    assert_eq!(got.wall_timeout(), Duration::from_secs(60));
    assert_eq!(got.memory_bytes(), 300 << 20);
    assert_eq!(got.max_files(), 7);
    assert_eq!(clamped.len(), 1);
    assert_eq!(clamped[0].field, "wall_timeout");
    assert_eq!(clamped[0].asked, json!("2m"));
    assert_eq!(clamped[0].got, json!("1m"));
}

#[test]
fn an_alias_and_its_field_together_are_refused() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    for asked in [
        json!({"timeout_seconds": 5, "wall_timeout": "5s"}),
        json!({"memory_bytes": 100u64 << 20, "memory_mib": 100}),
    ] {
        let e = apply(&d, &m, Some(&asked)).unwrap_err();
        assert!(e.message().contains("names both"), "{asked}: {e}");
    }
    for (asked, needle) in [
        (json!({"wall_timeout": 5}), "`limits.wall_timeout`"),
        (json!({"max_files": -1}), "`limits.max_files`"),
        (json!({"max_code_bytes": 0}), "`limits.max_code_bytes`"),
    ] {
        let e = apply(&d, &m, Some(&asked)).unwrap_err();
        assert!(e.message().contains(needle), "{asked}: {e}");
    }
}

#[test]
fn a_timeout_past_what_a_duration_holds_is_lowered_not_a_panic() {
    let (d, m) = (limits(10, 128, 8), limits(60, 512, 100));
    let asked = json!({"timeout_seconds": 1e300, "memory_mib": u64::MAX});
    let (got, clamped) = apply(&d, &m, Some(&asked)).unwrap();
    assert_eq!(got.wall_timeout(), Duration::from_secs(60));
    assert_eq!(got.memory_bytes(), 512 << 20);
    assert_eq!(clamped.len(), 2);
}

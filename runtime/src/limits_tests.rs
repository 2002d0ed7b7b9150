use std::time::Duration;

use super::*;

#[test]
fn defaults_match_the_documented_table() {
    let l = Limits::default();
    assert_eq!(l.wall_timeout(), Duration::from_secs(30));
    assert_eq!(l.memory_bytes(), 256 * 1024 * 1024);
    assert_eq!(l.max_output_bytes(), 64 * 1024);
    assert_eq!(l.max_tool_calls(), 100);
    assert_eq!(l.fuel(), None);
    assert_eq!(Limits::builder().build().unwrap(), l);
}

#[test]
fn zero_timeouts_are_rejected() {
    let e = Limits::builder()
        .wall_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(e.field(), "wall_timeout");
    let e = Limits::builder()
        .tool_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(e.field(), "tool_timeout");
}

#[test]
fn memory_out_of_range_is_rejected() {
    for bytes in [0, 1024, MAX_MEMORY_BYTES + 1] {
        let e = Limits::builder().memory_bytes(bytes).build().unwrap_err();
        assert_eq!(e.field(), "memory_bytes", "{bytes}");
        assert!(e.to_string().contains("between"), "{e}");
    }
}

#[test]
fn zero_fuel_and_zero_caps_are_rejected() {
    assert_eq!(
        Limits::builder().fuel(Some(0)).build().unwrap_err().field(),
        "fuel"
    );
    let e = Limits::builder().max_value_bytes(0).build().unwrap_err();
    assert_eq!(e.field(), "max_value_bytes");
    // A zero output cap and a zero call ceiling are meaningful: keep nothing, call nothing.
    Limits::builder()
        .max_output_bytes(0)
        .max_tool_calls(0)
        .build()
        .unwrap();
}

#[test]
fn serde_validates_and_names_unknown_fields() {
    let ok: Limits = serde_json::from_str(r#"{"wall_timeout": "2s", "fuel": 5}"#).unwrap();
    assert_eq!(ok.wall_timeout(), Duration::from_secs(2));
    assert_eq!(ok.fuel(), Some(5));
    let bad = serde_json::from_str::<Limits>(r#"{"wall_timeout": "0s"}"#).unwrap_err();
    assert!(bad.to_string().contains("wall_timeout"), "{bad}");
    let typo = serde_json::from_str::<Limits>(r#"{"wall_timout": "2s"}"#).unwrap_err();
    assert!(typo.to_string().contains("wall_timout"), "{typo}");
    let round: Limits = serde_json::from_str(&serde_json::to_string(&ok).unwrap()).unwrap();
    assert_eq!(round, ok);
}

#[test]
fn the_field_list_is_the_serialized_builders_in_order() {
    let builder = serde_json::to_value(LimitsBuilder::default()).unwrap();
    let serialized: Vec<&str> = builder
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut listed = LimitsBuilder::FIELDS.to_vec();
    let mut sorted = serialized.clone();
    listed.sort_unstable();
    sorted.sort_unstable();
    assert_eq!(listed, sorted);
}

#[test]
fn clamp_to_lowers_each_field_above_the_maxima_and_names_it() {
    let maxima = Limits::builder()
        .wall_timeout(Duration::from_secs(10))
        .max_files(5)
        .fuel(Some(1000))
        .build()
        .unwrap();
    let mut asked = Limits::builder()
        .wall_timeout(Duration::from_secs(60))
        .max_files(3);
    assert_eq!(asked.clamp_to(&maxima), ["wall_timeout", "fuel"]);
    let got = asked.build().unwrap();
    assert_eq!(got.wall_timeout(), Duration::from_secs(10));
    assert_eq!(got.max_files(), 3);
    assert_eq!(got.fuel(), Some(1000), "unmetered is above a fuel maximum");
    assert_eq!(got.first_above(&maxima), None);
    let unfueled = Limits::builder()
        .wall_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(unfueled.first_above(&maxima), Some("fuel"));
    assert_eq!(
        got.first_above(&unfueled),
        None,
        "no fuel maximum allows any"
    );
    let big = Limits::builder()
        .wall_timeout(Duration::from_secs(99))
        .build()
        .unwrap();
    assert_eq!(big.first_above(&Limits::default()), Some("wall_timeout"));
}

use std::time::Duration;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn durations_with_every_unit() {
    assert_eq!(parse_duration("500ms"), Ok(ms(500)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
    assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
}

#[test]
fn durations_with_fractions_are_exact() {
    assert_eq!(parse_duration("1.5s"), Ok(ms(1_500)));
    assert_eq!(parse_duration("0.001s"), Ok(ms(1)));
    assert_eq!(parse_duration(".25s"), Ok(ms(250)));
    assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("0.1h"), Ok(Duration::from_secs(360)));
    // Digits finer than a nanosecond are truncated.
    assert_eq!(parse_duration("1.0000000019s"), Ok(Duration::new(1, 1)));
}

#[test]
fn durations_allow_surrounding_and_inner_whitespace() {
    assert_eq!(parse_duration(" 10s "), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("10 ms"), Ok(ms(10)));
}

#[test]
fn zero_duration_is_accepted_by_the_parser() {
    assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
}

#[test]
fn bare_number_needs_a_unit() {
    let err = parse_duration("5").unwrap_err();
    assert!(err.message().contains("`5`"), "{err}");
    assert!(err.message().contains("unit is required"), "{err}");
    assert!(err.message().contains("5s"), "{err}");
}

#[test]
fn bad_durations_name_the_input() {
    for (input, reason) in [
        ("-5s", "negative"),
        ("", "expected a number"),
        ("abc", "expected a number"),
        ("s", "expected a number"),
        ("1.2.3s", "expected a number"),
        ("5 parsecs", "unknown unit `parsecs`"),
        ("5S", "unknown unit `S`"),
        ("1e3s", "unknown unit `e3s`"),
        ("5s5", "unknown unit `s5`"),
    ] {
        let err = parse_duration(input).unwrap_err();
        assert!(
            err.message().contains(&format!("`{input}`")),
            "{input:?}: {err}"
        );
        assert!(err.message().contains(reason), "{input:?}: {err}");
    }
}

#[test]
fn durations_take_one_number_and_one_of_six_units() {
    // Spellings other duration parsers accept; `M` (a month elsewhere) beside `m` a minute is
    // the dangerous one.
    for (input, unit) in [
        ("1M", "M"),
        ("2d", "d"),
        ("1w", "w"),
        ("1y", "y"),
        ("5sec", "sec"),
        ("5 seconds", "seconds"),
        ("1h 30m", "h 30m"),
        ("250µs", "µs"),
    ] {
        let err = parse_duration(input).unwrap_err();
        assert!(
            err.message().contains(&format!("`{input}`")),
            "{input:?}: {err}"
        );
        assert!(
            err.message().contains(&format!("unknown unit `{unit}`")),
            "{input:?}: {err}"
        );
    }
}

#[test]
fn duration_fractions_finer_than_a_nanosecond_truncate_in_every_unit() {
    assert_eq!(parse_duration("0.0000000000001h"), Ok(Duration::ZERO));
    assert_eq!(
        parse_duration("1.0000015us"),
        Ok(Duration::from_nanos(1_000))
    );
    assert_eq!(parse_duration(".5ms"), Ok(Duration::from_micros(500)));
}

#[test]
fn duration_overflow_is_rejected() {
    for input in [
        "18446744073709551616s",
        "99999999999999999999999h",
        "999999999999999999999999999999999999999999ns",
    ] {
        let err = parse_duration(input).unwrap_err();
        assert!(err.message().contains("too large"), "{input}: {err}");
    }
    // The largest whole number of seconds still fits.
    assert_eq!(
        parse_duration("18446744073709551615s"),
        Ok(Duration::from_secs(u64::MAX))
    );
}

#[test]
fn sizes_in_bytes_and_binary_units() {
    assert_eq!(parse_size("1024"), Ok(1024));
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(parse_size("512B"), Ok(512));
    assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
    assert_eq!(parse_size("256MiB"), Ok(256 << 20));
    assert_eq!(parse_size("2GiB"), Ok(2 << 30));
    assert_eq!(parse_size("1TiB"), Ok(1 << 40));
    assert_eq!(parse_size("4K"), Ok(4096));
    assert_eq!(parse_size("4M"), Ok(4 << 20));
    assert_eq!(parse_size("1G"), Ok(1 << 30));
}

#[test]
fn sizes_in_decimal_units() {
    assert_eq!(parse_size("10KB"), Ok(10_000));
    assert_eq!(parse_size("10MB"), Ok(10_000_000));
    assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
}

#[test]
fn size_units_are_case_insensitive() {
    assert_eq!(parse_size("64kib"), Ok(64 * 1024));
    assert_eq!(parse_size("64KIB"), Ok(64 * 1024));
    assert_eq!(parse_size("1mb"), Ok(1_000_000));
    assert_eq!(parse_size("1m"), Ok(1 << 20));
    assert_eq!(parse_size("8b"), Ok(8));
    assert_eq!(parse_size(" 1 MiB "), Ok(1 << 20));
}

#[test]
fn size_fractions_must_be_whole_bytes() {
    assert_eq!(parse_size("1.5KiB"), Ok(1536));
    assert_eq!(parse_size("0.5MiB"), Ok(512 * 1024));
    assert_eq!(parse_size("1.50000000000000000000KiB"), Ok(1536));
    let err = parse_size("1.5B").unwrap_err();
    assert!(err.message().contains("whole number of bytes"), "{err}");
    let err = parse_size("1.0001KiB").unwrap_err();
    assert!(err.message().contains("whole number of bytes"), "{err}");
}

#[test]
fn sizes_are_exact_where_a_float_is_not() {
    // As an f64 the number is 18014398509481984, and the product overflows.
    assert_eq!(
        parse_size("18014398509481983.5KiB"),
        Ok(18_446_744_073_709_551_104)
    );
    assert_eq!(parse_size("9007199254740993"), Ok(9_007_199_254_740_993));
    assert_eq!(parse_size("0.1KB"), Ok(100));
}

#[test]
fn bad_sizes_name_the_input() {
    for (input, reason) in [
        ("-1KiB", "negative"),
        ("", "expected a number"),
        ("lots", "expected a number"),
        ("KiB", "expected a number"),
        ("12 parsecs", "unknown unit `parsecs`"),
        ("1KiBB", "unknown unit `KiBB`"),
    ] {
        let err = parse_size(input).unwrap_err();
        assert!(
            err.message().contains(&format!("`{input}`")),
            "{input:?}: {err}"
        );
        assert!(err.message().contains(reason), "{input:?}: {err}");
    }
}

#[test]
fn size_overflow_is_rejected() {
    assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    for input in [
        "18446744073709551616",
        "16777216TiB",
        "99999999999999999999999999999999999999999999",
    ] {
        let err = parse_size(input).unwrap_err();
        assert!(err.message().contains("too large"), "{input}: {err}");
    }
}

#[test]
fn format_duration_picks_the_largest_exact_unit() {
    assert_eq!(format_duration(Duration::ZERO), "0s");
    assert_eq!(format_duration(Duration::from_secs(30)), "30s");
    assert_eq!(format_duration(ms(1_500)), "1.5s");
    assert_eq!(format_duration(ms(250)), "250ms");
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    assert_eq!(format_duration(Duration::from_secs(7_200)), "2h");
    assert_eq!(format_duration(Duration::from_micros(250)), "250us");
    assert_eq!(
        format_duration(Duration::from_nanos(1_234_567)),
        "1234.567us"
    );
    assert_eq!(format_duration(Duration::from_nanos(17)), "17ns");
}

#[test]
fn format_size_picks_the_largest_exact_unit() {
    assert_eq!(format_size(0), "0B");
    assert_eq!(format_size(1000), "1000B");
    assert_eq!(format_size(64 * 1024), "64KiB");
    assert_eq!(format_size(256 << 20), "256MiB");
    assert_eq!(format_size(16 << 20), "16MiB");
    assert_eq!(format_size(1536), "1.5KiB");
    assert_eq!(format_size(1025), "1025B");
    assert_eq!(format_size(1_049_600), "1025KiB");
    assert_eq!(format_size(3 << 30), "3GiB");
    assert_eq!(format_size(u64::MAX), "18446744073709551615B");
}

#[test]
fn formatted_values_parse_back() {
    for d in [
        Duration::from_secs(30),
        ms(1_500),
        ms(250),
        Duration::from_secs(90),
        Duration::from_secs(3_600),
        Duration::from_nanos(1_234_567),
        Duration::new(5, 1),
    ] {
        assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{d:?}");
    }
    for n in [
        0,
        1,
        1000,
        1025,
        1536,
        64 << 10,
        256 << 20,
        1 << 40,
        u64::MAX,
    ] {
        assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
    }
}

#[test]
fn unit_error_is_an_error() {
    fn takes_error(_: &dyn std::error::Error) {}
    let err = parse_size("x").unwrap_err();
    takes_error(&err);
    assert_eq!(err.to_string(), err.message());
}

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn parse_str(text: &str) -> Result<Value, JsonError> {
    parse(text.as_bytes(), MAX_DEPTH)
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// The float a JSON text holds, as its bits.
fn bits(text: &str) -> u64 {
    parse_str(text).unwrap().as_f64().unwrap().to_bits()
}

#[test]
fn floats_the_default_parser_rounds_wrongly_come_back_exact() {
    // Found by the issue's program and by the frame fuzzer: one ULP off before.
    for f in [
        -7.312_715_117_751_976e-237,
        8.888_888_888_888_888e60,
        5e-324,                     // the smallest subnormal
        2.225_073_858_507_201e-308, // the largest subnormal
        2.225_073_858_507_201_4e-308,
        f64::MAX,
        f64::MIN_POSITIVE,
        -0.0,
    ] {
        for text in [format!("{f:?}"), format!("{f:e}"), format!("{f:E}")] {
            assert_eq!(bits(&text), f.to_bits(), "{text}");
        }
    }
    // As CPython writes them: an explicit exponent sign.
    assert_eq!(
        bits("-7.312715117751976e-237"),
        (-7.312_715_117_751_976e-237f64).to_bits()
    );
    assert_eq!(bits("1e+21"), 1e21f64.to_bits());
    assert_eq!(bits("-0.0"), (-0.0f64).to_bits());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// Every finite float, from its bits (so every exponent, subnormals and both zeros),
    /// written the two ways a shortest repr can be written.
    #[test]
    fn every_finite_float_reads_back_bit_for_bit(raw in any::<u64>()) {
        let f = f64::from_bits(raw);
        prop_assume!(f.is_finite());
        for text in [format!("{f:?}"), format!("{f:e}")] {
            prop_assert_eq!(bits(&text), raw, "{}", text);
        }
    }

    /// Every 64-bit integer reads back exact, signed or not.
    #[test]
    fn every_64_bit_integer_is_exact(n in any::<i64>(), u in any::<u64>()) {
        prop_assert_eq!(parse_str(&n.to_string()).unwrap().as_i64(), Some(n));
        prop_assert_eq!(parse_str(&u.to_string()).unwrap().as_u64(), Some(u));
    }

    /// Past the 64-bit range an integer is refused, never rounded.
    #[test]
    fn integers_past_64_bits_are_refused(extra in 1u128..=u128::from(u64::MAX), negative: bool) {
        let text = if negative {
            format!("-{}", (1u128 << 63) + extra)
        } else {
            format!("{}", u128::from(u64::MAX) + extra)
        };
        prop_assert_eq!(
            parse_str(&format!("{{\"n\": [{text}]}}")),
            Err(JsonError::IntegerOutOfRange(text.clone()))
        );
    }
}

#[test]
fn the_64_bit_range_ends_exactly_where_it_should() {
    assert_eq!(parse_str("-9223372036854775808").unwrap(), json!(i64::MIN));
    assert_eq!(parse_str("18446744073709551615").unwrap(), json!(u64::MAX));
    for text in [
        "18446744073709551616",
        "-9223372036854775809",
        "1180591620717411303425",
    ] {
        assert_eq!(
            parse_str(text),
            Err(JsonError::IntegerOutOfRange(text.into()))
        );
    }
    // A float with many digits is a float, not an integer out of range.
    assert_eq!(
        parse_str("1180591620717411303425.0").unwrap(),
        json!(1.1805916207174113e21)
    );
    assert!(parse_str("1e400").is_err(), "infinity is not JSON");
}

#[test]
fn long_integers_are_shortened_in_the_error() {
    let text = format!("1{}", "0".repeat(1000));
    let Err(JsonError::IntegerOutOfRange(shown)) = parse_str(&text) else {
        panic!("not refused");
    };
    assert!(shown.len() < 60, "{shown}");
    assert!(shown.ends_with("(1001 digits)"), "{shown}");
    let message = JsonError::IntegerOutOfRange(shown).to_string();
    assert!(message.contains("-2**63 to 2**64-1"), "{message}");
    assert_eq!(
        JsonError::TooDeep(3).to_string(),
        "arrays and objects nest deeper than 3 levels"
    );
}

#[test]
fn digits_inside_strings_are_text() {
    let v = parse_str(r#"{"123456789012345678901234567890": "99999999999999999999999 \" 99999999999999999999999 \\", "n": 1}"#)
        .unwrap();
    assert_eq!(v["n"], json!(1));
    // A bracket inside a string does not count as nesting.
    let deep_text = format!("[\"{}\"]", "[".repeat(10_000));
    assert!(parse_str(&deep_text).is_ok());
}

#[test]
fn nesting_is_bounded_where_the_caller_says() {
    assert!(parse_str(&nested(MAX_DEPTH)).unwrap().is_array());
    assert_eq!(
        parse_str(&nested(MAX_DEPTH + 1)),
        Err(JsonError::TooDeep(MAX_DEPTH))
    );
    let objects = format!("{}1{}", "{\"a\":".repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
    assert!(parse_str(&objects).is_ok());
    let objects = format!("{{\"b\":{objects}}}");
    assert_eq!(parse_str(&objects), Err(JsonError::TooDeep(MAX_DEPTH)));
    // Depth counts what is open at once, not how many containers there are.
    let wide = format!("[{}]", vec![nested(MAX_DEPTH - 1); 100].join(","));
    assert!(parse_str(&wide).is_ok());
    assert_eq!(parse(b"[[[]]]", 2), Err(JsonError::TooDeep(2)));
    assert_eq!(check_nesting(b"[[[]]]", 2), Err(JsonError::TooDeep(2)));
    assert_eq!(check_nesting(b"[[1e999999999999999999999]]", 2), Ok(()));
}

#[test]
fn hostile_depth_is_refused_before_anything_recurses() {
    // Ten million brackets: refused by the scan, with no stack to speak of.
    let text = "[".repeat(10_000_000);
    let refused = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || parse(text.as_bytes(), MAX_DEPTH))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(refused, Err(JsonError::TooDeep(MAX_DEPTH)));
}

#[test]
fn a_value_at_the_bound_parses_in_a_small_stack() {
    // The broker parses tool arguments on a run's fiber, which leaves host functions 2 MiB.
    let text = format!(
        "{}1{}",
        "[{\"k\":".repeat(MAX_DEPTH / 2),
        "}]".repeat(MAX_DEPTH / 2)
    );
    let parsed = std::thread::Builder::new()
        .stack_size(512 * 1024)
        .spawn(move || parse(text.as_bytes(), MAX_DEPTH).map(|v| v.to_string().len()))
        .unwrap()
        .join()
        .unwrap();
    assert!(parsed.is_ok(), "{parsed:?}");
}

#[test]
fn invalid_text_is_a_syntax_error() {
    for text in [
        "",
        "[",
        "[1,]",
        "{\"a\" 1}",
        "1 2",
        "\"unterminated",
        "-",
        "01",
        "[1-2]",
    ] {
        assert_eq!(parse_str(text), Err(JsonError::Syntax), "{text:?}");
    }
    // Depth is checked first even when the text is broken further on.
    assert_eq!(
        parse_str(&format!("{} oops", "[".repeat(MAX_DEPTH + 1))),
        Err(JsonError::TooDeep(MAX_DEPTH))
    );
}

use serde_json::{Value, json};

use crate::{ToolError, ToolRegistry};

async fn call(namespace: &str, name: &str, args: Value) -> Result<Value, ToolError> {
    let registry = ToolRegistry::with_builtins();
    let tool = registry
        .get(namespace, name)
        .unwrap_or_else(|| panic!("{namespace}.{name} is registered"));
    let Value::Object(args) = args else {
        panic!("test arguments must be an object");
    };
    tool.call(args).await
}

async fn math(name: &str, a: Value, b: Value) -> Result<Value, ToolError> {
    call("math", name, json!({ "a": a, "b": b })).await
}

fn invalid(message: &str) -> Result<Value, ToolError> {
    Err(ToolError::InvalidArguments(message.to_owned()))
}

fn failed(message: &str) -> Result<Value, ToolError> {
    Err(ToolError::Failed(message.to_owned()))
}

#[test]
fn registers_every_builtin_once() {
    let registry = ToolRegistry::with_builtins();
    let names: Vec<String> = registry
        .iter()
        .map(|t| format!("{}.{}", t.namespace(), t.name()))
        .collect();
    assert_eq!(
        names,
        [
            "math.add",
            "math.divide",
            "math.multiply",
            "math.subtract",
            "text.echo"
        ]
    );
    let mut again = registry.clone();
    assert_eq!(
        super::register_all(&mut again),
        Err(crate::RegistryError::Duplicate("math.add".into()))
    );
}

#[test]
fn every_builtin_has_a_closed_object_schema_and_a_description() {
    for tool in ToolRegistry::with_builtins().iter() {
        let schema = tool.parameters();
        let qualified = format!("{}.{}", tool.namespace(), tool.name());
        assert_eq!(schema["type"], "object", "{qualified}");
        assert_eq!(schema["additionalProperties"], false, "{qualified}");
        let properties = schema["properties"].as_object().expect("properties");
        let required = schema["required"].as_array().expect("required");
        for name in required {
            let name = name.as_str().expect("required names are strings");
            assert!(properties.contains_key(name), "{qualified}: {name}");
        }
        assert_eq!(required.len(), properties.len(), "{qualified}");
        let description = tool.description();
        assert!(!description.is_empty() && !description.contains('\n'));
        assert_eq!(tool.timeout(), None);
    }
}

#[tokio::test]
async fn add_of_numeric_strings_gives_an_integer() {
    // The seed example: add(a="0", b="1") must be the integer 1, not 1.0.
    let result = math("add", json!("0"), json!("1")).await;
    assert_eq!(result, Ok(json!({ "sum": 1 })));
    assert!(result.unwrap()["sum"].is_i64());
}

#[tokio::test]
async fn seed_chain_reaches_fifteen() {
    // sum 1..=5 the way the seed example does: each step converts the result with str().
    let mut total = Value::from("0");
    for i in 1..=5 {
        let result = math("add", total, json!(i.to_string())).await.unwrap();
        total = Value::from(result["sum"].to_string());
    }
    assert_eq!(total, "15");
}

#[tokio::test]
async fn integer_arithmetic_stays_integer() {
    assert_eq!(math("add", json!(2), json!(3)).await, Ok(json!({"sum": 5})));
    assert_eq!(
        math("subtract", json!(2), json!(5)).await,
        Ok(json!({"difference": -3}))
    );
    assert_eq!(
        math("multiply", json!(-4), json!("6")).await,
        Ok(json!({"product": -24}))
    );
    assert_eq!(
        math("divide", json!(12), json!(4)).await,
        Ok(json!({"quotient": 3}))
    );
}

#[tokio::test]
async fn strings_may_carry_whitespace_signs_and_fractions() {
    assert_eq!(
        math("add", json!(" 12 "), json!("-3.5")).await,
        Ok(json!({"sum": 8.5}))
    );
    assert_eq!(
        math("add", json!("+1"), json!("\t2\n")).await,
        Ok(json!({"sum": 3}))
    );
    assert_eq!(
        math("multiply", json!("1e3"), json!(2)).await,
        Ok(json!({"product": 2000.0}))
    );
}

#[tokio::test]
async fn any_float_input_gives_a_float() {
    let result = math("add", json!(1.0), json!(2)).await.unwrap();
    assert_eq!(result, json!({"sum": 3.0}));
    assert!(result["sum"].is_f64());
    let result = math("multiply", json!("2.0"), json!(3)).await.unwrap();
    assert!(result["product"].is_f64());
}

#[tokio::test]
async fn divide_is_an_integer_only_when_exact() {
    assert_eq!(
        math("divide", json!(7), json!(2)).await,
        Ok(json!({"quotient": 3.5}))
    );
    assert_eq!(
        math("divide", json!(-9), json!(3)).await,
        Ok(json!({"quotient": -3}))
    );
    assert_eq!(
        math("divide", json!(1), json!(3)).await,
        Ok(json!({"quotient": 1.0 / 3.0}))
    );
    let result = math("divide", json!(6.0), json!(3)).await.unwrap();
    assert!(result["quotient"].is_f64());
}

#[tokio::test]
async fn division_by_zero_fails() {
    for (a, b) in [
        (json!(1), json!(0)),
        (json!(1.5), json!(0)),
        (json!(1), json!(0.0)),
        (json!(0), json!("-0.0")),
        (json!(0), json!("0")),
    ] {
        assert_eq!(
            math("divide", a.clone(), b.clone()).await,
            failed("division by zero"),
            "{a} / {b}"
        );
    }
}

#[tokio::test]
async fn integer_overflow_falls_back_to_float() {
    let result = math("add", json!(i64::MAX), json!(1)).await.unwrap();
    assert_eq!(result, json!({"sum": 9_223_372_036_854_775_808.0}));
    let result = math("multiply", json!(i64::MIN), json!(-1)).await.unwrap();
    assert!(result["product"].is_f64());
    let result = math("divide", json!(i64::MIN), json!(-1)).await.unwrap();
    assert_eq!(result, json!({"quotient": 9_223_372_036_854_775_808.0}));
    let result = math("subtract", json!(i64::MIN), json!(1)).await.unwrap();
    assert!(result["difference"].is_f64());
    // Integers beyond i64 are read as floats, from JSON and from strings.
    let result = math("add", json!(u64::MAX), json!(0)).await.unwrap();
    assert!(result["sum"].is_f64());
    let result = math("add", json!("99999999999999999999"), json!(0))
        .await
        .unwrap();
    assert_eq!(result, json!({"sum": 1e20}));
}

#[tokio::test]
async fn non_finite_results_fail() {
    assert_eq!(
        math("multiply", json!(1e308), json!(10)).await,
        failed("result is not a finite number")
    );
    assert_eq!(
        math("add", json!(f64::MAX), json!(f64::MAX)).await,
        failed("result is not a finite number")
    );
}

#[tokio::test]
async fn non_numbers_are_invalid_arguments_naming_the_argument() {
    for bad in [
        json!("abc"),
        json!(""),
        json!("inf"),
        json!("-infinity"),
        json!("NaN"),
        json!("1e999"),
        json!("1 2"),
        json!(true),
        json!(null),
        json!([1]),
        json!({"n": 1}),
    ] {
        assert_eq!(
            math("add", bad.clone(), json!(1)).await,
            invalid("`a` must be a number or a numeric string"),
            "a = {bad}"
        );
        assert_eq!(
            math("add", json!(1), bad.clone()).await,
            invalid("`b` must be a number or a numeric string"),
            "b = {bad}"
        );
    }
}

#[tokio::test]
async fn missing_and_extra_arguments_are_invalid() {
    assert_eq!(
        call("math", "add", json!({"a": 1})).await,
        invalid("missing argument `b`")
    );
    assert_eq!(
        call("math", "divide", json!({})).await,
        invalid("missing argument `a`")
    );
    assert_eq!(
        call("math", "add", json!({"a": 1, "b": 2, "c": 3})).await,
        invalid("unexpected argument `c`")
    );
    let long = "x".repeat(1_000);
    let err = call("math", "add", json!({"a": 1, "b": 2, long.clone(): 3}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::InvalidArguments(format!("unexpected argument `{}`", &long[..64]))
    );
}

#[tokio::test]
async fn echo_returns_its_text() {
    assert_eq!(
        call("text", "echo", json!({"text": "héllo\n"})).await,
        Ok(json!({"text": "héllo\n"}))
    );
    assert_eq!(
        call("text", "echo", json!({"text": ""})).await,
        Ok(json!({"text": ""}))
    );
}

#[tokio::test]
async fn echo_rejects_bad_arguments() {
    assert_eq!(
        call("text", "echo", json!({"text": 5})).await,
        invalid("`text` must be a string")
    );
    assert_eq!(
        call("text", "echo", json!({})).await,
        invalid("missing argument `text`")
    );
    assert_eq!(
        call("text", "echo", json!({"text": "a", "loud": true})).await,
        invalid("unexpected argument `loud`")
    );
}

use super::*;

#[test]
fn a_result_renders_to_the_output_schema_shape() {
    let schema = crate::schema::run_output();
    let properties: std::collections::BTreeSet<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let store = crate::SuspendedRuns::default();
    let result = RunResult::builder("wasm", Ok(json!(15))).build();
    let out = output(Reply::settle(&store, result, Vec::new(), None, Vec::new(), None).unwrap());
    assert!(!out.is_error);
    assert_eq!(out.structured["value"], 15);
    assert_eq!(out.text, "ok\nvalue: 15\n");
    let error = RunError::new(ErrorKind::Busy, "full");
    let failed = output(Reply::failed("wasm", error));
    assert!(failed.is_error);
    assert_eq!(failed.structured["error"]["kind"], "busy");
    for out in [out, failed] {
        let keys: std::collections::BTreeSet<&str> = out
            .structured
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, properties, "every field, and only the schema's");
    }
}

use super::*;

#[test]
fn base64_files_decode_and_bad_ones_name_the_file() {
    let files = decode_files(&json!({"a.txt": "aGk=", "b.bin": ""})).unwrap();
    assert_eq!(files.len(), 2);
    for (value, needle) in [
        (json!({"a.txt": "!!"}), "file `a.txt`"),
        (json!({"a.txt": 3}), "file `a.txt`"),
        (json!(["a.txt"]), "`files` must be an object"),
    ] {
        let e = decode_files(&value).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(e.message.contains(needle), "{value}: {}", e.message);
    }
}

#[test]
fn a_session_id_is_a_string_or_absent() {
    let object = |v: Value| v.as_object().unwrap().clone();
    assert_eq!(session_id(&object(json!({}))).unwrap(), None);
    assert_eq!(
        session_id(&object(json!({"session_id": null}))).unwrap(),
        None
    );
    let id = session_id(&object(json!({"session_id": "abc"})))
        .unwrap()
        .unwrap();
    assert_eq!(id.as_str(), "abc");
    let e = session_id(&object(json!({"session_id": 1}))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
}

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
    let out = output(Reply::settle(&store, result, Vec::new(), None, Vec::new()).unwrap());
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

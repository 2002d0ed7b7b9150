use super::*;

#[test]
fn base64_files_decode_and_bad_ones_name_the_file() {
    let files = decode_files(&serde_json::json!({"a.txt": "aGk=", "b.bin": ""})).unwrap();
    assert_eq!(files.len(), 2);
    for (value, needle) in [
        (serde_json::json!({"a.txt": "!!"}), "file `a.txt`"),
        (serde_json::json!({"a.txt": 3}), "file `a.txt`"),
        (serde_json::json!(["a.txt"]), "`files` must be an object"),
    ] {
        let e = decode_files(&value).unwrap_err();
        assert!(matches!(e, InputError::Input(_)), "{value}");
        assert!(e.message().contains(needle), "{value}: {e}");
    }
}

#[test]
fn an_input_error_is_a_runs_invalid_input() {
    for e in [
        InputError::Input("a".into()),
        InputError::Limits("b".into()),
    ] {
        let run: RunError = e.clone().into();
        assert_eq!(run.kind, ErrorKind::InvalidInput);
        assert_eq!(run.message, e.message());
    }
}

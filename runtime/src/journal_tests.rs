use serde_json::json;

use super::*;

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("not an object"),
    }
}

fn call(position: u32, tool: &str, a: Value, result: Value) -> JournalCall {
    JournalCall {
        position,
        tool: tool.into(),
        args: args(a),
        outcome: CallOutcome::Ok(result),
    }
}

#[test]
fn a_signed_journal_verifies_after_a_round_trip_through_its_json_text() {
    let key = JournalKey::generate().unwrap();
    let calls = vec![call(
        0,
        "math.add",
        json!({"b": 2.5, "a": 1}),
        json!({"sum": 3.5}),
    )];
    let journal = Journal::sign(&key, "print(1)", Some(7), calls);
    let text = serde_json::to_string_pretty(&journal).unwrap();
    let back = Journal::from_json(&text).unwrap();
    assert_eq!(back, journal);
    back.verify(&key).unwrap();
    assert_eq!(
        back.verify(&JournalKey::generate().unwrap()),
        Err(JournalError::BadSignature)
    );
}

#[test]
fn any_change_to_a_journal_breaks_its_signature_but_reordering_keys_does_not() {
    let key = JournalKey::generate().unwrap();
    let calls = vec![call(
        0,
        "math.add",
        json!({"a": 1, "b": 2}),
        json!({"sum": 3}),
    )];
    let journal = Journal::sign(&key, "code", None, calls);
    let mut forged = journal.clone();
    forged.calls[0].outcome = CallOutcome::Ok(json!({"sum": 4}));
    assert_eq!(forged.verify(&key), Err(JournalError::BadSignature));
    let mut reseeded = journal.clone();
    reseeded.seed = Some(1);
    assert_eq!(reseeded.verify(&key), Err(JournalError::BadSignature));
    let mut reordered = journal.clone();
    reordered.calls[0].args = args(json!({"b": 2, "a": 1}));
    reordered.verify(&key).unwrap();
    let mut bad_mac = journal;
    bad_mac.mac = "not base64!".into();
    assert_eq!(bad_mac.verify(&key), Err(JournalError::BadSignature));
}

/// A suspended state of `code` pending at `fx.send`, not yet signed, its `mac` field `mac`.
fn unsigned_state(mac: String) -> Suspended {
    Suspended {
        version: 0,
        id: String::new(),
        suspended_at: 0,
        code: "code".into(),
        vars: Map::new(),
        files: Vec::new(),
        seed: None,
        calls: Vec::new(),
        pending: PendingCall {
            position: 0,
            tool: "fx.send".into(),
            args: Map::new(),
            reason: "r".into(),
        },
        tools: Vec::new(),
        approve: Vec::new(),
        limits: None,
        mac,
    }
}

#[test]
fn a_journal_signature_does_not_verify_a_suspended_state_and_other_versions_are_refused() {
    let key = JournalKey::generate().unwrap();
    let journal = Journal::sign(&key, "code", None, Vec::new());
    let state = Suspended::sign(&key, unsigned_state(journal.mac.clone()));
    assert_ne!(state.mac, journal.mac);
    state.verify(&key).unwrap();
    let mut other = journal;
    other.version = 2;
    assert!(matches!(
        other.verify(&key),
        Err(JournalError::Malformed(_))
    ));
    assert!(matches!(
        Journal::from_json(&serde_json::to_string(&other).unwrap()),
        Err(JournalError::Malformed(m)) if m.contains("version 2")
    ));
    // A run result that holds the state reads as the state.
    let result = json!({"ok": false, "suspended": state});
    assert_eq!(Suspended::from_json(&result.to_string()).unwrap(), state);
    let plain = json!({"ok": true, "value": 1});
    assert!(Suspended::from_json(&plain.to_string()).is_err());
}

#[test]
fn replay_answers_matching_calls_then_goes_live_past_the_journal() {
    let replay = vec![call(0, "math.add", json!({"a": 1}), json!(2))];
    let journal = CallJournal::new(replay, None, OnDivergence::Fail, Vec::new());
    match journal.begin("math.add", &args(json!({"a": 1})), false) {
        Step::Answer(Ok(text)) => assert_eq!(text, "2"),
        other => panic!("{other:?}"),
    }
    match journal.begin("math.add", &args(json!({"a": 2})), false) {
        Step::Call { position: 1 } => {}
        other => panic!("{other:?}"),
    }
    journal.record(1, "math.add".into(), args(json!({"a": 2})), &Ok("3".into()));
    let calls = journal.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].outcome, CallOutcome::Ok(json!(3)));
    assert!(journal.halt().is_none());
}

#[test]
fn a_call_that_differs_from_the_journal_halts_naming_both_or_goes_live_when_asked() {
    let replay = vec![call(0, "math.add", json!({"a": 1}), json!(2))];
    let failing = CallJournal::new(replay.clone(), None, OnDivergence::Fail, Vec::new());
    assert!(matches!(
        failing.begin("math.mul", &args(json!({"a": 1})), false),
        Step::Halt
    ));
    match failing.halt() {
        Some(Halt::Diverged(message)) => {
            assert!(message.contains("`math.mul`"), "{message}");
            assert!(message.contains("`math.add`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let live = CallJournal::new(replay, None, OnDivergence::GoLive, Vec::new());
    assert!(matches!(
        live.begin("math.add", &args(json!({"a": 5})), false),
        Step::Call { position: 0 }
    ));
    assert!(live.halt().is_none());
}

#[test]
fn an_approval_gated_call_halts_and_a_decision_answers_it_at_its_position() {
    let fresh = CallJournal::new(Vec::new(), None, OnDivergence::Fail, Vec::new());
    assert!(matches!(
        fresh.begin("fx.send", &args(json!({"to": "a"})), true),
        Step::Halt
    ));
    let Some(Halt::Suspended(pending)) = fresh.halt() else {
        panic!("not suspended");
    };
    assert_eq!((pending.position, pending.tool.as_str()), (0, "fx.send"));
    // Later calls of a halted run are not answered.
    assert!(matches!(
        fresh.begin("math.add", &Map::new(), false),
        Step::Halt
    ));

    let denied = CallJournal::new(
        Vec::new(),
        Some((pending.clone(), Decision::Deny)),
        OnDivergence::Fail,
        Vec::new(),
    );
    match denied.begin("fx.send", &args(json!({"to": "a"})), true) {
        Step::Answer(Err(CallError::Denied(m))) => assert!(m.contains("denied"), "{m}"),
        other => panic!("{other:?}"),
    }
    let answered = CallJournal::new(
        Vec::new(),
        Some((pending.clone(), Decision::Answer(json!({"id": 9})))),
        OnDivergence::Fail,
        Vec::new(),
    );
    match answered.begin("fx.send", &args(json!({"to": "a"})), true) {
        Step::Answer(Ok(text)) => assert_eq!(text, r#"{"id":9}"#),
        other => panic!("{other:?}"),
    }
    // A second call of the gated tool waits again.
    assert!(matches!(
        answered.begin("fx.send", &args(json!({"to": "b"})), true),
        Step::Halt
    ));
    let approved = CallJournal::new(
        Vec::new(),
        Some((pending, Decision::Approve)),
        OnDivergence::Fail,
        vec!["fx.other".into()],
    );
    assert!(matches!(
        approved.begin("fx.send", &args(json!({"to": "a"})), true),
        Step::Call { position: 0 }
    ));
    // A resumed run's own approvals hold beyond the policy's.
    assert!(matches!(
        approved.begin("fx.other", &Map::new(), false),
        Step::Halt
    ));
}

#[test]
fn a_key_file_is_made_private_once_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/journal.key");
    let key = JournalKey::load_or_create(&path).unwrap();
    let again = JournalKey::load_or_create(&path).unwrap();
    Journal::sign(&key, "code", None, Vec::new())
        .verify(&again)
        .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    std::fs::write(&path, "c2hvcnQ\n").unwrap();
    assert!(matches!(
        JournalKey::load_or_create(&path),
        Err(JournalError::Key(m)) if m.contains("at least 32 bytes")
    ));
}

/// Issue 37, hole 9: a key file others may read is refused, naming the fix.
#[cfg(unix)]
#[test]
fn a_key_file_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.key");
    JournalKey::load_or_create(&path).unwrap();
    for mode in [0o644, 0o640, 0o602] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match JournalKey::load_or_create(&path) {
            Err(JournalError::Key(m)) => {
                assert!(m.contains(&format!("mode {mode:03o}")), "{m}");
                assert!(m.contains("chmod 600"), "{m}");
            }
            other => panic!("mode {mode:o}: {other:?}"),
        }
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
    JournalKey::load_or_create(&path).unwrap();
}

#[test]
fn each_suspended_state_gets_its_own_id_and_time_under_the_signature() {
    let key = JournalKey::generate().unwrap();
    let make = || Suspended::sign(&key, unsigned_state(String::new()));
    let (a, b) = (make(), make());
    assert_eq!(a.id.len(), 32);
    assert!(a.id.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a.id, b.id);
    assert!(a.suspended_at > 1_700_000_000, "{}", a.suspended_at);
    let mut older = a.clone();
    older.suspended_at -= 3600;
    assert_eq!(older.verify(&key), Err(JournalError::BadSignature));
    let mut other = a;
    other.id = b.id;
    assert_eq!(other.verify(&key), Err(JournalError::BadSignature));
}

use std::time::Duration;

use pycage::Suspended;

use super::{claim, ledger_of};

const NOW: u64 = 1_800_000_000;

fn state(id: &str, suspended_at: u64) -> Suspended {
    Suspended::from_json(
        &serde_json::json!({
            "version": 1, "id": id, "suspended_at": suspended_at, "code": "x", "vars": {},
            "seed": null, "calls": [],
            "pending": {"position": 0, "tool": "a.b", "args": {}, "reason": "r"},
            "mac": ""
        })
        .to_string(),
    )
    .unwrap()
}

#[test]
fn a_state_is_claimed_once_per_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_of(&dir.path().join("journal.key"));
    assert_eq!(ledger, dir.path().join("journal.key.resumed"));
    let day = Duration::from_secs(86_400);
    let a = state("0123456789abcdef0123456789abcdef", NOW - 60);
    claim(&a, &ledger, day, NOW).unwrap();
    let again = claim(&a, &ledger, day, NOW).unwrap_err();
    assert!(again.contains("resumed before"), "{again}");
    let b = state("fedcba9876543210fedcba9876543210", NOW - 60);
    claim(&b, &ledger, day, NOW).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&ledger).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

#[test]
fn an_old_state_or_one_without_an_id_is_refused_and_not_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("k.resumed");
    let hour = Duration::from_secs(3600);
    let old = state("0123456789abcdef0123456789abcdef", NOW - 3601);
    let e = claim(&old, &ledger, hour, NOW).unwrap_err();
    assert!(e.contains("past --max-age 1h"), "{e}");
    // Within a larger age it goes on: it was not claimed by the refusal.
    claim(&old, &ledger, 2 * hour, NOW).unwrap();
    for (id, at) in [
        ("", NOW),
        ("../../etc/passwd", NOW),
        ("0123456789ABCDEF0123456789abcdeg", NOW),
        ("0123456789abcdef0123456789abcdef", 0),
    ] {
        let e = claim(&state(id, at), &ledger, hour, NOW).unwrap_err();
        assert!(e.contains("no id or time"), "{id:?}: {e}");
    }
}

use super::*;

fn owner() -> Sid {
    Sid::parse("S-1-5-21-1004336348-1177238915-682003330-1001").unwrap()
}

fn container() -> Sid {
    Sid::parse(
        "S-1-15-2-2434737943-167758768-3180539153-984336765-1107280622-3591121930-2677285773",
    )
    .unwrap()
}

/// The ACEs of a descriptor's DACL, as (type, flags, rights, sid).
fn dacl_aces(sddl: &str) -> Vec<(String, String, String, String)> {
    let dacl = sddl
        .strip_prefix("D:P")
        .expect("a protected DACL comes first");
    let dacl = dacl.split("S:").next().unwrap();
    dacl.strip_prefix('(')
        .unwrap()
        .strip_suffix(')')
        .unwrap()
        .split(")(")
        .map(|ace| {
            let f: Vec<&str> = ace.split(';').collect();
            assert_eq!(f.len(), 6, "{ace}");
            assert_eq!((f[3], f[4]), ("", ""), "no object types");
            (f[0].into(), f[1].into(), f[2].into(), f[5].into())
        })
        .collect()
}

#[test]
fn sids_are_checked_so_they_cannot_carry_sddl() {
    assert!(owner().as_str().starts_with("S-1-5-21-"));
    assert!(container().is_app_container());
    assert!(!owner().is_app_container());
    for bad in [
        "",
        "S-1-",
        "S-1-5",
        "S-1-5-",
        "S-1-5--1",
        "S-2-5-21",
        "s-1-5-21",
        "S-1-5-21-1)(A;;FA;;;WD",
        "S-1-5-21-1 ",
        "WD",
        "S-1-5-12345678901",
        "S-1-5-1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16",
    ] {
        assert_eq!(Sid::parse(bad), Err(InvalidSid(bad.into())), "{bad:?}");
    }
    assert!(Sid::parse("S-1-5-18").is_ok(), "SYSTEM is a SID");
}

#[test]
fn the_pipe_grants_the_owner_and_the_container_only() {
    let sddl = pipe_sddl(&owner(), &container());
    assert_eq!(
        dacl_aces(&sddl),
        [
            ("A".into(), "".into(), "FA".into(), owner().to_string()),
            (
                "A".into(),
                "".into(),
                "FRFW".into(),
                container().to_string()
            ),
        ]
    );
    assert!(sddl.ends_with("S:(ML;;NW;;;LW)"), "low label: {sddl}");
}

#[test]
fn the_run_directory_is_read_only_to_the_container() {
    let sddl = run_dir_sddl(&owner(), &container());
    assert_eq!(
        dacl_aces(&sddl),
        [
            ("A".into(), "OICI".into(), "FA".into(), owner().to_string()),
            (
                "A".into(),
                "OICI".into(),
                "FRFX".into(),
                container().to_string()
            ),
        ]
    );
    assert!(
        !sddl.contains("S:"),
        "no label: the guest writes nothing here"
    );
}

#[test]
fn the_working_directory_is_writable_by_the_container() {
    let sddl = work_dir_sddl(&owner(), &container());
    let aces = dacl_aces(&sddl);
    assert_eq!(aces.len(), 2);
    assert_eq!(
        aces[1].2, "FRFWFXSD",
        "modify, not WRITE_DAC or WRITE_OWNER"
    );
    assert_eq!(aces[1].3, container().to_string());
    assert!(sddl.ends_with("S:(ML;OICI;NW;;;LW)"), "{sddl}");
}

#[test]
fn no_group_is_ever_granted() {
    for sddl in [
        pipe_sddl(&owner(), &container()),
        run_dir_sddl(&owner(), &container()),
        work_dir_sddl(&owner(), &container()),
    ] {
        for (kind, _, _, sid) in dacl_aces(&sddl) {
            assert_eq!(kind, "A", "allow entries only");
            assert!(
                sid == owner().as_str() || sid == container().as_str(),
                "{sid}"
            );
        }
    }
}

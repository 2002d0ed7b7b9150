use super::*;

fn profile() -> String {
    render_profile(
        &SeatbeltPolicy::for_home(Path::new("/Users/ada")),
        Path::new("/private/var/folders/xy/pycage-abc"),
    )
}

fn position(p: &str, needle: &str) -> usize {
    p.find(needle)
        .unwrap_or_else(|| panic!("{needle} not in\n{p}"))
}

#[test]
fn the_network_is_denied_except_the_broker_socket() {
    let p = profile();
    let deny = position(&p, "(deny network*)");
    let allow = position(
        &p,
        "(allow network-outbound (remote unix-socket (path-literal \"/private/var/folders/xy/pycage-abc/broker.sock\")))",
    );
    assert!(allow > deny, "the allowance must follow the denial");
    assert_eq!(p.matches("(allow network").count(), 1);
}

#[test]
fn writes_are_denied_outside_the_run_directory() {
    let p = profile();
    let deny = position(&p, "(deny file-write*)");
    let allow = position(
        &p,
        "(allow file-write* (subpath \"/private/var/folders/xy/pycage-abc\") (literal \"/dev/null\"))",
    );
    assert!(allow > deny);
    assert_eq!(p.matches("(allow file-write").count(), 1);
}

#[test]
fn secret_directories_are_unreadable() {
    let p = profile();
    for secret in [
        ".ssh",
        ".aws",
        ".config/gcloud",
        ".azure",
        ".kube",
        ".docker",
        ".gnupg",
        "Library/Keychains",
    ] {
        let path = format!("\"/Users/ada/{secret}\"");
        assert!(
            p.contains(&format!(
                "(deny file-read* (subpath {path}) (literal {path}))"
            )),
            "{secret} readable in\n{p}"
        );
    }
    // No allowance re-opens reads.
    assert!(!p.contains("(allow file-read"));
    let extra = render_profile(
        &SeatbeltPolicy::for_home(Path::new("/h")).deny_read("/opt/creds"),
        Path::new("/r"),
    );
    assert!(extra.contains("(deny file-read* (subpath \"/opt/creds\")"));
}

#[test]
fn paths_are_escaped_in_the_profile() {
    let p = render_profile(
        &SeatbeltPolicy {
            deny_read: vec![PathBuf::from("/h/we\"ird\\dir")],
        },
        Path::new("/r\")(allow network*)"),
    );
    assert!(p.contains("\"/h/we\\\"ird\\\\dir\""), "{p}");
    assert!(!p.contains("\")(allow network*)\n"), "{p}");
    assert!(p.contains("(subpath \"/r\\\")(allow network*)\")"), "{p}");
}

#[test]
fn the_command_applies_rlimits_then_the_profile() {
    let backend = SeatbeltBackend::with_policy(SeatbeltPolicy::for_home(Path::new("/Users/ada")));
    let argv: Vec<_> = backend
        .render(&Limits::default(), Path::new("/private/tmp/pycage-abc"))
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    assert_eq!(argv[0], SH);
    assert_eq!(argv[2], "ulimit -t 31 -n 256 -f 131072 -c 0 && exec \"$@\"");
    assert_eq!(argv[4], SANDBOX_EXEC);
    assert_eq!(argv[5], "-p");
    assert!(argv[6].starts_with("(version 1)"));
    assert_eq!(
        &argv[7..],
        [
            "/usr/bin/python3",
            "-I",
            "-B",
            "/private/tmp/pycage-abc/pycage_socket.py"
        ]
    );
}

#[test]
fn it_is_unavailable_off_macos() {
    if !cfg!(target_os = "macos") {
        let a = SeatbeltBackend::new().availability();
        assert_eq!(
            a,
            Availability::Unavailable(crate::Unavailable::wrong_os(
                "wrong OS: Seatbelt needs macOS"
            ))
        );
    }
}

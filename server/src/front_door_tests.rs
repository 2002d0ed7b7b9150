use axum::http::{HeaderMap, HeaderValue, Uri, header};

use super::{FrontDoor, Refused};

fn door(hosts: &[&str], origins: &[&str]) -> FrontDoor {
    let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    FrontDoor::new(&list(hosts), &list(origins)).unwrap()
}

fn ask(door: &FrontDoor, host: Option<&str>, origin: Option<&str>) -> Result<(), Refused> {
    let mut headers = HeaderMap::new();
    if let Some(host) = host {
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
    }
    if let Some(origin) = origin {
        headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
    }
    door.admit(&Uri::from_static("/v1/runs"), &headers)
}

#[test]
fn loopback_names_and_addresses_pass_and_a_foreign_name_does_not() {
    let d = door(&[], &[]);
    for host in [
        "localhost",
        "localhost:8080",
        "LOCALHOST:1",
        "127.0.0.1:8080",
        "[::1]:8080",
        "10.1.2.3:8080",
    ] {
        assert_eq!(ask(&d, Some(host), None), Ok(()), "{host}");
    }
    for host in [
        "attacker.example:8080",
        "attacker.example",
        "localhost.attacker.example",
        "127.0.0.1.nip.io",
        "localhost.",
    ] {
        assert_eq!(
            ask(&d, Some(host), None),
            Err(Refused::Host(host.to_owned())),
            "{host}"
        );
    }
    assert!(matches!(ask(&d, None, None), Err(Refused::BadHost(_))));
    assert!(matches!(
        ask(&d, Some("user@localhost"), None),
        Err(Refused::BadHost(_))
    ));
}

#[test]
fn a_listed_host_passes_on_any_port_or_only_on_the_one_named() {
    let d = door(&["pycage.svc", "api.example:443"], &[]);
    assert_eq!(ask(&d, Some("pycage.svc"), None), Ok(()));
    assert_eq!(ask(&d, Some("PYCAGE.svc:8080"), None), Ok(()));
    assert_eq!(ask(&d, Some("api.example:443"), None), Ok(()));
    assert!(matches!(
        ask(&d, Some("api.example:8443"), None),
        Err(Refused::Host(_))
    ));
    assert!(matches!(
        ask(&d, Some("api.example"), None),
        Err(Refused::Host(_))
    ));
}

#[test]
fn a_foreign_origin_is_refused_and_a_loopback_or_listed_one_passes() {
    let d = door(
        &[],
        &[
            "https://app.example",
            "http://dev.example:*",
            "http://x.example:8000",
        ],
    );
    for origin in [
        "http://localhost:3000",
        "https://127.0.0.1",
        "http://[::1]:9",
        "https://app.example",
        "https://app.example:443",
        "http://dev.example:1234",
        "http://x.example:8000",
    ] {
        assert_eq!(ask(&d, Some("localhost"), Some(origin)), Ok(()), "{origin}");
    }
    for origin in [
        "http://attacker.example:8080",
        "https://app.example:8443",
        "http://app.example",
        "http://x.example",
        "null",
        "file://",
        "not an origin",
        "http://localhost.attacker.example",
    ] {
        assert!(
            matches!(
                ask(&d, Some("localhost"), Some(origin)),
                Err(Refused::Origin(_))
            ),
            "{origin}"
        );
    }
    assert_eq!(
        ask(&door(&[], &["null"]), Some("localhost"), Some("null")),
        Ok(())
    );
}

#[test]
fn a_malformed_entry_is_a_configuration_error_naming_it() {
    let hosts = |h: &str| FrontDoor::new(&[h.to_owned()], &[]).unwrap_err();
    let origins = |o: &str| FrontDoor::new(&[], &[o.to_owned()]).unwrap_err();
    assert!(hosts("a b").contains("`a b`"));
    assert!(hosts("http://x").contains("allowed_hosts"));
    assert!(origins("app.example").contains("`app.example`"));
    assert!(origins("https://app.example/path").contains("allowed_origins"));
    assert!(origins("https://app.example:443:*").contains("allowed_origins"));
}

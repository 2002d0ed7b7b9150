use super::*;

fn pattern(text: &str) -> HostPattern {
    text.parse().unwrap()
}

fn policy(patterns: &[&str]) -> NetPolicy {
    patterns
        .iter()
        .fold(NetPolicy::new(), |p, text| p.allow(pattern(text)))
}

fn target(url: &str) -> Target {
    target_of(&Url::parse(url).unwrap()).unwrap()
}

#[test]
fn the_default_policy_allows_nothing() {
    let p = NetPolicy::new();
    assert!(p.is_closed());
    assert_eq!(
        p.check_url("https://example.com/").unwrap_err(),
        NetError::NotAllowed("example.com:443".into())
    );
}

#[test]
fn patterns_match_hosts_ports_and_schemes() {
    let p = policy(&[
        "example.com",
        "*.api.test",
        "https://secure.test",
        "data.test:8443",
    ]);
    for ok in [
        "http://example.com/x",
        "https://EXAMPLE.com./x?q",
        "https://example.com:9999/",
        "https://a.api.test/",
        "https://a.b.api.test/",
        "https://secure.test/",
        "https://data.test:8443/",
        "http://data.test:8443/",
    ] {
        p.check_url(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for refused in [
        "https://api.test/",         // *.api.test is its subdomains only
        "https://xapi.test/",        // not a subdomain
        "https://example.com.evil/", // a suffix of the name is not the name
        "https://evilexample.com/",
        "http://secure.test/",      // the pattern says https
        "https://data.test/",       // the pattern says 8443
        "https://sub.example.com/", // exact means exact
    ] {
        assert!(
            matches!(p.check_url(refused), Err(NetError::NotAllowed(_))),
            "{refused}: {:?}",
            p.check_url(refused)
        );
    }
}

#[test]
fn bad_patterns_are_refused_with_the_reason() {
    for bad in [
        "",
        "ftp://example.com",
        "example.com/path",
        "user@example.com",
        "*.",
        "a.*.example.com",
        "*.127.0.0.1",
        "example.com:99999",
    ] {
        assert!(bad.parse::<HostPattern>().is_err(), "{bad:?}");
    }
    assert_eq!(pattern("*.Example.COM").to_string(), "*.example.com");
    assert_eq!(
        pattern("https://[::1]:8080").to_string(),
        "https://[::1]:8080"
    );
    assert_eq!(pattern("127.0.0.1:8080").to_string(), "127.0.0.1:8080");
}

#[test]
fn urls_are_checked_for_scheme_and_credentials() {
    let p = policy(&["example.com"]);
    assert_eq!(
        p.check_url("file:///etc/passwd").unwrap_err(),
        NetError::Scheme("file".into())
    );
    assert_eq!(
        p.check_url("gopher://example.com/").unwrap_err(),
        NetError::Scheme("gopher".into())
    );
    assert!(matches!(p.check_url("not a url"), Err(NetError::BadUrl(_))));
    // `@` in a URL: the host is what follows it, and what precedes it is a user name,
    // refused whatever the host.
    assert_eq!(
        target("https://example.com@evil.test/").host,
        TargetHost::Domain("evil.test".into())
    );
    assert_eq!(
        p.check_url("https://example.com@evil.test/").unwrap_err(),
        NetError::Credentials
    );
    assert_eq!(
        p.check_url("https://user:pw@example.com/").unwrap_err(),
        NetError::Credentials
    );
}

#[test]
fn address_spellings_are_the_address_they_spell() {
    // Decimal, hexadecimal, octal and short forms of 127.0.0.1 parse as it (WHATWG).
    for url in [
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://0x7f.1/",
    ] {
        assert_eq!(
            target(url).host,
            TargetHost::Ip("127.0.0.1".parse().unwrap()),
            "{url}"
        );
        // Not on the allowlist under another name, and internal even when allowed by name.
        let p = policy(&["127.0.0.1"]);
        assert_eq!(
            p.check_url(url).unwrap_err(),
            NetError::Address("127.0.0.1".parse().unwrap()),
            "{url}"
        );
        p.clone()
            .allow_address("127.0.0.1/32".parse().unwrap())
            .check_url(url)
            .unwrap();
    }
    let p = policy(&["[::ffff:127.0.0.1]", "[::1]"]);
    assert!(matches!(
        p.check_url("http://[::ffff:7f00:1]/"),
        Err(NetError::Address(_))
    ));
    assert!(matches!(
        p.check_url("http://[::1]/"),
        Err(NetError::Address(_))
    ));
}

#[test]
fn internal_ranges_are_not_public() {
    for internal in [
        "0.0.0.0",
        "0.1.2.3",
        "127.0.0.1",
        "127.255.255.254",
        "10.0.0.1",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254", // cloud metadata
        "100.64.0.1",
        "100.127.255.255",
        "192.0.0.8",
        "192.0.2.1",
        "198.18.0.1",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "fec0::1",
        "ff02::1",
        "2001:db8::1",
        "2001:0:4136:e378::1", // Teredo
        "::ffff:127.0.0.1",    // IPv4-mapped
        "::ffff:169.254.169.254",
        "::127.0.0.1", // IPv4-compatible
        "::10.0.0.1",
        "64:ff9b::a9fe:a9fe", // NAT64 of 169.254.169.254
        "2002:7f00:1::1",     // 6to4 of 127.0.0.1
        "2002:c0a8:101::",    // 6to4 of 192.168.1.1
        "::ffff:0:7f00:1",    // IPv4-translated 127.0.0.1
        "64:ff9b:1::7f00:1",  // local-use NAT64
        "2001:2::1",          // benchmarking
        "2001:20::1",         // ORCHIDv2
    ] {
        let ip: IpAddr = internal.parse().unwrap();
        assert!(!is_public(ip), "{internal}");
    }
    for public in [
        "1.1.1.1",
        "8.8.8.8",
        "93.184.215.14",
        "172.32.0.1",
        "100.128.0.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
        "::ffff:0:808:808",
        "2001:200::1", // past the IETF assignments of 2001::/23
    ] {
        let ip: IpAddr = public.parse().unwrap();
        assert!(is_public(ip), "{public}");
    }
}

#[test]
fn allowed_ranges_let_internal_addresses_through() {
    let p = NetPolicy::new().allow_address("127.0.0.0/8".parse().unwrap());
    p.check_address("127.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(
        p.check_address("10.0.0.1".parse().unwrap()).unwrap_err(),
        NetError::Address("10.0.0.1".parse().unwrap())
    );
    p.check_address("8.8.8.8".parse().unwrap()).unwrap();
}

#[test]
fn a_run_narrows_the_runners_allowlist_and_cannot_widen_it() {
    let runner = policy(&["a.test", "b.test"]);
    let run = runner.narrowed_to(&[pattern("b.test"), pattern("c.test")]);
    assert_eq!(run.hosts(), &[pattern("b.test")]);
    run.check_url("https://b.test/").unwrap();
    assert!(run.check_url("https://a.test/").is_err());
    assert!(run.check_url("https://c.test/").is_err());
}

fn secrets() -> Secrets {
    Secrets::new()
        .with(Secret::new("TOKEN", "s3cr3t-value", vec![pattern("api.test")]).unwrap())
        .with(Secret::new("TOKEN_2", "other-value", vec![pattern("*.api.test")]).unwrap())
}

#[test]
fn a_secret_is_substituted_only_for_its_hosts() {
    let s = secrets();
    let api = target("https://api.test/");
    assert_eq!(
        s.substitute("Bearer PYCAGE_SECRET_TOKEN", &api).unwrap(),
        "Bearer s3cr3t-value"
    );
    // The longer name is not read as the shorter one and a suffix.
    let sub = target("https://v1.api.test/");
    assert_eq!(
        s.substitute("PYCAGE_SECRET_TOKEN_2", &sub).unwrap(),
        "other-value"
    );
    assert_eq!(
        s.substitute("PYCAGE_SECRET_TOKEN_2", &api).unwrap_err(),
        NetError::SecretNotForHost {
            secret: "TOKEN_2".into(),
            host: "api.test:443".into()
        }
    );
    let evil = target("https://evil.test/?k=x");
    let e = s
        .substitute("https://evil.test/?k=PYCAGE_SECRET_TOKEN", &evil)
        .unwrap_err();
    assert!(!e.to_string().contains("s3cr3t"), "{e}");
    // Text without a placeholder passes as it is; an unknown placeholder is just text.
    assert_eq!(
        s.substitute("PYCAGE_SECRET_NONE", &evil).unwrap(),
        "PYCAGE_SECRET_NONE"
    );
}

#[test]
fn values_are_redacted_back_to_placeholders() {
    let s = secrets();
    assert_eq!(
        s.redact("echo: Bearer s3cr3t-value and other-value"),
        "echo: Bearer PYCAGE_SECRET_TOKEN and PYCAGE_SECRET_TOKEN_2"
    );
    let debug = format!("{s:?}");
    assert!(
        !debug.contains("s3cr3t") && !debug.contains("other-value"),
        "{debug}"
    );
}

#[test]
fn values_are_redacted_from_bytes_that_are_not_text() {
    let s = secrets();
    let mut body = vec![0xff, 0x00];
    body.extend_from_slice(b"s3cr3t-values3cr3t-value");
    body.extend_from_slice(&[0xfe]);
    body.extend_from_slice(b"other-value");
    let mut expected = vec![0xff, 0x00];
    expected.extend_from_slice(b"PYCAGE_SECRET_TOKENPYCAGE_SECRET_TOKEN");
    expected.extend_from_slice(&[0xfe]);
    expected.extend_from_slice(b"PYCAGE_SECRET_TOKEN_2");
    assert_eq!(s.redact_bytes(body), expected);
    assert_eq!(s.redact_bytes(vec![1, 2, 3]), [1, 2, 3]);
}

#[test]
fn secrets_are_well_formed() {
    let hosts = || vec![pattern("api.test")];
    assert!(Secret::new("token", "v", hosts()).is_err());
    assert!(Secret::new("1TOKEN", "v", hosts()).is_err());
    assert!(Secret::new("TO-KEN", "v", hosts()).is_err());
    assert!(Secret::new("TOKEN", "", hosts()).is_err());
    assert!(Secret::new("TOKEN", "v", vec![]).is_err());
    assert_eq!(
        Secret::new("TOKEN", "v", hosts()).unwrap().placeholder(),
        "PYCAGE_SECRET_TOKEN"
    );
}

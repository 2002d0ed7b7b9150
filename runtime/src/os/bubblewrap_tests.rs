use std::time::Duration;

use super::*;

fn backend() -> BubblewrapBackend {
    BubblewrapBackend {
        interpreter: DEFAULT_INTERPRETER.into(),
        layout: Arc::new(HostLayout::merged_usr()),
        network: false,
    }
}

fn rendered(limits: &Limits) -> Vec<String> {
    backend()
        .render(limits, Path::new("/tmp/pycage-abc"), Some(99))
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
}

fn after<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
    argv.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn the_command_line_is_prlimit_then_bwrap_then_python() {
    let limits = Limits::builder()
        .wall_timeout(Duration::from_secs(5))
        .memory_bytes(128 << 20)
        .build()
        .unwrap();
    let argv = rendered(&limits);
    assert_eq!(argv[0], PRLIMIT);
    let bwrap = argv.iter().position(|a| a == BWRAP).expect("bwrap runs");
    assert_eq!(
        &argv[1..bwrap],
        [
            "--cpu=6:7",
            "--as=134217728",
            "--nproc=99",
            "--fsize=33554432",
            "--nofile=256",
            "--core=0",
            "--"
        ]
    );
    let sep = argv.iter().rposition(|a| a == "--").unwrap();
    assert_eq!(
        &argv[sep + 1..],
        [
            "/usr/bin/python3",
            "-I",
            "-B",
            "/run/pycage/pycage_socket.py"
        ]
    );
}

#[test]
fn every_namespace_is_new_and_nothing_privileged_remains() {
    let argv = rendered(&Limits::default());
    for flag in [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ] {
        assert!(argv.iter().any(|a| a == flag), "{flag} missing");
    }
    assert_eq!(after(&argv, "--cap-drop"), ["ALL"]);
    assert_eq!(after(&argv, "--uid"), ["65534"]);
    assert_eq!(after(&argv, "--gid"), ["65534"]);
    // Sharing flags would undo the unsharing.
    assert!(!argv.iter().any(|a| a.starts_with("--share")), "{argv:?}");
    assert!(!argv.iter().any(|a| a == "--cap-add"));
}

#[test]
fn allowing_the_network_shares_only_the_network() {
    let argv: Vec<String> = backend()
        .allow_network(true)
        .render(&Limits::default(), Path::new("/tmp/pycage-abc"), None)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    let shared: Vec<_> = argv.iter().filter(|a| a.starts_with("--share")).collect();
    assert_eq!(shared, ["--share-net"]);
    // After `--unshare-all`, which it narrows.
    let unshare = argv.iter().position(|a| a == "--unshare-all").unwrap();
    let share = argv.iter().position(|a| a == "--share-net").unwrap();
    assert!(unshare < share);
    for flag in ["--unshare-user", "--disable-userns", "--clearenv"] {
        assert!(argv.iter().any(|a| a == flag), "{flag} missing");
    }
}

#[test]
fn only_system_directories_and_the_run_directory_are_bound() {
    let argv = rendered(&Limits::default());
    let ro: Vec<_> = argv
        .windows(3)
        .filter(|w| w[0] == "--ro-bind")
        .map(|w| (w[1].as_str(), w[2].as_str()))
        .collect();
    assert_eq!(ro, [("/usr", "/usr"), ("/tmp/pycage-abc", "/run/pycage")]);
    assert!(!argv.iter().any(|a| a == "--bind" || a == "--dev-bind"));
    assert_eq!(after(&argv, "--tmpfs"), ["/tmp"]);
    assert_eq!(
        after(&argv, "--size"),
        // A quarter of the memory limit: a full /tmp is an OSError before memory runs out.
        [(64u64 << 20).to_string().as_str()]
    );
    assert_eq!(after(&argv, "--proc"), ["/proc"]);
    assert_eq!(after(&argv, "--chdir"), ["/tmp"]);
    for secret in ["/home", "/root", "/etc", "/var", "/run/user"] {
        assert!(!argv.iter().any(|a| a == secret), "{secret} is exposed");
    }
}

#[test]
fn the_guest_environment_is_fixed() {
    let argv = rendered(&Limits::default());
    let set: Vec<_> = argv
        .windows(3)
        .filter(|w| w[0] == "--setenv")
        .map(|w| format!("{}={}", w[1], w[2]))
        .collect();
    assert_eq!(set, ["PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", "HOME=/tmp"]);
}

#[test]
fn extra_binds_are_read_only() {
    let spec = BwrapSpec {
        layout: HostLayout::merged_usr(),
        run_dir: None,
        extra_ro_binds: vec![("/opt/cache".into(), "/run/pycage-cache".into())],
        tmp_bytes: 1,
        work_bytes: None,
        env: Vec::new(),
        program: vec!["/x".into()],
        share_net: false,
    };
    let argv: Vec<_> = render_bwrap(&spec)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    let i = argv.iter().position(|a| a == "/opt/cache").unwrap();
    assert_eq!(argv[i - 1], "--ro-bind");
    assert_eq!(argv[i + 1], "/run/pycage-cache");
    assert!(!argv.iter().any(|a| a == "/run/pycage"));
}

#[test]
fn an_interpreter_outside_the_system_directories_is_refused() {
    let layout = HostLayout::merged_usr();
    if cfg!(target_os = "linux") && Path::new(BWRAP).exists() && Path::new(PRLIMIT).exists() {
        let e = check_binaries(Path::new("/opt/python/bin/python3"), &layout).unwrap_err();
        assert!(e.reason().contains("interpreter"), "{e}");
        // That path does not exist here: missing comes first.
        assert_eq!(e.kind(), crate::UnavailableKind::Missing);
    }
    let e = check_binaries(Path::new("python3"), &layout);
    assert!(e.is_err());
}

#[test]
fn a_one_shot_run_works_in_a_capped_tmpfs_with_a_file_size_cap() {
    let limits = Limits::builder()
        .memory_bytes(128 << 20)
        .max_file_bytes(1_000)
        .build()
        .unwrap();
    let argv: Vec<String> = backend()
        .render_with_workdir(&limits, Path::new("/tmp/pycage-abc"), Some(99), 5_000)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    // The working directory is the kernel-capped tmpfs, never a host directory bound
    // read-write; one file is capped at max_file_bytes.
    let at = argv.iter().position(|a| a == "/work").unwrap();
    assert_eq!(&argv[at - 3..=at], ["--size", "5000", "--tmpfs", "/work"]);
    assert_eq!(after(&argv, "--chdir"), ["/work"]);
    assert!(argv.contains(&"--fsize=1000".to_owned()), "{argv:?}");
    assert!(!argv.iter().any(|a| a == "--bind"), "{argv:?}");
    // Without files the guest stays in /tmp, with its usual caps.
    let plain = rendered(&limits);
    assert_eq!(after(&plain, "--chdir"), ["/tmp"]);
    assert!(!plain.contains(&"/work".to_owned()));
}

#[test]
fn a_session_keeps_one_capped_working_directory() {
    let limits = Limits::builder().max_file_bytes(1_000).build().unwrap();
    let argv: Vec<String> = backend()
        .render_session_with_workdir(&limits, Path::new("/tmp/pycage-abc"), Some(99), 7_000)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    let at = argv.iter().position(|a| a == "/work").unwrap();
    assert_eq!(&argv[at - 3..=at], ["--size", "7000", "--tmpfs", "/work"]);
    assert_eq!(after(&argv, "--chdir"), ["/work"]);
    assert!(argv.contains(&"--fsize=1000".to_owned()), "{argv:?}");
}

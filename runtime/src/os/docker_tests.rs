use std::time::Duration;

use super::*;

fn spec() -> DockerSpec {
    DockerSpec {
        image: DEFAULT_IMAGE.into(),
        name: "pycage-0123abcd-42".into(),
        user: (1000, 1000),
        layout: HostLayout::merged_usr(),
        run_dir: "/tmp/pycage-abc".into(),
        limits: Limits::builder()
            .wall_timeout(Duration::from_secs(2))
            .memory_bytes(128 << 20)
            .build()
            .unwrap(),
        interpreter: DEFAULT_INTERPRETER.into(),
        network: false,
    }
}

fn rendered() -> Vec<String> {
    render_docker(&spec())
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
fn allowing_the_network_joins_the_bridge_and_changes_nothing_else() {
    let mut spec = spec();
    spec.network = true;
    let with: Vec<String> = render_docker(&spec)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    assert_eq!(after(&with, "--network"), ["bridge"]);
    let without = rendered();
    let differ: Vec<_> = with.iter().zip(&without).filter(|(a, b)| a != b).collect();
    assert_eq!(differ.len(), 1, "{differ:?}");
    assert_eq!(with.len(), without.len());
}

#[test]
fn one_throwaway_locked_down_container() {
    let argv = rendered();
    assert_eq!(&argv[..4], [DOCKER, "run", "--rm", "-i"]);
    assert_eq!(after(&argv, "--name"), ["pycage-0123abcd-42"]);
    assert_eq!(after(&argv, "--network"), ["none"]);
    assert!(argv.iter().any(|a| a == "--read-only"));
    assert_eq!(after(&argv, "--cap-drop"), ["ALL"]);
    assert_eq!(after(&argv, "--security-opt"), ["no-new-privileges"]);
    assert_eq!(after(&argv, "--memory"), ["134217728"]);
    assert_eq!(after(&argv, "--memory-swap"), ["134217728"]);
    assert_eq!(after(&argv, "--pids-limit"), ["64"]);
    assert_eq!(after(&argv, "--pull"), ["never"]);
    assert_eq!(after(&argv, "--user"), ["1000:1000"]);
    assert_eq!(
        after(&argv, "--tmpfs"),
        ["/tmp:rw,nosuid,nodev,size=33554432,mode=1777"]
    );
    for risky in [
        "--privileged",
        "--cap-add",
        "--net",
        "--pid",
        "--ipc",
        "-v",
        "--mount",
    ] {
        assert!(!argv.iter().any(|a| a == risky), "{risky} in {argv:?}");
    }
}

#[test]
fn only_system_directories_and_the_run_directory_are_mounted_read_only() {
    let argv = rendered();
    assert_eq!(
        after(&argv, "--volume"),
        ["/usr:/usr:ro", "/tmp/pycage-abc:/run/pycage:ro"]
    );
    assert_eq!(
        after(&argv, "--env"),
        ["PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", "HOME=/tmp"]
    );
}

#[test]
fn the_image_runs_prlimit_then_the_guest() {
    let argv = rendered();
    let image = argv.iter().position(|a| a == DEFAULT_IMAGE).unwrap();
    assert_eq!(
        &argv[image + 1..],
        [
            PRLIMIT,
            "--cpu=3:4",
            "--as=134217728",
            "--fsize=33554432",
            "--nofile=256",
            "--core=0",
            "--",
            "/usr/bin/python3",
            "-I",
            "-B",
            "/run/pycage/pycage_socket.py"
        ]
    );
}

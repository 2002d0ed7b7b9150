use super::*;

const HYBRID_MOUNTS: &str = "\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";

const HYBRID_OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/f465
1:cpu:/
0::/
";

#[test]
fn hybrid_layouts_nest_under_the_own_cgroups() {
    let mounts = parse_mounts(HYBRID_MOUNTS);
    assert_eq!(
        mounts,
        CgroupMounts {
            unified: Some("/sys/fs/cgroup/unified".into()),
            pids: Some("/sys/fs/cgroup/pids".into()),
            memory: Some("/sys/fs/cgroup/memory".into()),
        }
    );
    let own = parse_own_cgroups(HYBRID_OWN);
    assert_eq!(own.memory.as_deref(), Some("/process_api/f465"));
    assert_eq!(
        plan(&mounts, &own, Some("hugetlb")),
        Some(CgroupSupport::V1 {
            pids: "/sys/fs/cgroup/pids/pycage".into(),
            memory: "/sys/fs/cgroup/memory/process_api/f465/pycage".into(),
            unified: Some("/sys/fs/cgroup/unified/pycage".into()),
        })
    );
}

#[test]
fn a_unified_layout_with_controllers_is_v2() {
    let mounts = parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n");
    let own = parse_own_cgroups("0::/user.slice/session-1.scope\n");
    assert_eq!(
        plan(
            &mounts,
            &own,
            Some("cpuset cpu io memory hugetlb pids rdma misc")
        ),
        Some(CgroupSupport::V2 {
            base: "/sys/fs/cgroup/pycage".into()
        })
    );
    // Without the controllers there is nothing to cap with.
    assert_eq!(plan(&mounts, &own, Some("cpu io")), None);
    assert_eq!(plan(&CgroupMounts::default(), &own, None), None);
}

#[test]
fn escaped_mount_paths_are_unescaped() {
    let mounts = parse_mounts("cgroup /sys/fs/my\\040cgroups cgroup rw,pids,memory 0 0\n");
    assert_eq!(mounts.pids, Some("/sys/fs/my cgroups".into()));
    assert_eq!(mounts.memory, Some("/sys/fs/my cgroups".into()));
}

#[test]
fn oom_kills_are_read_from_either_file() {
    assert_eq!(oom_kills("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 1);
    assert_eq!(
        oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"),
        4
    );
    assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), 0);
}

#[test]
fn the_wrapper_joins_every_cgroup_before_the_command_runs() {
    let dir = std::env::temp_dir().join(format!("pycage-cgwrap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let procs = [dir.join("a.procs"), dir.join("b.procs")];
    let argv = wrap(
        &procs,
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo ran \"$0\"".into(),
            "with space".into(),
        ],
    );
    assert_eq!(argv[0], SH);
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran with space\n");
    for p in &procs {
        assert_eq!(std::fs::read_to_string(p).unwrap(), "0\n");
    }
    // A cgroup that cannot be joined stops the command from running.
    let argv = wrap(
        &[dir.join("missing/dir/cgroup.procs")],
        vec!["/bin/sh".into(), "-c".into(), "echo ran".into()],
    );
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(JOIN_FAILED));
    assert!(out.stdout.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_cgroups_owner_is_the_pid_in_its_name() {
    assert_eq!(owner_pid("run-794ccd19-6616"), Some(6616));
    assert_eq!(owner_pid("run-794ccd19"), None);
    assert_eq!(owner_pid("session-1-2"), None);
    assert_eq!(owner_pid("run-ab-x"), None);
}

#[test]
fn orphaned_run_cgroups_of_dead_processes_are_swept_and_nothing_else() {
    let base = tempfile::tempdir().unwrap();
    let own = std::process::id();
    for name in [
        "run-aa-111".to_owned(), // owner dead, empty: swept
        "run-bb-222".to_owned(), // owner alive: kept
        "run-cc-333".to_owned(), // owner dead, but a member: kept
        format!("run-dd-{own}"), // ours: kept
        "not-a-run".to_owned(),  // not ours to judge: kept
    ] {
        std::fs::create_dir(base.path().join(name)).unwrap();
    }
    std::fs::write(base.path().join("run-cc-333/cgroup.procs"), "4242\n").unwrap();
    let alive = |pid: u32| pid == 222;
    // Too young: a run that has not joined yet looks the same.
    assert_eq!(
        sweep_orphans(base.path(), alive, Duration::from_secs(3600)),
        0
    );
    assert_eq!(sweep_orphans(base.path(), alive, Duration::ZERO), 1);
    let mut left: Vec<String> = std::fs::read_dir(base.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "not-a-run".to_owned(),
            "run-bb-222".to_owned(),
            "run-cc-333".to_owned(),
            format!("run-dd-{own}")
        ]
    );
}

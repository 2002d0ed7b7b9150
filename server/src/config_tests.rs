use super::*;

#[test]
fn an_empty_file_is_the_defaults() {
    let config = ServerConfig::from_toml("").unwrap();
    assert_eq!(config, ServerConfig::default());
    assert_eq!(config.backend, pycage::BackendKind::Wasm);
    assert_eq!(config.runs.max_concurrent, 4);
    config.validate().unwrap();
}

#[test]
fn every_table_reads() {
    let config = ServerConfig::from_toml(
        r#"
        backend = "bubblewrap"
        tools = ["tools.toml"]
        [policy]
        namespace = "math"
        allow = ["add"]
        [limits]
        wall_timeout = "10s"
        memory_bytes = 134217728
        [maxima]
        wall_timeout = "1m"
        [sessions]
        max_sessions = 3
        idle_timeout = 60
        [runs]
        max_concurrent = 2
        queue_timeout = "250ms"
        progress_interval = "2s"
        "#,
    )
    .unwrap();
    assert_eq!(config.backend, pycage::BackendKind::Bubblewrap);
    assert_eq!(config.policy.allow, ["add"]);
    assert_eq!(config.sessions.max_sessions, 3);
    assert_eq!(config.runs.queue_timeout, Duration::from_millis(250));
    let (limits, maxima) = config.resolved_limits().unwrap();
    assert_eq!(limits.wall_timeout(), Duration::from_secs(10));
    assert_eq!(limits.memory_bytes(), 128 << 20);
    assert_eq!(maxima.wall_timeout(), Duration::from_secs(60));
}

#[test]
fn an_unknown_key_is_an_error_naming_it() {
    for (text, key) in [
        ("bakend = \"wasm\"", "bakend"),
        ("[limits]\nwall_timout = \"1s\"", "wall_timout"),
        ("[runs]\nmax_concurent = 1", "max_concurent"),
        ("[sessions]\nmax_session = 1", "max_session"),
        ("[polcy]\nallow = []", "polcy"),
    ] {
        let e = ServerConfig::from_toml(text).unwrap_err();
        assert!(e.contains(&format!("unknown field `{key}`")), "{text}: {e}");
    }
}

#[test]
fn limits_above_the_maxima_are_refused() {
    let config =
        ServerConfig::from_toml("[limits]\nwall_timeout = \"2m\"\n[maxima]\nwall_timeout = \"1m\"")
            .unwrap();
    assert_eq!(
        config.validate().unwrap_err(),
        ConfigError::Invalid("[limits] wall_timeout is above [maxima] wall_timeout".into())
    );
}

#[test]
fn bad_values_are_refused_naming_the_table() {
    let zero = ServerConfig::from_toml("[runs]\nmax_concurrent = 0").unwrap();
    assert!(
        zero.validate()
            .unwrap_err()
            .to_string()
            .contains("[runs] max_concurrent")
    );
    let memory = ServerConfig::from_toml("[limits]\nmemory_bytes = 1").unwrap();
    assert!(
        memory
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("[limits]")
    );
    let header = ServerConfig::from_toml("[http]\nheader_read_timeout = \"0s\"").unwrap();
    assert!(
        header
            .validate()
            .unwrap_err()
            .to_string()
            .contains("[http] header_read_timeout")
    );
    let sessions = ServerConfig::from_toml("[sessions]\nmax_sessions = 0").unwrap();
    assert!(
        sessions
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("[sessions]")
    );
}

#[test]
fn relative_tool_paths_follow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pycage.toml");
    std::fs::write(&path, "tools = [\"tools.toml\", \"/abs/t.toml\"]").unwrap();
    let config = ServerConfig::from_file(&path).unwrap();
    assert_eq!(
        config.tools,
        [dir.path().join("tools.toml"), "/abs/t.toml".into()]
    );
    let missing = ServerConfig::from_file(&dir.path().join("none.toml")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }));
    std::fs::write(&path, "tools = 3").unwrap();
    let e = ServerConfig::from_file(&path).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
    assert!(e.to_string().starts_with(&path.display().to_string()));
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let open = ServerConfig::from_toml("[http]\nlisten = \"0.0.0.0:8080\"").unwrap();
    let e = open.validate().unwrap_err().to_string();
    assert!(e.contains("needs a token_file"), "{e}");
    let guarded =
        ServerConfig::from_toml("[http]\nlisten = \"0.0.0.0:8080\"\ntoken_file = \"t\"").unwrap();
    guarded.validate().unwrap();
    let local = ServerConfig::from_toml("[http]\nlisten = \"127.0.0.1:0\"").unwrap();
    local.validate().unwrap();
    assert!(ServerConfig::from_toml("[http]\nlisten = \"nowhere\"").is_err());
}

#[test]
fn upstream_tables_read_resolve_against_the_file_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pycage.toml");
    std::fs::write(
        &path,
        r#"
        [[upstream]]
        name = "fs"
        command = ["./bin/fs-server", "--root", "data"]
        env = { LOG = "debug" }
        timeout = "5s"
        max_restarts = 1

        [[upstream]]
        name = "web"
        command = ["npx", "-y", "some-server"]
        "#,
    )
    .unwrap();
    let config = ServerConfig::from_file(&path).unwrap();
    config.validate().unwrap();
    let [fs, web] = &config.upstream[..] else {
        panic!("{:?}", config.upstream)
    };
    let program = dir.path().join("./bin/fs-server");
    assert_eq!(fs.command[0], program.to_string_lossy());
    assert_eq!(fs.command[1..], ["--root", "data"]);
    assert_eq!(fs.env["LOG"], "debug");
    assert_eq!(fs.timeout, Duration::from_secs(5));
    assert_eq!(fs.max_restarts, 1);
    assert_eq!(web.command[0], "npx");
    assert_eq!(web.timeout, Duration::from_secs(60));

    let twice = "[[upstream]]\nname = \"a\"\ncommand = [\"x\"]\n\
                 [[upstream]]\nname = \"a\"\ncommand = [\"y\"]\n";
    let e = ServerConfig::from_toml(twice)
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("`a` is configured twice"), "{e}");
    let bad = "[[upstream]]\nname = \"a-b\"\ncommand = [\"x\"]\n";
    let e = ServerConfig::from_toml(bad)
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("identifier"), "{e}");
}

#[test]
fn a_guest_file_is_read_against_the_config_file_and_needs_the_wasm_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pycage.toml");
    std::fs::write(&path, "guest = \"guests/mine.wasm\"\n").unwrap();
    let config = ServerConfig::from_file(&path).unwrap();
    assert_eq!(config.guest, Some(dir.path().join("guests/mine.wasm")));
    config.validate().unwrap();
    let bwrap = ServerConfig::from_toml("backend = \"bubblewrap\"\nguest = \"g.wasm\"\n").unwrap();
    let e = bwrap.validate().unwrap_err().to_string();
    assert!(e.contains("guest needs backend = \"wasm\""), "{e}");

    // The data guest's name stays a name, for the CLI to put its guest in its place; a file
    // of that name is `./data`, read against the config file like any other.
    std::fs::write(&path, "guest = \"data\"\n").unwrap();
    let config = ServerConfig::from_file(&path).unwrap();
    assert_eq!(config.guest.as_deref(), Some(Path::new(DATA_GUEST)));
    std::fs::write(&path, "guest = \"./data\"\n").unwrap();
    let config = ServerConfig::from_file(&path).unwrap();
    assert_eq!(config.guest, Some(dir.path().join("./data")));
    // A host that embeds the server has no data guest to build: it is told so.
    let e =
        crate::guest_backend(&ServerConfig::from_toml("guest = \"data\"\n").unwrap()).unwrap_err();
    assert!(e.contains("pycage guest build --package numpy"), "{e}");
}

#[test]
fn a_seed_makes_runs_deterministic_and_needs_the_wasm_backend() {
    let config = ServerConfig::from_toml("seed = 7\n").unwrap();
    assert_eq!(config.seed, Some(7));
    config.validate().unwrap();
    assert_eq!(ServerConfig::from_toml("").unwrap().seed, None);
    let docker = ServerConfig::from_toml("backend = \"docker\"\nseed = 0\n").unwrap();
    let e = docker.validate().unwrap_err().to_string();
    assert!(
        e.contains("seed (deterministic runs) needs backend = \"wasm\""),
        "{e}"
    );
}

#[test]
fn the_net_table_reads_and_is_checked_against_the_backend_and_policy() {
    let config = ServerConfig::from_toml(
        "[net]\nallow = [\"api.example.com\"]\n\
         [[net.secrets]]\nname = \"TOKEN\"\nenv = \"VAR\"\nhosts = [\"api.example.com\"]\n",
    )
    .unwrap();
    config.validate().unwrap();
    assert_eq!(config.net.allow, ["api.example.com"]);
    assert_eq!(config.net.secrets[0].env, "VAR");
    assert!(!config.allow_network);

    let bwrap =
        ServerConfig::from_toml("backend = \"bubblewrap\"\nallow_network = true\n").unwrap();
    bwrap.validate().unwrap();
    let wasm = ServerConfig::from_toml("allow_network = true\n").unwrap();
    let e = wasm.validate().unwrap_err().to_string();
    assert!(
        e.contains("allow_network needs backend") && e.contains("[net] allow"),
        "{e}"
    );

    let pinned = ServerConfig::from_toml(
        "[policy]\nnamespace = \"math\"\n[net]\nallow = [\"api.example.com\"]\n",
    )
    .unwrap();
    let e = pinned.validate().unwrap_err().to_string();
    assert!(e.contains("outside [policy] namespace"), "{e}");

    let e = ServerConfig::from_toml("[net]\nhosts = []\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("hosts"), "{e}");
}

#[test]
fn a_malformed_allowed_host_or_origin_is_refused_naming_it() {
    let config = ServerConfig::from_toml("[http]\nallowed_hosts = [\"a b\"]\n").unwrap();
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("allowed_hosts") && e.contains("`a b`"), "{e}");
    let config = ServerConfig::from_toml("[http]\nallowed_origins = [\"app.example\"]\n").unwrap();
    let e = config.validate().unwrap_err().to_string();
    assert!(
        e.contains("allowed_origins") && e.contains("`app.example`"),
        "{e}"
    );
}

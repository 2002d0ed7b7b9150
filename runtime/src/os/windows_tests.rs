use super::command_line::{command_line, environment_block};
use super::job::JobPlan;
use super::*;

fn limits() -> Limits {
    Limits::builder()
        .wall_timeout(Duration::from_secs(5))
        .memory_bytes(128 << 20)
        .build()
        .unwrap()
}

fn settings() -> WindowsSandboxSettings {
    render_settings(
        &limits(),
        "0123abcd-4242",
        r"C:\Program Files\Python313\python.exe",
        &example_run_dir().to_string_lossy(),
        r"C:\Windows",
    )
}

#[test]
fn no_capabilities_and_a_job_that_dies_with_the_host() {
    let s = settings();
    assert!(s.capabilities.is_empty(), "no capability SIDs");
    assert!(s.job.kill_on_job_close);
    assert!(s.job.die_on_unhandled_exception);
    assert!(s.job.ui_restrictions_all);
    assert_eq!(s.job.process_memory_bytes, 128 << 20);
    assert_eq!(s.job.job_memory_bytes, 128 << 20);
    assert_eq!(s.job.active_processes, 64);
    assert_eq!(s.job.job_user_time_100ns, 60_000_000);
    let plan = JobPlan::new(&s.job);
    assert_eq!(plan.process_memory_limit, 128 << 20);
    assert_eq!(plan.per_job_user_time_limit, 60_000_000);
}

#[test]
fn names_are_per_run_and_valid() {
    let s = settings();
    assert_eq!(s.app_container_name, "pycage.run.0123abcd-4242");
    assert!(is_valid_app_container_name(&s.app_container_name));
    assert_eq!(s.pipe_name, r"\\.\pipe\pycage-0123abcd-4242");
    // The longest tag `run_tag` makes (8 hex digits, a dash, a 32-bit process id) fits.
    assert!(is_valid_app_container_name(
        "pycage.run.ffffffff-4294967295"
    ));
    let long = "x".repeat(65);
    for bad in ["", "a/b", r"a\b", "a:b", "é", &long] {
        assert!(!is_valid_app_container_name(bad), "{bad:?}");
    }
}

#[test]
fn the_guest_runs_isolated_in_utf8_mode_from_the_run_directory() {
    let s = settings();
    assert_eq!(
        s.command_line,
        [
            r"C:\Program Files\Python313\python.exe",
            "-I",
            "-B",
            "-X",
            "utf8",
            r"C:\Users\ada\AppData\Local\Temp\pycage-abc\pycage_socket.py",
        ]
    );
    let line = command_line(&s.command_line[0], &s.command_line[1..]).unwrap();
    assert_eq!(
        line,
        r#""C:\Program Files\Python313\python.exe" -I -B -X utf8 C:\Users\ada\AppData\Local\Temp\pycage-abc\pycage_socket.py"#
    );
    assert_eq!(
        s.work_dir,
        r"C:\Users\ada\AppData\Local\Temp\pycage-abc\work"
    );
}

#[test]
fn the_environment_holds_nothing_of_the_hosts_but_its_windows_directory() {
    let s = settings();
    let names: Vec<_> = s.environment.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["SystemRoot", "TEMP", "TMP"]);
    assert!(
        s.environment
            .iter()
            .all(|(k, v)| k == ENV_SYSTEM_ROOT || *v == s.work_dir)
    );
    let block = environment_block(&s.environment).unwrap();
    let text = String::from_utf16(&block).unwrap();
    assert_eq!(
        text,
        "SystemRoot=C:\\Windows\0TEMP=C:\\Users\\ada\\AppData\\Local\\Temp\\pycage-abc\\work\0TMP=C:\\Users\\ada\\AppData\\Local\\Temp\\pycage-abc\\work\0\0"
    );
}

#[test]
fn it_isolates() {
    assert!(WindowsBackend::new().provides_isolation());
    assert_eq!(
        WindowsBackend::new().interpreter(),
        Path::new(DEFAULT_WINDOWS_INTERPRETER)
    );
}

#[cfg(not(windows))]
#[test]
fn off_windows_it_is_unavailable_because_of_the_os() {
    let Availability::Unavailable(why) = WindowsBackend::new().availability() else {
        panic!("AppContainer needs Windows")
    };
    assert_eq!(why.reason(), "wrong OS: AppContainer needs Windows");
    assert_eq!(why.kind(), crate::UnavailableKind::WrongOs);
    // Whatever the interpreter: the OS is the reason.
    let Availability::Unavailable(why) =
        WindowsBackend::with_interpreter("/usr/bin/python3").availability()
    else {
        panic!("AppContainer needs Windows")
    };
    assert!(why.reason().starts_with("wrong OS: "), "{why}");
}

#[cfg(not(windows))]
#[tokio::test]
async fn off_windows_a_run_is_a_typed_backend_error() {
    use crate::ToolPolicy;

    let exposed = ToolPolicy::new()
        .resolve(&pycage_tools::ToolRegistry::new())
        .unwrap();
    let broker = Arc::new(crate::Broker::new("windows-test", exposed, &limits()));
    let job = Job {
        code: "1 + 1".into(),
        vars: serde_json::Map::new(),
        limits: limits(),
        tools: Vec::new(),
        files: Vec::new(),
        output_meter: None,
    };
    let result = WindowsBackend::new().run(job, broker).await;
    assert!(!result.ok);
    assert_eq!(result.backend, "windows");
    let error = result.error.unwrap();
    assert_eq!(error.kind, ErrorKind::BackendError);
    assert_eq!(
        error.message,
        "the windows backend is unavailable: wrong OS: AppContainer needs Windows"
    );
}

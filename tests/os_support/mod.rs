//! Helpers for the tests that run over every backend available here.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pycage::{
    Availability, Backend, BubblewrapBackend, DockerBackend, LayeredBackend, Limits, LocalBackend,
    Runner, ToolPolicy, WasmBackend,
};
use pycage_tools::ToolRegistry;

/// Set (to anything but empty or `0`) to make an unavailable backend a failure, not a skip.
pub const ENV_REQUIRE: &str = "PYCAGE_REQUIRE_BACKENDS";

/// CI systems set this.
pub const ENV_CI: &str = "CI";

/// One backend under test.
#[derive(Clone)]
pub struct Subject {
    pub name: &'static str,
    pub backend: Arc<dyn Backend>,
}

impl Subject {
    /// True when the backend puts a boundary around the guest (`local` does not).
    pub fn isolates(&self) -> bool {
        self.backend.provides_isolation()
    }

    /// True when the guest is native CPython in an OS sandbox.
    pub fn native(&self) -> bool {
        !matches!(self.name, "wasm" | "wasm+bubblewrap")
    }

    /// True when the backend keeps sessions.
    pub fn supports_sessions(&self) -> bool {
        self.backend.supports_sessions()
    }

    /// How late a wall-clock timeout may return: the limit plus one second for the wasm
    /// backend, plus two for backends that start processes (Docker starts a container).
    pub fn timeout_margin(&self) -> Duration {
        if self.name == "wasm" {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(2)
        }
    }

    /// A runner over `tools` with `policy` and `limits`.
    pub fn runner(&self, tools: ToolRegistry, policy: ToolPolicy, limits: Limits) -> Runner {
        Runner::builder()
            .backend(self.backend.clone())
            .tools(tools)
            .policy(policy)
            .limits(limits)
            .allow_no_isolation(!self.isolates())
            .build()
            .expect("runner builds")
    }
}

/// True when an unavailable backend must fail the test run.
pub fn required() -> bool {
    [ENV_REQUIRE, ENV_CI].iter().any(|k| {
        std::env::var(k)
            .map(|v| !v.is_empty() && v != "0" && v != "false")
            .unwrap_or(false)
    })
}

/// Skips the rest of a test with `why`, or, where a skip must fail (see [`required`]), fails
/// it: a protection CI could not check is a failure there, not a pass.
#[track_caller]
pub fn skip(why: &str) {
    assert!(
        !required(),
        "cannot skip ({ENV_REQUIRE} or {ENV_CI} is set): {why}"
    );
    eprintln!("skipping: {why}");
}

/// The pycage CLI, which is also the layered backend's worker.
pub fn pycage_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pycage"))
}

fn layered() -> LayeredBackend {
    static LAYERED: OnceLock<LayeredBackend> = OnceLock::new();
    LAYERED
        .get_or_init(|| {
            let cache = pycage::wasm::default_cache_dir().expect("an artifact cache directory");
            LayeredBackend::new(pycage_exe(), cache)
        })
        .clone()
}

/// The backend `name`, or `None` (with the reason printed) when it cannot run here. In CI
/// (see [`required`]) an unavailable backend panics instead.
pub fn subject(name: &'static str) -> Option<Subject> {
    let backend: Arc<dyn Backend> = match name {
        "wasm" => Arc::new(WasmBackend::shared().expect("the wasm engine starts")),
        "bubblewrap" => Arc::new(BubblewrapBackend::new()),
        "docker" => Arc::new(DockerBackend::new()),
        "local" => Arc::new(LocalBackend::new()),
        "wasm+bubblewrap" => Arc::new(layered()),
        other => panic!("no backend {other}"),
    };
    match backend.availability() {
        Availability::Available => Some(Subject { name, backend }),
        Availability::Unavailable(why) => {
            assert!(
                !required(),
                "backend `{name}` is unavailable but required ({ENV_REQUIRE} or {ENV_CI} is set): {why}"
            );
            eprintln!("skipping: backend `{name}` is unavailable here: {why}");
            None
        }
    }
}

/// One module of tests per backend, one test per case: `backend_suite! { [case_a, case_b]
/// wasm => "wasm", bubblewrap => "bubblewrap" }` runs `case_a(&Subject)` and
/// `case_b(&Subject)` (async functions of the module that invokes it) on each backend that can run
/// here, skipping the others with the reason (failing instead in CI).
#[macro_export]
macro_rules! backend_suite {
    ($cases:tt $($module:ident => $name:literal),* $(,)?) => {$(
        mod $module {
            $crate::backend_suite!(@cases $name: $cases);
        }
    )*};
    (@cases $name:literal: [$($case:ident),* $(,)?]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(s) = $crate::os_support::subject($name) {
                super::$case(&s).await;
            }
        }
    )*};
}

/// Every backend, as `backend_suite!` names them.
#[macro_export]
macro_rules! every_backend {
    ($cases:tt) => {
        $crate::backend_suite! {
            $cases
            wasm => "wasm",
            bubblewrap => "bubblewrap",
            docker => "docker",
            local => "local",
            layered => "wasm+bubblewrap",
        }
    };
}

/// pycage's data guest (`--guest data`: numpy, from pycage-guest-data's wheel), built by
/// this build of pycage into the shared cache ([`packaged_guest_cache`]) the first time a test
/// binary asks. `Err` says why it could not be built (the build needs PyPI).
pub fn data_guest() -> Result<PathBuf, String> {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    once(&BUILT, build_data_guest)
}

/// What `slot` holds, or what `build` makes (kept in `slot` when it succeeds): a guest built
/// once per test binary, whichever of its tests asks first.
fn once(
    slot: &std::sync::Mutex<Option<PathBuf>>,
    build: fn() -> Result<PathBuf, String>,
) -> Result<PathBuf, String> {
    let mut built = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = built.as_ref() {
        return Ok(path.clone());
    }
    let path = build()?;
    *built = Some(path.clone());
    Ok(path)
}

fn build_data_guest() -> Result<PathBuf, String> {
    let cache = packaged_guest_cache();
    let out = std::process::Command::new(pycage_exe())
        .args(["run", "--guest", "data", "-c", "pass"])
        .env("PYCAGE_CACHE_DIR", &cache)
        .output()
        .map_err(|e| format!("running pycage: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("pycage run --guest data failed: {stderr}"));
    }
    // A first use builds it and says where it put it; the file is there.
    if stderr.contains("building the data guest") {
        let path = stderr
            .lines()
            .find_map(|l| l.strip_prefix("pycage: the data guest is "))
            .map(PathBuf::from);
        assert!(path.as_ref().is_some_and(|p| p.is_file()), "{stderr}");
        return Ok(path.unwrap_or_default());
    }
    // The newest, should builds of other sources have left theirs.
    std::fs::read_dir(cache.join("guests"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "wasm") && !p.to_string_lossy().contains(".partial.")
        })
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .ok_or_else(|| "no data guest in the cache after pycage built it".to_owned())
}

/// The packages of [`packaged_guest`], each with a module it preloads.
pub const PACKAGED_GUEST: &[(&str, &str)] = &[
    ("attrs", "attrs"),
    ("python-dateutil", "dateutil.parser"),
    ("tabulate", "tabulate"),
];

/// The artifact cache the tests that use [`packaged_guest`] share, so it is compiled once.
pub fn packaged_guest_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("packaged-guest-cache")
}

/// A guest that `pycage guest build` made from real pure-Python packages from the registry
/// ([`PACKAGED_GUEST`], preloaded), built once for this build of pycage (the file is named
/// after the executable's size and time, so a rebuilt pycage builds it again) and shared by
/// the test binaries that need it. `Err` says why it could not be built (the build needs
/// PyPI).
pub fn packaged_guest() -> Result<PathBuf, String> {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    once(&BUILT, build_packaged_guest)
}

fn build_packaged_guest() -> Result<PathBuf, String> {
    let exe = pycage_exe();
    let meta = std::fs::metadata(&exe).map_err(|e| e.to_string())?;
    let stamp = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("packaged-guest-{}-{stamp}.wasm", meta.len()));
    if !path.exists() {
        // Guests of earlier builds of pycage are of no more use.
        for entry in std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("packaged-guest-") && name.contains(".wasm") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let partial = dir.join(format!(
            "packaged-guest-{}.partial.wasm",
            std::process::id()
        ));
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["guest", "build"])
            .env("PYCAGE_CACHE_DIR", packaged_guest_cache());
        for (package, module) in PACKAGED_GUEST {
            cmd.args(["--package", package, "--preload", module]);
        }
        let out = cmd
            .arg("-o")
            .arg(&partial)
            .output()
            .map_err(|e| format!("running pycage guest build: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pycage guest build failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let manifest = |p: &std::path::Path| {
            let mut name = p.as_os_str().to_owned();
            name.push(".json");
            PathBuf::from(name)
        };
        std::fs::rename(manifest(&partial), manifest(&path)).map_err(|e| e.to_string())?;
        std::fs::rename(&partial, &path).map_err(|e| e.to_string())?;
    }
    Ok(path)
}

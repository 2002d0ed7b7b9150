//! A guest other than the built-in one: a guest file (a component and its manifest) runs
//! through the library and the CLI, its artifact cached under its own digest, and a file that
//! is corrupted, foreign or built by another pycage is refused with a message that says so.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::os_support;

use pycage::wasm::guest::{GuestManifest, Package, seal};
use pycage::{Guest, Runner, WasmBackend};
use serde_json::json;

/// The built-in guest's component, sealed as a guest file with a manifest of this pycage.
fn sealed_builtin(pycage_version: Option<&str>) -> Vec<u8> {
    let component = Guest::builtin().bytes().to_vec();
    let mut manifest = GuestManifest::new(
        &component,
        "3.14.0",
        vec![Package::new("example", "1.0", "00".repeat(32))],
        vec![],
    );
    if let Some(v) = pycage_version {
        manifest.pycage = v.into();
    }
    seal(&component, &manifest).unwrap()
}

fn pycage(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(args)
        .env("PYCAGE_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_guest_file_runs_and_is_cached_under_its_own_digest() {
    let dir = tempfile::tempdir().unwrap();
    let guest = Guest::from_bytes(sealed_builtin(None)).unwrap();
    assert_eq!(guest.manifest().unwrap().packages[0].name, "example");
    let backend = WasmBackend::builder()
        .cache_dir(Some(dir.path().to_owned()))
        .guest(guest.clone())
        .build()
        .unwrap();
    let builtin = WasmBackend::builder()
        .cache_dir(Some(dir.path().to_owned()))
        .build()
        .unwrap();
    assert_ne!(backend.artifact_path(), builtin.artifact_path());
    assert!(
        backend
            .artifact_path()
            .unwrap()
            .to_string_lossy()
            .contains(&guest.digest()[..16]),
        "{:?}",
        backend.artifact_path()
    );
    let runner = Runner::builder()
        .backend(Arc::new(backend.clone()))
        .build()
        .unwrap();
    let r = runner.run("import json\nreturn json.loads('[1, 2]')").await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value, json!([1, 2]));
    assert!(backend.is_cached());
    assert!(backend.artifact_path().unwrap().exists());
    assert_eq!(backend.guest().digest(), guest.digest());
}

#[test]
fn the_cli_runs_a_guest_file_and_refuses_a_bad_one_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.wasm");
    std::fs::write(&good, sealed_builtin(None)).unwrap();
    let out = pycage(
        &[
            "run",
            "--guest",
            good.to_str().unwrap(),
            "-c",
            "return 6 * 7",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");

    let mut bytes = sealed_builtin(None);
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    let corrupted = dir.path().join("corrupted.wasm");
    std::fs::write(&corrupted, bytes).unwrap();
    let old = dir.path().join("old.wasm");
    std::fs::write(&old, sealed_builtin(Some("0.0.1"))).unwrap();
    let foreign = dir.path().join("foreign.wasm");
    std::fs::write(&foreign, b"\0asm\x01\x00\x00\x00").unwrap();
    for (file, says) in [
        (&corrupted, "the guest is corrupted"),
        (&old, "built by pycage 0.0.1"),
        (&foreign, "not a pycage guest"),
    ] {
        let out = pycage(
            &["run", "--guest", file.to_str().unwrap(), "-c", "return 1"],
            dir.path(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(out.stdout.is_empty(), "{says}: nothing ran");
    }
    // A guest needs the wasm backend.
    let out = pycage(
        &[
            "run",
            "--guest",
            good.to_str().unwrap(),
            "--backend",
            "bubblewrap",
            "-c",
            "return 1",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--guest needs the wasm backend"));
}

/// The guest of real packages from PyPI, or `None` (a skip, a failure in CI) without PyPI.
fn packaged() -> Option<std::path::PathBuf> {
    match os_support::packaged_guest() {
        Ok(path) => Some(path),
        Err(why) => {
            os_support::skip(&why);
            None
        }
    }
}

fn in_shared_cache(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(args)
        .env("PYCAGE_CACHE_DIR", os_support::packaged_guest_cache())
        .output()
        .unwrap()
}

const USES_THE_PACKAGES: &str = r#"
import attrs, importlib.metadata, sys
from dateutil import parser, relativedelta, rrule, tz
from tabulate import tabulate

@attrs.define
class Point:
    x: int
    y: int = attrs.field(validator=attrs.validators.ge(0))

try:
    Point(1, -1)
    refused = False
except ValueError:
    refused = True
when = parser.parse("2026-12-04T19:42:10+01:00")
paris = when.astimezone(tz.gettz("Europe/Paris"))
days = list(rrule.rrule(rrule.DAILY, count=3, dtstart=parser.parse("2026-01-30")))
return {
    "point": attrs.asdict(Point(3, 4)),
    "refused": refused,
    "paris": paris.isoformat(),
    "next_month": str((when + relativedelta.relativedelta(months=+1)).date()),
    "days": [d.day for d in days],
    "table": tabulate([["a", 1], ["bb", 22]], headers=["k", "v"], tablefmt="github"),
    "version": importlib.metadata.version("attrs"),
    "preloaded": [m in sys.modules for m in ("attrs", "dateutil.parser", "tabulate")],
    # A distribution's files, as pytest's plugin loader lists them (only those that exist).
    "files": sorted(f.name for f in importlib.metadata.files("tabulate") if f.suffix == ".py"),
}
"#;

#[test]
fn a_guest_built_from_pypi_packages_imports_and_uses_them() {
    let Some(guest) = packaged() else { return };
    let guest = guest.to_str().unwrap();
    let out = in_shared_cache(&["run", "--guest", guest, "--json", "-c", USES_THE_PACKAGES]);
    assert!(out.status.success(), "{out:?}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let value = &result["value"];
    assert_eq!(value["point"], json!({"x": 3, "y": 4}), "{result:#}");
    assert_eq!(value["refused"], json!(true));
    // tz.gettz reads the zone from `tzdata`, a dependency pip resolved and the guest holds.
    assert_eq!(value["paris"], json!("2026-12-04T19:42:10+01:00"));
    assert_eq!(value["next_month"], json!("2027-01-04"));
    assert_eq!(value["days"], json!([30, 31, 1]));
    assert_eq!(
        value["table"],
        json!("| k   |   v |\n|-----|-----|\n| a   |   1 |\n| bb  |  22 |")
    );
    assert_eq!(value["preloaded"], json!([true, true, true]));
    assert_eq!(value["files"], json!(["__init__.py"]), "{result:#}");

    // The manifest: beside the file, and as `guest info --json` prints it.
    let out = in_shared_cache(&["guest", "info", "--json", guest]);
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let beside: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{guest}.json")).unwrap()).unwrap();
    assert_eq!(info, beside);
    assert_eq!(info["python"], json!("3.14.0"));
    assert_eq!(info["pycage"], json!(env!("CARGO_PKG_VERSION")));
    assert_eq!(
        info["preload"],
        json!(["attrs", "dateutil.parser", "tabulate"])
    );
    let packages = info["packages"].as_array().unwrap();
    for (name, _) in os_support::PACKAGED_GUEST {
        let p = packages
            .iter()
            .find(|p| p["name"] == json!(name))
            .unwrap_or_else(|| panic!("{name} in {info:#}"));
        assert!(p["version"].as_str().is_some_and(|v| !v.is_empty()), "{p}");
        let sha = p["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{p}"
        );
    }
    let dateutil = packages
        .iter()
        .find(|p| p["name"] == json!("python-dateutil"))
        .unwrap();
    assert_eq!(dateutil["modules"], json!(["dateutil"]));
    let attrs = packages
        .iter()
        .find(|p| p["name"] == json!("attrs"))
        .unwrap();
    assert_eq!(attrs["version"], value["version"]);
    let content = info["content_blake3"].as_str().unwrap();
    assert!(content.len() == 64 && content.bytes().all(|b| b.is_ascii_hexdigit()));

    // The model-facing description names them, with what to import.
    let out = in_shared_cache(&["describe", "--guest", guest]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("`python-dateutil` ") && text.contains("(import `dateutil`)"),
        "{text}"
    );
    assert!(text.contains("`tabulate` "), "{text}");
    assert!(!text.contains("No third-party packages"), "{text}");
}

#[test]
fn a_distribution_with_a_c_extension_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("yaml.wasm");
    // PyYAML publishes platform wheels (its C extension) and a source distribution only.
    let out = in_shared_cache(&[
        "guest",
        "build",
        "--package",
        "attrs",
        "--package",
        "pyyaml",
        "-o",
        out_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("could not reach the package index") && !os_support::required() {
        return os_support::skip(&format!("no package index here: {stderr}"));
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`pyyaml` has no pure-Python wheel"),
        "{stderr}"
    );
    assert!(stderr.contains("C extension"), "{stderr}");
    assert!(
        stderr.contains("--backend bubblewrap or docker"),
        "{stderr}"
    );
    assert!(!out_file.exists(), "nothing is written");

    // A pure package whose dependency is not: the dependency is named, and what needs it.
    let out = in_shared_cache(&[
        "guest",
        "build",
        "--package",
        "jinja2==3.1.6",
        "-o",
        out_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`MarkupSafe` (needed by `jinja2`) has no pure-Python wheel"),
        "{stderr}"
    );

    // A name the index does not have is said to be missing, not impure.
    let out = in_shared_cache(&[
        "guest",
        "build",
        "--package",
        "no-such-distribution-pycage-test",
        "-o",
        out_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`no-such-distribution-pycage-test` is not on the package index"),
        "{stderr}"
    );
}

#[tokio::test]
async fn pycage_mcp_serves_a_guest_file_and_its_description_names_the_packages() {
    use rmcp::ServiceExt;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    let Some(guest) = packaged() else { return };
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pycage")).configure(|c| {
        c.args(["mcp", "--guest"])
            .arg(&guest)
            .env("PYCAGE_CACHE_DIR", os_support::packaged_guest_cache());
    });
    let (transport, _stderr) = TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let run = tools.iter().find(|t| t.name == "run_python").unwrap();
    let description = run.description.as_deref().unwrap();
    assert!(description.contains("(import `dateutil`)"), "{description}");
    let serde_json::Value::Object(arguments) =
        json!({"code": "from tabulate import tabulate\nreturn tabulate([[1, 2]])"})
    else {
        unreachable!()
    };
    let r = client
        .call_tool(rmcp::model::CallToolRequestParams::new("run_python").with_arguments(arguments))
        .await
        .unwrap();
    let s = r.structured_content.unwrap();
    assert_eq!(s["value"], json!("-  -\n1  2\n-  -"), "{s:#}");
    client.cancel().await.unwrap();

    // A guest file the servers cannot use is refused before they serve.
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign.wasm");
    std::fs::write(&foreign, b"\0asm\x01\x00\x00\x00").unwrap();
    for command in [&["mcp"][..], &["serve", "--insecure-no-auth"]] {
        let mut args = command.to_vec();
        args.extend(["--guest", foreign.to_str().unwrap()]);
        let out = pycage(&args, dir.path());
        let command = command[0];
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("not a pycage guest"), "{command}: {stderr}");
    }
}

const USES_NUMPY: &str = r#"
import sys
preloaded = [m in sys.modules for m in ("numpy", "numpy.fft", "numpy.random")]
import numpy as np
a = np.arange(12, dtype=np.int64).reshape(3, 4)
rng = np.random.default_rng(7)
m = rng.random((40, 40)) + 40 * np.eye(40)
def error_of(n):
    try:
        np.zeros(n)
    except (MemoryError, ValueError) as e:
        return type(e).__name__
# np.save and np.load through a file of the working directory.
np.save("a.npy", a)
saved = np.load("a.npy").tolist() == a.tolist()
# An extension module that was not preloaded: loaded now, from the guest itself.
lazy = "numpy._core._rational_tests" not in sys.modules
from numpy._core._rational_tests import rational
return {
    "preloaded": preloaded,
    "solve": float(np.linalg.solve([[3, 1], [1, 2]], [9, 8])[0]),
    "sum": a.sum(axis=0).tolist(),
    "fft": np.fft.fft([1.0, 0.0, 0.0, 0.0]).real.tolist(),
    "inverse": bool(np.allclose(np.linalg.inv(m) @ m, np.eye(40))),
    "unique": np.unique(np.array(["b", "a", "b"], dtype="T")).tolist(),
    "longdouble": np.finfo(np.longdouble).bits,
    "sorted": np.sort(np.array([3, 1, 2])).tolist(),
    "lazy": [lazy, str(rational(1, 2) + rational(1, 3))],
    "saved": saved,
    "too_big": error_of(2 * 10**8),
    "too_many": error_of(10**10),
}
"#;

/// The data guests in `cache`.
fn data_guests(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(cache.join("guests"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("data-") && name.ends_with(".wasm") && !name.contains(".partial.")
        })
        .collect();
    found.sort();
    found
}

/// Whether the data guest is built (once per test binary, into the cache they share:
/// [`os_support::data_guest`]); `false` after skipping the test when it cannot be (no PyPI).
fn data_guest_built() -> bool {
    match os_support::data_guest() {
        Ok(_) => true,
        Err(why) => {
            os_support::skip(&why);
            false
        }
    }
}

/// `pycage run --guest data --json ARGS` with the cache the test binaries share
/// ([`os_support::packaged_guest_cache`]), where the data guest was built and compiled.
fn run_data_guest(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["run", "--guest", "data", "--json"])
        .args(args)
        .env("PYCAGE_CACHE_DIR", os_support::packaged_guest_cache())
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn the_data_guest_runs_numpy_from_its_prebuilt_wheel() {
    // The first run that names the data guest builds it (pip takes the prebuilt wheels):
    // os_support checks that it says so and names the file; every later run finds it.
    if !data_guest_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = os_support::packaged_guest_cache();
    let before = data_guests(&cache);
    assert!(!before.is_empty());
    let out = run_data_guest(&["-c", USES_NUMPY], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("building"), "{stderr}");
    assert_eq!(data_guests(&cache), before);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["value"],
        json!({
            "preloaded": [true, true, true],
            "solve": 2.0,
            "sum": [12, 15, 18, 21],
            "fft": [1.0, 1.0, 1.0, 1.0],
            "inverse": true,
            "unique": ["a", "b"],
            "longdouble": 128,
            "sorted": [1, 2, 3],
            "lazy": [true, "5/6"],
            "saved": true,
            // 1.5 GiB is over the guest's memory limit: numpy's own MemoryError, in the run.
            "too_big": "MemoryError",
            // More elements than a 32-bit guest can index.
            "too_many": "ValueError",
        }),
        "{result:#}"
    );

    // The limits hold for numpy's C code too: fuel runs out inside a matrix product.
    let out = run_data_guest(
        &[
            "--fuel",
            "50000000",
            "-c",
            "import numpy as np\nm = np.ones((400, 400))\nfor _ in range(100): m = m @ m",
        ],
        dir.path(),
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["error"]["kind"],
        json!("fuel_exhausted"),
        "{result:#}"
    );

    // The manifest names the wheels pip took: pycage-guest-data's, by their SHA-256.
    let file = os_support::data_guest().unwrap();
    let out = pycage(
        &["guest", "info", "--json", file.to_str().unwrap()],
        dir.path(),
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for wheel in pycage_guest_data::WHEELS {
        let name = wheel.file_name.split('-').next().unwrap();
        let package = info["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == json!(name))
            .unwrap_or_else(|| panic!("{name} in {info:#}"));
        assert_eq!(
            package["version"].as_str(),
            wheel.file_name.split('-').nth(1)
        );
        assert_eq!(
            package["sha256"].as_str().unwrap(),
            sha256_hex(wheel.bytes),
            "{info:#}"
        );
    }
    assert_eq!(
        info["preload"],
        json!(["numpy", "numpy.fft", "numpy.random", "pandas"])
    );

    // The model is told numpy and pandas are there.
    let out = Command::new(env!("CARGO_BIN_EXE_pycage"))
        .args(["describe", "--guest", "data"])
        .env("PYCAGE_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("`numpy` ") && text.contains("`pandas` "),
        "{text}"
    );
}

/// The limits of a session hold inside numpy's and pandas' C code: a deadline interrupts a
/// Python loop of matrix products (the session keeps its DataFrame), and one C call that
/// runs past it is stopped by the epoch backstop, which ends the session and nothing else.
#[tokio::test]
async fn a_session_on_the_data_guest_is_interrupted_inside_numpy_and_keeps_its_dataframe() {
    if !data_guest_built() {
        return;
    }
    let guest = Guest::from_path(&os_support::data_guest().unwrap()).unwrap();
    let backend = WasmBackend::builder()
        .cache_dir(Some(os_support::packaged_guest_cache()))
        .guest(guest)
        .build()
        .unwrap();
    let runner = Runner::builder()
        .backend(Arc::new(backend))
        .limits(crate::common::wall(std::time::Duration::from_millis(500)))
        .build()
        .unwrap();
    let session = runner.session().await.unwrap();
    let r = session
        .run("import numpy as np, pandas as pd\ndf = pd.DataFrame({'a': range(5)})")
        .await;
    assert!(r.ok, "{r:#?}");
    let r = session
        .run("m = np.ones((200, 200))\nwhile True:\n    m = m @ m / 200")
        .await;
    crate::common::assert_kind(&r, pycage::ErrorKind::Timeout);
    assert!(!r.session_ended, "{r:#?}");
    let r = session.run("return int(df['a'].sum())").await;
    assert_eq!(r.value, json!(10), "{r:#?}");

    // One product that takes seconds: no bytecode runs until it returns, so the interrupt
    // waits, and the backstop stops the instance; the session is over.
    let r = session.run("big = np.ones((1500, 1500))\nbig @ big").await;
    crate::common::assert_kind(&r, pycage::ErrorKind::Timeout);
    assert!(r.session_ended, "{r:#?}");
    crate::common::assert_kind(
        &session.run("return 1").await,
        pycage::ErrorKind::SessionEnded,
    );
}

const USES_PANDAS: &str = r#"
import sys
preloaded = "pandas" in sys.modules
import pandas as pd
described = pd.DataFrame({"a": [1, 2, 3]}).describe()
frame = pd.read_csv("prices.csv", parse_dates=["day"])
by_city = frame.groupby("city")["price"].mean().round(2).to_dict()
days = pd.date_range("2026-03-28", periods=3, freq="D", tz="Europe/London")
frame.to_csv("out.csv", index=False)
return {
    "written": open("out.csv").read().splitlines()[:2],
    "preloaded": preloaded,
    "mean": float(described.loc["mean", "a"]),
    "std": float(described.loc["std", "a"]),
    "rows": len(frame),
    "by_city": by_city,
    "day_dtype": str(frame["day"].dtype),
    "utc": [str(d) for d in days.tz_convert("UTC")],
    "json": frame.head(1).to_json(orient="records", date_format="iso"),
}
"#;

#[test]
fn the_data_guest_runs_pandas_on_an_input_file() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("prices.csv");
    std::fs::write(
        &csv,
        "day,city,price\n2026-03-28,Oslo,10.5\n2026-03-29,Oslo,11.5\n2026-03-28,Rome,7\n",
    )
    .unwrap();
    if !data_guest_built() {
        return;
    }
    let out = run_data_guest(
        &["--file", csv.to_str().unwrap(), "-c", USES_PANDAS],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["value"],
        json!({
            "preloaded": true,
            "mean": 2.0,
            "std": 1.0,
            "rows": 3,
            "by_city": {"Oslo": 11.0, "Rome": 7.0},
            "day_dtype": "datetime64[us]",
            "written": ["day,city,price", "2026-03-28,Oslo,10.5"],
            // London's clocks go forward at 01:00 UTC on 2026-03-29: tzdata's rules.
            "utc": [
                "2026-03-28 00:00:00+00:00",
                "2026-03-29 00:00:00+00:00",
                "2026-03-29 23:00:00+00:00",
            ],
            "json": r#"[{"day":"2026-03-28T00:00:00.000","city":"Oslo","price":10.5}]"#,
        }),
        "{result:#}"
    );
}

/// A subset of a package's own test suite, run by pytest inside the data guest
/// (guest-data/own-tests/harness.py).
struct OwnTests {
    /// The package, and the prefix of its pins in guest-data/recipe/`{package}.env`.
    package: &'static str,
    /// The test paths the README names.
    suites: &'static [&'static str],
    /// What to take out of the sdist, under the package's directory.
    members: &'static [&'static str],
    /// The guest's packages whose test packages come from the sdist's copy.
    packages: &'static [&'static str],
    /// pytest's further arguments.
    args: &'static [&'static str],
}

#[test]
fn numpy_own_tests_pass_in_the_data_guest() {
    own_tests_pass_in_the_data_guest(&OwnTests {
        package: "numpy",
        suites: &[
            "numpy/linalg/tests",
            "numpy/fft/tests",
            "numpy/random/tests",
            "numpy/_core/tests/test_multiarray.py",
        ],
        members: &[
            "conftest.py",
            "_core/tests",
            "linalg/tests",
            "fft/tests",
            "random/tests",
        ],
        packages: &[
            "numpy",
            "numpy._core",
            "numpy.linalg",
            "numpy.fft",
            "numpy.random",
        ],
        args: &[],
    });
}

#[test]
fn pandas_own_tests_pass_in_the_data_guest() {
    own_tests_pass_in_the_data_guest(&OwnTests {
        package: "pandas",
        suites: PANDAS_SUITES,
        members: &["conftest.py", "tests"],
        packages: &["pandas"],
        // The sdist has no test data files: the tests that need one skip, as in pandas' own
        // wheel tests.
        args: &["--no-strict-data-files"],
    });
}

/// pandas' tests the README names (see `own_tests_pass_in_the_data_guest`).
const PANDAS_SUITES: &[&str] = &[
    "pandas/tests/frame/methods/test_describe.py",
    "pandas/tests/io/parser/common",
    "pandas/tests/groupby/test_groupby.py",
    "pandas/tests/reshape/merge/test_merge.py",
    "pandas/tests/tslibs",
];

/// Runs `tests`' suites in the data guest: every failure must be one
/// `{package}-expected-failures.txt` lists with its reason, and every line there must still
/// match one.
fn own_tests_pass_in_the_data_guest(tests: &OwnTests) {
    if !data_guest_built() {
        return;
    }
    let package = tests.package;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let own = repo.join("guest-data").join("own-tests");
    let suite = dir.join("suite");
    std::fs::create_dir_all(suite.join("wheels")).unwrap();

    // pytest and hypothesis: pure-Python wheels, pinned by hash.
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--require-hashes", "--only-binary", ":all:", "--no-deps"])
        .args([
            "--platform",
            "any",
            "--implementation",
            "py",
            "--python-version",
            "3.14",
        ])
        .arg("-d")
        .arg(suite.join("wheels"))
        .arg("-r")
        .arg(own.join("requirements.txt"))
        .output()
        .unwrap();
    if !out.status.success() && !os_support::required() {
        return os_support::skip(&format!("pip download: {out:?}"));
    }
    assert!(out.status.success(), "pip download: {out:?}");

    // The test files, from the sdist the wheel was built from (downloaded once).
    let pins =
        std::fs::read_to_string(repo.join(format!("guest-data/recipe/{package}.env"))).unwrap();
    let prefix = package.to_uppercase();
    let pin = |key: &str| {
        pins.lines()
            .find_map(|l| l.strip_prefix(&format!("{prefix}{key}=")))
            .unwrap_or_else(|| panic!("{prefix}{key} in {package}.env"))
            .to_owned()
    };
    let (version, sha256, url) = (pin(""), pin("_SHA256"), pin("_URL"));
    let sdist = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{package}-{version}.tar.gz"));
    if std::fs::read(&sdist)
        .map(|b| sha256_hex(&b))
        .ok()
        .as_deref()
        != Some(sha256.as_str())
    {
        let partial = sdist.with_extension(format!("{}.part", std::process::id()));
        let out = Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&partial)
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "downloading {url}: {out:?}");
        assert_eq!(
            sha256_hex(&std::fs::read(&partial).unwrap()),
            sha256,
            "{url}"
        );
        std::fs::rename(&partial, &sdist).unwrap();
    }
    let top = format!("{package}-{version}");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&suite)
        .args(tests.members.iter().map(|m| format!("{top}/{package}/{m}")))
        .status()
        .unwrap();
    assert!(status.success());
    let archive = dir.join("suite.tar");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&suite)
        .arg("wheels")
        .arg("-C")
        .arg(suite.join(&top))
        .arg(package)
        .status()
        .unwrap();
    assert!(status.success());

    let expected = format!("{package}-expected-failures.txt");
    let out = run_data_guest(
        &[
            "--file",
            archive.to_str().unwrap(),
            "--file",
            own.join(&expected).to_str().unwrap(),
            "--var",
            &format!("SUITES={}", json!(tests.suites)),
            "--var",
            &format!("PACKAGES={}", json!(tests.packages)),
            "--var",
            &format!("EXPECTED={}", json!(expected)),
            "--var",
            &format!("ARGS={}", json!(tests.args)),
            // The tests write temporary files and allocate large arrays.
            "--memory",
            "2GiB",
            "--max-files",
            "10000",
            "--max-written",
            "512MiB",
            "--timeout",
            "1500s",
            own.join("harness.py").to_str().unwrap(),
        ],
        dir,
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let value = &result["value"];
    assert_eq!(value["unexpected"], json!({}), "{result:#}");
    assert_eq!(value["stale"], json!([]), "{result:#}");
    for suite in tests.suites {
        let passed = value["counts"][suite]["passed"].as_u64().unwrap_or(0);
        assert!(passed > 10, "{suite}: {result:#}");
    }
    // What the README quotes.
    eprintln!(
        "{package}'s own tests in the data guest: {:#}",
        value["counts"]
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

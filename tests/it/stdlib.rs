//! The standard library in the wasm guest: every module of `sys.stdlib_module_names` (and
//! every submodule the guest holds) imports, except those the README lists with a reason; a
//! module imported on demand works like a preloaded one; and CPython's own doctests of every
//! importable module run in the sandbox against a committed list of expected failures
//! (`tests/stdlib/doctest-expected-failures.toml`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{assert_kind, run};
use pycage::{ErrorKind, Limits, RunResult, Runner};
use serde_json::{Map, Value, json};

const MODULES: &str = include_str!("../stdlib/modules.py");
const DOCTESTS: &str = include_str!("../stdlib/doctests.py");
const EXPECTED_FAILURES: &str = "tests/stdlib/doctest-expected-failures.toml";

/// The heading of the README's table of modules that do not import.
const README_TABLE: &str = "| modules that do not import | why |";

/// The README's table: each module it names, with the reason its row gives.
fn readme_unimportable() -> BTreeMap<String, String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with(README_TABLE))
        .skip(2);
    let mut listed = BTreeMap::new();
    for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [names, reason] = cells[..] else {
            panic!("a row of the README's table has two cells: {line}")
        };
        assert!(!reason.is_empty(), "a row without a reason: {line}");
        let names: Vec<&str> = names.split('`').skip(1).step_by(2).collect();
        assert!(!names.is_empty(), "a row without module names: {line}");
        for name in names {
            let old = listed.insert(name.to_string(), reason.to_string());
            assert!(old.is_none(), "{name} is listed twice in the README");
        }
    }
    assert!(
        !listed.is_empty(),
        "the README has no `{README_TABLE}` table"
    );
    listed
}

fn runner() -> Runner {
    Runner::builder()
        .limits(
            Limits::builder()
                .wall_timeout(Duration::from_secs(120))
                .max_value_bytes(4 << 20)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

async fn run_script(runner: &Runner, script: &str, vars: Value) -> RunResult {
    let Value::Object(vars) = vars else {
        panic!("vars must be an object")
    };
    runner.run_with(script, vars, runner.limits()).await
}

/// Every module the guest's `modules.py` finds, with `None` when it imports and its error
/// (`{"error", "missing"}`) when it does not.
async fn import_every_module(runner: &Runner) -> BTreeMap<String, Option<Map<String, Value>>> {
    let r = run_script(runner, MODULES, json!({})).await;
    assert!(r.ok, "{r:#?}");
    serde_json::from_value(r.value).unwrap()
}

#[tokio::test]
async fn every_stdlib_module_imports_unless_the_readme_says_why_not() {
    let listed = readme_unimportable();
    let runner = runner();
    let modules = import_every_module(&runner).await;
    let top_level: BTreeSet<&str> = modules
        .keys()
        .map(String::as_str)
        .filter(|n| !n.contains('.'))
        .collect();
    // `sys.stdlib_module_names` of CPython 3.14 has 297 names; two are left out on purpose
    // (`this` and `antigravity` do more than import).
    assert!(top_level.len() >= 290, "{}", top_level.len());
    let mut surprises = Vec::new();
    for (name, error) in &modules {
        match (error, listed.get(name)) {
            (None, None) => {}
            (None, Some(_)) => surprises.push(format!(
                "{name} imports now: take it out of the README's list"
            )),
            (Some(_), Some(_)) => {}
            (Some(error), None) => {
                // A submodule of a package that imports may fail for want of a module the
                // README lists (`multiprocessing.heap` for want of `mmap`): that reason holds.
                let missing = error.get("missing").and_then(Value::as_str);
                let explained = name.contains('.')
                    && missing.is_some_and(|m| listed.contains_key(m.split('.').next().unwrap()));
                if !explained {
                    surprises.push(format!("{name} does not import: {}", error["error"]));
                }
            }
        }
    }
    for name in listed.keys() {
        if !modules.contains_key(name) {
            surprises.push(format!(
                "the README lists {name}, which is no module of this library"
            ));
        }
    }
    assert!(surprises.is_empty(), "{surprises:#?}");
    let imported = modules.values().filter(|e| e.is_none()).count();
    println!(
        "{imported} of {} modules import ({} top-level names)",
        modules.len(),
        top_level.len()
    );
}

#[tokio::test]
async fn a_module_imported_on_demand_works_and_is_named_in_tracebacks() {
    // Neither module is preloaded: each comes from the snapshot's stored library.
    let r = run("import sys\n\
                 before = 'pickle' in sys.modules, 'configparser' in sys.modules\n\
                 import pickle, configparser\n\
                 c = configparser.ConfigParser()\n\
                 c.read_string('[s]\\nk = v\\n')\n\
                 return [before, pickle.loads(pickle.dumps({'a': (1, 2.5)})), c['s']['k'],\n\
                         pickle.__file__, pickle.__spec__.loader.is_package('pickle')]")
    .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value,
        json!([[false, false], {"a": [1, 2.5]}, "v", "/python/pickle.py", false])
    );
    // A traceback through a stored module names its file and line, as for a preloaded one.
    let r = run("import pickle\npickle.loads(b'garbage')").await;
    assert_kind(&r, ErrorKind::GuestException);
    let error = r.error.unwrap();
    assert!(error.message.contains("UnpicklingError"), "{error:#?}");
    let r = run("import configparser\nconfigparser.ConfigParser().read_string('no section')").await;
    let traceback = r.error.unwrap().traceback.unwrap();
    assert!(
        traceback.contains("/python/configparser.py\", line ")
            && traceback.contains("MissingSectionHeaderError"),
        "{traceback}"
    );
    // The store holds code, not a directory: its bytes are immutable and nothing is read from
    // a file system to import.
    let r = run("import sys\n\
                 store = next(f for f in sys.meta_path if hasattr(f, 'names'))\n\
                 code = store._index['pickle'][1]\n\
                 try:\n    code[0] = 0\nexcept TypeError:\n    return type(code).__name__")
    .await;
    assert_eq!(r.value, json!("bytes"), "{r:#?}");
}

#[tokio::test]
async fn what_imports_but_cannot_work_here_raises_the_usual_os_errors() {
    for (code, expected) in [
        (
            "import subprocess\nsubprocess.run(['ls'])",
            "OSError: [Errno 58] wasi does not support processes.",
        ),
        (
            "import multiprocessing\nmultiprocessing.Process(target=print).start()",
            "OSError: [Errno 58] wasi does not support processes.",
        ),
        (
            "import multiprocessing\nmultiprocessing.Pool(2)",
            "OSError: [Errno 58] wasi does not support processes.",
        ),
        (
            "import http.client\nhttp.client.HTTPConnection('example.com').request('GET', '/')",
            "PermissionError",
        ),
        (
            "import urllib.request\nurllib.request.urlopen('http://example.com/')",
            "URLError: <urlopen error no network: tool `net.fetch` is not available",
        ),
    ] {
        let r = run(code).await;
        assert!(!r.ok, "{code}: {r:#?}");
        let message = &r.error.as_ref().unwrap().message;
        assert!(message.contains(expected), "{code}: {message}");
    }
}

/// The committed list: each doctest expected to fail in the guest, with its reason.
fn expected_doctest_failures() -> BTreeMap<String, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        failures: BTreeMap<String, String>,
    }
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(EXPECTED_FAILURES))
            .unwrap();
    let file: File = toml::from_str(&text).unwrap();
    for (test, reason) in &file.failures {
        assert!(!reason.trim().is_empty(), "{test} has no reason");
    }
    file.failures
}

#[tokio::test]
async fn cpython_doctests_of_every_importable_module_match_the_expected_failures() {
    let expected = expected_doctest_failures();
    let runner = runner();
    let modules: Vec<String> = import_every_module(&runner)
        .await
        .into_iter()
        .filter_map(|(name, error)| error.is_none().then_some(name))
        .collect();
    // Each module in a fresh sandbox of its own, two at a time (this machine's cores).
    let permits = Arc::new(tokio::sync::Semaphore::new(2));
    let mut runs = tokio::task::JoinSet::new();
    for module in modules.clone() {
        let (runner, permits) = (runner.clone(), permits.clone());
        runs.spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let r = run_script(&runner, DOCTESTS, json!({ "module": module })).await;
            (module, r)
        });
    }
    let (mut tests, mut examples) = (0u64, 0u64);
    let mut failed = BTreeMap::new();
    let mut broken = Vec::new();
    while let Some(joined) = runs.join_next().await {
        let (module, r) = joined.unwrap();
        if !r.ok {
            broken.push(format!("{module}: {:?}", r.error));
            continue;
        }
        if let Some(error) = r.value.get("error") {
            broken.push(format!("{module} imported once but not now: {error}"));
            continue;
        }
        tests += r.value["tests"].as_u64().unwrap();
        examples += r.value["examples"].as_u64().unwrap();
        for (test, report) in r.value["failed"].as_object().unwrap() {
            failed.insert(test.clone(), report.as_str().unwrap().to_string());
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    println!(
        "doctests of {} modules: {tests} tests, {examples} examples, {} failing tests",
        modules.len(),
        failed.len()
    );
    let new: Vec<String> = failed
        .iter()
        .filter(|(test, _)| !expected.contains_key(*test))
        .map(|(test, report)| format!("{test}:\n{report}"))
        .collect();
    let fixed: Vec<&String> = expected
        .keys()
        .filter(|test| !failed.contains_key(*test))
        .collect();
    assert!(
        new.is_empty(),
        "doctests that fail and are not in {EXPECTED_FAILURES}:\n{}",
        new.join("\n")
    );
    assert!(
        fixed.is_empty(),
        "doctests in {EXPECTED_FAILURES} that pass now: take them out of the list: {fixed:#?}"
    );
}

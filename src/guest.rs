//! `pycage guest build` and `pycage guest info`: guests with packages baked in.
//!
//! A build resolves the packages with pip, for the guest's Python: pure-Python wheels, and the
//! wheels `pycage-guest-data` built for this guest's CPython (numpy, pandas), offered with
//! `--find-links` under a platform tag of their own. Any other distribution with a C
//! extension, or one published only as a source distribution, has no such wheel and is
//! refused by name. pip installs them into a private directory; the guest is built with them
//! exactly as the built-in one is built ([`pycage_guest`]), sealed with its manifest, and
//! compiled once (the artifact lands in the cache) to check that it loads and that the
//! preloaded modules import.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use pycage::wasm::guest::{GuestManifest, Package, seal};
use pycage::{Guest, Runner, WasmBackend};
use pycage_guest::{CustomGuest, Toolchain};
use serde_json::Value;

use crate::cli::{GuestBuildArgs, GuestCommand, GuestInfoArgs};
use crate::exit::Exit;

/// The guest's Python (componentize-py 0.25.1's CPython for WASI).
const PYTHON: &str = "3.14.0";

pub async fn guest(command: GuestCommand) -> Exit {
    match command {
        GuestCommand::Build(args) => match build(args).await {
            Ok(()) => Exit::Ok,
            Err((exit, message)) => {
                eprintln!("pycage guest build: {message}");
                exit
            }
        },
        GuestCommand::Info(args) => info(args),
    }
}

pub type Failed = (Exit, String);

fn usage(message: impl Into<String>) -> Failed {
    (Exit::Usage, message.into())
}

fn internal(message: impl Into<String>) -> Failed {
    (Exit::Internal, message.into())
}

/// Says each step as it starts, and how long the build has taken.
struct Progress {
    started: Instant,
    step: usize,
}

impl Progress {
    const STEPS: usize = 4;

    fn step(&mut self, what: &str) {
        self.step += 1;
        eprintln!(
            "pycage guest build: [{}/{}] {what} ({:.1} s)",
            self.step,
            Self::STEPS,
            self.started.elapsed().as_secs_f64()
        );
    }
}

async fn build(args: GuestBuildArgs) -> Result<(), Failed> {
    if args.packages.is_empty() && args.requirements.is_empty() {
        return Err(usage(
            "name the packages to bake in: --package NAME[==VERSION] or --requirements FILE",
        ));
    }
    for module in &args.preload {
        if !is_module_name(module) {
            return Err(usage(format!(
                "--preload {module:?}: not a module name (dotted Python identifiers)"
            )));
        }
    }
    let mut progress = Progress {
        started: Instant::now(),
        step: 0,
    };
    let toolchain = toolchain()?;
    let work = tempfile::Builder::new()
        .prefix("pycage-guest-build-")
        .tempdir()
        .map_err(|e| internal(format!("a temporary directory: {e}")))?;
    let site = work.path().join("site-packages");

    progress.step("resolve and download (pip: pure-Python wheels, and those built for the guest)");
    let packages = resolve(&toolchain, &args, &site, work.path())?;
    for p in &packages {
        eprintln!("  {} {} (sha256 {})", p.name, p.version, &p.sha256[..16]);
    }

    let guest = CustomGuest {
        site_packages: &site,
        preload: &args.preload,
        work: &work.path().join("build"),
    };
    let component = pycage_guest::build_custom(&toolchain, &guest, |step| match step {
        "componentize" => progress.step("componentize (the packages and preloads imported)"),
        _ => progress.step("link (the snapshot made immortal, the libraries linked)"),
    })
    .map_err(|e| {
        if e.is_preload_failure() {
            usage(format!(
                "{e}\n(a module that needs a part of the standard library the guest lacks, such \
                 as `bz2` or `lzma`, cannot be preloaded; see the README's list)"
            ))
        } else {
            internal(e.to_string())
        }
    })?;

    let manifest = GuestManifest::new(&component, PYTHON, packages, args.preload.clone());
    let sealed = seal(&component, &manifest).map_err(|e| internal(e.to_string()))?;
    std::fs::write(&args.out, &sealed)
        .map_err(|e| usage(format!("writing {}: {e}", args.out.display())))?;
    let manifest_path = manifest_path(&args.out);
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| internal(e.to_string()))?;
    std::fs::write(&manifest_path, text + "\n")
        .map_err(|e| usage(format!("writing {}: {e}", manifest_path.display())))?;

    progress.step("compile (and check that the preloaded modules import)");
    let guest = Guest::from_bytes(sealed).map_err(|e| internal(e.to_string()))?;
    check(guest.clone(), &args.preload).await?;
    eprintln!(
        "pycage guest build: wrote {} ({:.1} MB, BLAKE3 {}) and {} in {:.1} s",
        args.out.display(),
        guest.bytes().len() as f64 / 1e6,
        &guest.digest()[..16],
        manifest_path.display(),
        progress.started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What the data guest holds: pycage-guest-data's numpy and pandas, and pandas' pure-Python
/// dependencies, each pinned (a release on the index does not change the guest a pycage
/// builds; python-dateutil 4.0.0 breaks pandas 3.0.6's dateutil time zones, whose private
/// attributes it renamed, so 2.9 it is); tzdata too, which pandas asks for only on Windows and Emscripten but needs
/// wherever there is no system time zone database, as in the guest. Preloaded with the
/// submodules code reaches for first, so that importing them in a run costs what
/// `import json` does.
const DATA_PACKAGES: &[&str] = &[
    "numpy==2.4.6",
    "pandas==3.0.6",
    "python-dateutil==2.9.0.post0",
    "six==1.17.0",
    "tzdata==2026.6",
];
const DATA_PRELOAD: &[&str] = &["numpy", "numpy.fft", "numpy.random", "pandas"];

/// When `guest` is [`DATA_GUEST`](pycage_server::config::DATA_GUEST), puts the data guest's
/// path in its place, building the guest first when this pycage has not built it yet.
///
/// The data guest lives in the cache directory, named after a digest of what it is built from
/// (pycage's version, the guest's sources, the wheels), so an upgrade builds it again; a build
/// goes to a file of its own and is renamed into place, so processes that race to build it
/// each get a whole file.
pub async fn resolve_data_guest(guest: &mut Option<PathBuf>) -> Result<(), Failed> {
    if guest
        .as_deref()
        .is_none_or(|g| g.as_os_str() != pycage_server::config::DATA_GUEST)
    {
        return Ok(());
    }
    // Everything the guest is built from: pycage's version, the guest's sources and build
    // steps (its custom-guest code included), the wheels and what is baked in and preloaded.
    let mut key = blake3::Hasher::new();
    key.update(env!("CARGO_PKG_VERSION").as_bytes());
    key.update(pycage_guest::inputs_digest().as_bytes());
    for (name, text) in pycage_guest::SOURCES {
        key.update(name.as_bytes());
        key.update(text.as_bytes());
    }
    for wheel in pycage_guest_data::WHEELS {
        key.update(wheel.blake3.as_bytes());
    }
    for name in DATA_PACKAGES.iter().chain(DATA_PRELOAD) {
        key.update(name.as_bytes());
    }
    let dir = pycage::wasm::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("guests");
    let path = dir.join(format!("data-{}.wasm", &key.finalize().to_hex()[..16]));
    if !path.exists() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| internal(format!("creating {}: {e}", dir.display())))?;
        eprintln!(
            "pycage: building the data guest (numpy, pandas) into {}, once for this pycage: \
             a minute or two",
            path.display()
        );
        let partial = dir.join(format!("data-{}.partial.wasm", std::process::id()));
        let args = GuestBuildArgs {
            requirements: Vec::new(),
            packages: DATA_PACKAGES.iter().map(|&p| p.to_owned()).collect(),
            preload: DATA_PRELOAD.iter().map(|&m| m.to_owned()).collect(),
            out: partial.clone(),
        };
        build(args).await?;
        for (from, to) in [
            (manifest_path(&partial), manifest_path(&path)),
            (partial, path.clone()),
        ] {
            std::fs::rename(&from, &to)
                .map_err(|e| internal(format!("renaming {}: {e}", from.display())))?;
        }
        // The build's own last line names the file it wrote; this is where it now lives.
        eprintln!("pycage: the data guest is {}", path.display());
    }
    *guest = Some(path);
    Ok(())
}

/// `GUEST.wasm.json` beside `GUEST.wasm`.
fn manifest_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

fn is_module_name(name: &str) -> bool {
    name.split('.').all(|part| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
    })
}

/// componentize-py in pycage's cache directory (or a temporary one), installed by hash.
fn toolchain() -> Result<Toolchain, Failed> {
    let python = std::env::var_os("PYCAGE_PYTHON").unwrap_or_else(|| "python3".into());
    let dir = pycage::wasm::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("toolchain")
        .join("componentize-py-0.25.1");
    Toolchain::ensure(&dir, &python, |what| {
        eprintln!("pycage guest build: {what}")
    })
    .map_err(|e| {
        internal(format!(
            "{e}\n(the build needs Python 3 with `venv`, and PyPI, once; PYCAGE_PYTHON picks \
                 the interpreter)"
        ))
    })
}

/// Writes pycage-guest-data's prebuilt wheels (numpy and pandas for this guest) into a directory of
/// `work`, for pip's `--find-links`.
fn prebuilt_wheels(work: &Path) -> Result<PathBuf, Failed> {
    let dir = work.join("prebuilt-wheels");
    std::fs::create_dir_all(&dir)
        .map_err(|e| internal(format!("creating {}: {e}", dir.display())))?;
    for wheel in pycage_guest_data::WHEELS {
        let path = dir.join(wheel.file_name);
        std::fs::write(&path, wheel.bytes)
            .map_err(|e| internal(format!("writing {}: {e}", path.display())))?;
    }
    Ok(dir)
}

/// The names of the distributions pycage-guest-data has wheels of, for messages.
fn prebuilt_names() -> Vec<&'static str> {
    pycage_guest_data::WHEELS
        .iter()
        .filter_map(|w| w.file_name.split('-').next())
        .collect()
}

/// Resolves, downloads and installs the packages into `site` with pip, for the guest's
/// Python: pure-Python wheels, and the wheels pycage-guest-data built for the guest;
/// returns them as pip's report gives them.
fn resolve(
    toolchain: &Toolchain,
    args: &GuestBuildArgs,
    site: &Path,
    work: &Path,
) -> Result<Vec<Package>, Failed> {
    let report = work.join("pip-report.json");
    let prebuilt = prebuilt_wheels(work)?;
    let mut cmd = Command::new(toolchain.python());
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
    ])
    .args(["--no-compile", "--target"])
    .arg(site)
    .arg("--find-links")
    .arg(&prebuilt)
    // Pure-Python wheels, and wheels built for this guest's CPython (pycage-guest-data's,
    // from `--find-links`: PyPI has none with its platform tag).
    .args(["--only-binary", ":all:"])
    .args([
        "--platform",
        "any",
        "--platform",
        pycage_guest_data::PLATFORM,
    ])
    .args(["--abi", "none", "--abi", pycage_guest_data::ABI])
    .args(["--implementation", "cp", "--python-version", "3.14"])
    .arg("--report")
    .arg(&report);
    for file in &args.requirements {
        cmd.arg("-r").arg(file);
    }
    cmd.args(&args.packages);
    let (ok, stdout, stderr) = run_pip(cmd).map_err(|e| internal(format!("running pip: {e}")))?;
    if !ok {
        let pip_said = stderr.trim();
        return Err(usage(match refused(&stdout, &stderr) {
            _ if unreachable_index(&stderr) => {
                format!("pip could not reach the package index:\n{pip_said}")
            }
            Some(Refused { name, needed_by }) if on_the_index(toolchain, &name) => {
                let by = needed_by
                    .map(|p| format!(" (needed by `{p}`)"))
                    .unwrap_or_default();
                format!(
                    "`{name}`{by} has no pure-Python wheel for Python 3.14: it needs a C \
                     extension, or is published only as a source distribution, and a wasm guest \
                     holds C extensions only when they were built for it (pycage has them for: \
                     {}). Run code that needs it on an OS backend (--backend bubblewrap or \
                     docker), whose Python installs it natively.\npip said:\n{pip_said}",
                    prebuilt_names().join(", ")
                )
            }
            Some(Refused { name, .. }) => {
                format!("`{name}` is not on the package index.\npip said:\n{pip_said}")
            }
            None => format!("pip could not resolve the packages:\n{pip_said}"),
        }));
    }
    let text = std::fs::read_to_string(&report)
        .map_err(|e| internal(format!("reading pip's report: {e}")))?;
    let packages = packages_of(&text).map_err(|e| internal(format!("pip's report: {e}")))?;
    let mut installed = installed_modules(site)
        .map_err(|e| internal(format!("reading the installed packages: {e}")))?;
    Ok(packages
        .into_iter()
        .map(|p| {
            let modules = installed.remove(&normalize(&p.name)).unwrap_or_default();
            p.with_modules(modules)
        })
        .collect())
}

/// A distribution's name as PEP 503 compares them.
fn normalize(name: &str) -> String {
    let mut out = String::new();
    for part in name.split(['-', '_', '.']).filter(|part| !part.is_empty()) {
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&part.to_ascii_lowercase());
    }
    out
}

/// For each distribution installed in `site` (by normalized name), the top-level modules its
/// `RECORD` lists: what code imports.
fn installed_modules(
    site: &Path,
) -> std::io::Result<std::collections::HashMap<String, Vec<String>>> {
    let mut found = std::collections::HashMap::new();
    for entry in std::fs::read_dir(site)? {
        let dir = entry?.path();
        if dir.extension().is_none_or(|e| e != "dist-info") {
            continue;
        }
        let metadata = std::fs::read_to_string(dir.join("METADATA"))?;
        let Some(name) = metadata
            .lines()
            .find_map(|l| l.strip_prefix("Name:").map(str::trim))
        else {
            continue;
        };
        let record = std::fs::read_to_string(dir.join("RECORD"))?;
        found.insert(normalize(name), top_level(&record));
    }
    Ok(found)
}

/// The importable top-level names of a wheel's `RECORD` (`pkg/...` and `module.py`).
fn top_level(record: &str) -> Vec<String> {
    let mut modules: Vec<String> = record
        .lines()
        .filter_map(|line| line.split(',').next())
        .filter_map(|path| match path.split_once('/') {
            Some((dir, _)) => Some(dir),
            None => path.strip_suffix(".py"),
        })
        .filter(|name| is_module_name(name) && !name.contains('.') && *name != "__pycache__")
        .map(str::to_owned)
        .collect();
    modules.sort();
    modules.dedup();
    modules
}

/// True when pip's failure was the network's.
fn unreachable_index(pip_stderr: &str) -> bool {
    [
        "Failed to establish a new connection",
        "NewConnectionError",
        "Temporary failure in name resolution",
        "Network is unreachable",
    ]
    .iter()
    .any(|s| pip_stderr.contains(s))
}

/// True when the index has the distribution for some platform (`pip index versions`, with the
/// host's platform): it exists, so what it lacks is a pure-Python wheel.
fn on_the_index(toolchain: &Toolchain, name: &str) -> bool {
    Command::new(toolchain.python())
        .args([
            "-m",
            "pip",
            "index",
            "versions",
            "--disable-pip-version-check",
            name,
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs pip, saying on the terminal which distribution it collects as it goes; returns
/// whether it succeeded and what it printed on stdout and stderr.
fn run_pip(mut cmd: Command) -> std::io::Result<(bool, String, String)> {
    use std::io::{BufRead, Read};
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut err = child.stderr.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let mut stdout = String::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines() {
            let line = line?;
            if let Some(what) = line.strip_prefix("Collecting ") {
                eprintln!("  collecting {what}");
            }
            stdout.push_str(&line);
            stdout.push('\n');
        }
    }
    let status = child.wait()?;
    let stderr = stderr.join().unwrap_or_default();
    Ok((status.success(), stdout, stderr))
}

/// A distribution pip found no pure-Python wheel for, and the one that needs it.
#[derive(Debug, PartialEq, Eq)]
struct Refused {
    name: String,
    needed_by: Option<String>,
}

/// The distribution pip found no matching (pure-Python) wheel for: from its error, or, when
/// it backtracked through every version of a package, from the dependency they all need.
fn refused(pip_stdout: &str, pip_stderr: &str) -> Option<Refused> {
    let name_of = |spec: &str| {
        let name = spec
            .trim()
            .split(|c: char| "=<>!~[;() ".contains(c))
            .next()
            .unwrap_or("");
        (!name.is_empty()).then(|| name.to_owned())
    };
    if let Some(line) = pip_stderr
        .lines()
        .find(|l| l.contains("No matching distribution found for"))
    {
        let name = name_of(line.rsplit("found for").next()?)?;
        let needed_by = pip_stderr
            .lines()
            .find(|l| l.contains("satisfies the requirement") && l.contains("(from "))
            .and_then(|l| l.split("(from ").nth(1))
            .filter(|from| !from.starts_with("versions:"))
            .and_then(name_of);
        return Some(Refused { name, needed_by });
    }
    // "The conflict is caused by:\n    jinja2 3.1.6 depends on MarkupSafe>=2.0"
    let line = pip_stdout.lines().find(|l| l.contains(" depends on "))?;
    let (parent, dependency) = line.split_once(" depends on ")?;
    Some(Refused {
        name: name_of(dependency)?,
        needed_by: name_of(parent),
    })
}

/// The installed distributions of a pip `--report`, with their wheels' SHA-256.
fn packages_of(report: &str) -> Result<Vec<Package>, String> {
    let report: Value = serde_json::from_str(report).map_err(|e| e.to_string())?;
    let installs = report["install"].as_array().ok_or("no `install` list")?;
    let mut packages = Vec::new();
    for item in installs {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let name = text(&item["metadata"]["name"]).ok_or("a distribution without a name")?;
        let version = text(&item["metadata"]["version"]).ok_or("a version missing")?;
        let info = &item["download_info"];
        let sha256 = text(&info["archive_info"]["hashes"]["sha256"])
            .or_else(|| {
                text(&info["archive_info"]["hash"])
                    .and_then(|h| h.strip_prefix("sha256=").map(str::to_owned))
            })
            .ok_or_else(|| format!("no sha256 for {name}"))?;
        let url = text(&info["url"]).unwrap_or_default();
        let for_the_guest = format!(
            "-{abi}-{abi}-{platform}.whl",
            abi = pycage_guest_data::ABI,
            platform = pycage_guest_data::PLATFORM
        );
        if !url.ends_with("-none-any.whl") && !url.ends_with(&for_the_guest) {
            return Err(format!(
                "{name} {version} is neither a pure-Python wheel nor one built for the guest: \
                 {url}"
            ));
        }
        packages.push(Package::new(name, version, sha256));
    }
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(packages)
}

/// Compiles the guest (its artifact lands in the cache) and imports each preloaded module.
async fn check(guest: Guest, preload: &[String]) -> Result<(), Failed> {
    let backend = WasmBackend::builder()
        .max_instances(2)
        .guest(guest)
        .build()
        .map_err(|e| internal(e.to_string()))?;
    backend
        .prepare()
        .await
        .map_err(|e| internal(e.to_string()))?;
    let runner = Runner::builder()
        .backend(Arc::new(backend))
        .build()
        .map_err(|e| internal(e.to_string()))?;
    let code = format!(
        "import importlib\nfor m in {:?}:\n    importlib.import_module(m)\nreturn 'ok'",
        preload
    );
    let r = runner.run(&code).await;
    if !r.ok {
        return Err(internal(format!(
            "the built guest does not run: {:?}",
            r.error.map(|e| e.message)
        )));
    }
    Ok(())
}

fn info(args: GuestInfoArgs) -> Exit {
    let guest = match Guest::from_path(&args.guest) {
        Ok(guest) => guest,
        Err(e) => {
            eprintln!("pycage guest info: {e}");
            return Exit::Usage;
        }
    };
    let Some(m) = guest.manifest() else {
        return Exit::Internal;
    };
    if args.json {
        match serde_json::to_string_pretty(m) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("pycage guest info: {e}");
                return Exit::Internal;
            }
        }
        return Exit::Ok;
    }
    println!("guest      {}", args.guest.display());
    println!("built by   pycage {}", m.pycage);
    println!("python     {}", m.python);
    println!("size       {:.1} MB", guest.bytes().len() as f64 / 1e6);
    println!("blake3     {}", guest.digest());
    println!("packages   {}", m.packages.len());
    for p in &m.packages {
        println!(
            "  {} {} (import {}; sha256 {})",
            p.name,
            p.version,
            p.modules.join(", "),
            p.sha256
        );
    }
    println!("preloaded  {}", m.preload.join(", "));
    Exit::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_are_dotted_identifiers() {
        for ok in ["attrs", "dateutil.parser", "_x.y2"] {
            assert!(is_module_name(ok), "{ok}");
        }
        for bad in ["", "a..b", "1a", "a-b", "os\"); import x", "a.b."] {
            assert!(!is_module_name(bad), "{bad}");
        }
    }

    #[test]
    fn pip_naming_no_pure_wheel_is_read_by_name() {
        let refused_as =
            |stdout: &str, stderr: &str| refused(stdout, stderr).map(|r| (r.name, r.needed_by));
        let stderr = "ERROR: Could not find a version that satisfies the requirement pyyaml \
                      (from versions: none)\nERROR: No matching distribution found for pyyaml\n";
        assert_eq!(refused_as("", stderr), Some(("pyyaml".into(), None)));
        assert_eq!(
            refused_as("", "ERROR: No matching distribution found for numpy==2.3.1"),
            Some(("numpy".into(), None))
        );
        let stderr = "ERROR: Could not find a version that satisfies the requirement \
                      MarkupSafe>=2.0 (from jinja2) (from versions: none)\nERROR: No matching \
                      distribution found for MarkupSafe>=2.0\n";
        assert_eq!(
            refused_as("", stderr),
            Some(("MarkupSafe".into(), Some("jinja2".into())))
        );
        let stdout = "The conflict is caused by:\n    jinja2 3.1.6 depends on MarkupSafe>=2.0\n\
                      \x20   jinja2 2.8 depends on MarkupSafe\n";
        assert_eq!(
            refused_as(stdout, "ERROR: ResolutionImpossible: ..."),
            Some(("MarkupSafe".into(), Some("jinja2".into())))
        );
        assert_eq!(refused_as("", "ERROR: something else"), None);
    }

    #[test]
    fn top_level_modules_come_from_the_record() {
        let record = "dateutil/__init__.py,sha256=x,1\ndateutil/tz/tz.py,sha256=y,2\n\
                      python_dateutil-4.0.0.dist-info/RECORD,,\nsix.py,sha256=z,3\n\
                      ../../bin/tool,sha256=w,4\n__pycache__/six.cpython-314.pyc,,\n";
        assert_eq!(top_level(record), ["dateutil", "six"]);
        assert_eq!(normalize("Python_Dateutil"), "python-dateutil");
        assert_eq!(normalize("zope.interface"), "zope-interface");
    }
}

//! Builds the Python guest component and embeds it in the library.
//!
//! By default this installs the pinned componentize-py into a private virtualenv under the
//! target directory (once) and runs it on `guest-python/` and `wit/`. Setting
//! `PYCAGE_COMPONENT` to a prebuilt component skips all of that. `PYCAGE_PYTHON` picks the
//! Python that creates the virtualenv (default `python3`).

use std::env;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
const ENV_COMPONENT: &str = "PYCAGE_COMPONENT";
const ENV_PYTHON: &str = "PYCAGE_PYTHON";
const GUEST_FILES: &[&str] = &["pycage_runner.py", "pycage_wasm.py"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let guest_dir = root.join("guest-python");
    let wit_dir = root.join("wit");

    println!("cargo:rerun-if-env-changed={ENV_COMPONENT}");
    println!("cargo:rerun-if-env-changed={ENV_PYTHON}");
    println!("cargo:rerun-if-changed={}", wit_dir.display());
    for file in GUEST_FILES {
        println!("cargo:rerun-if-changed={}", guest_dir.join(file).display());
    }

    let component = out.join("pycage-guest.wasm");
    match env::var_os(ENV_COMPONENT) {
        Some(prebuilt) => {
            println!("cargo:rerun-if-changed={}", Path::new(&prebuilt).display());
            fs::copy(&prebuilt, &component).unwrap_or_else(|e| {
                fail(&format!(
                    "{ENV_COMPONENT}={}: {e}",
                    Path::new(&prebuilt).display()
                ))
            });
        }
        None => {
            build_component(&out, &guest_dir, &wit_dir, &component);
            raise_parser_depth(&component);
        }
    }

    let bytes = fs::read(&component).unwrap_or_else(|e| fail(&format!("reading component: {e}")));
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let mut f = fs::File::create(out.join("component_digest.rs")).expect("OUT_DIR is writable");
    writeln!(f, "/// BLAKE3 of the embedded guest component.").unwrap();
    writeln!(f, "pub const COMPONENT_DIGEST: &str = \"{digest}\";").unwrap();
}

fn build_component(out: &Path, guest_dir: &Path, wit_dir: &Path, component: &Path) {
    let venv = target_dir(out).join("pycage-guest").join("venv");
    let componentize = ensure_componentize_py(&venv);

    // Build from a copy: componentize-py imports the app at build time, and the bytecode it
    // writes next to the sources would otherwise retrigger this build script.
    let src = out.join("guest-src");
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(&src).expect("OUT_DIR is writable");
    for file in GUEST_FILES {
        fs::copy(guest_dir.join(file), src.join(file))
            .unwrap_or_else(|e| fail(&format!("copying guest-python/{file}: {e}")));
    }

    let status = Command::new(&componentize)
        .arg("-d")
        .arg(wit_dir)
        .args(["-w", "sandbox", "componentize", "pycage_wasm", "-p"])
        .arg(&src)
        .arg("-o")
        .arg(component)
        .env_remove("VIRTUAL_ENV")
        .current_dir(&src)
        .status()
        .unwrap_or_else(|e| fail(&format!("running componentize-py: {e}")));
    if !status.success() {
        fail(&format!(
            "componentize-py failed ({status}); see its output above"
        ));
    }
}

/// CPython's parser for WASI is built with `MAXSTACK` 4000 (6000 elsewhere): each parser rule
/// counts its depth against that constant, which stops at about 143 nested parentheses,
/// where native CPython accepts the tokenizer's limit of 200. Since Python 3.14 every rule also
/// checks the real C stack right after the counter (`p->level++ == MAXSTACK ||
/// _Py_ReachedRecursionLimitWithMargin(...)`), so the counter is not what keeps the stack
/// safe. This patch gives the WASI parser the native constant: in each rule's check, the
/// `i32.const 4000; i32.eq; br_if 0; call` sequence becomes `i32.const 6000` (both constants
/// are two-byte LEB128, so the binary keeps its layout). The guest's stack guard still ends
/// deeper nesting with a clean error.
fn raise_parser_depth(component: &Path) {
    use wasmparser::{Operator, Parser, Payload};
    const OLD: i32 = 4000;
    const NEW: [u8; 2] = [0xf0, 0x2e]; // LEB128 of 6000
    let mut bytes =
        fs::read(component).unwrap_or_else(|e| fail(&format!("reading component: {e}")));
    let mut sites = Vec::new();
    for payload in Parser::new(0).parse_all(&bytes) {
        let Ok(Payload::CodeSectionEntry(body)) = payload else {
            continue;
        };
        let Ok(reader) = body.get_operators_reader() else {
            continue;
        };
        let ops: Vec<(Operator, usize)> = reader
            .into_iter_with_offsets()
            .filter_map(Result::ok)
            .collect();
        for w in ops.windows(4) {
            if let [
                (Operator::I32Const { value: OLD }, at),
                (Operator::I32Eq, _),
                (Operator::BrIf { relative_depth: 0 }, _),
                (Operator::Call { .. }, _),
            ] = w
            {
                sites.push(*at);
            }
        }
    }
    // componentize-py 0.25.1 has one site per parser rule; far fewer means the pattern no
    // longer describes this interpreter, and patching blindly would be wrong.
    if sites.len() < 300 {
        fail(&format!(
            "found {} parser depth checks to raise; expected about 485",
            sites.len()
        ));
    }
    for at in sites {
        if bytes[at..at + 3] != [0x41, 0xa0, 0x1f] {
            fail(&format!(
                "unexpected bytes at offset {at} while raising the parser depth"
            ));
        }
        bytes[at + 1..at + 3].copy_from_slice(&NEW);
    }
    fs::write(component, &bytes).unwrap_or_else(|e| fail(&format!("writing component: {e}")));
}

/// The virtualenv's componentize-py, installing it first when missing or of another version.
fn ensure_componentize_py(venv: &Path) -> PathBuf {
    let bin = venv.join("bin");
    let componentize = bin.join("componentize-py");
    let stamp = venv.join("pycage-installed.txt");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(COMPONENTIZE_PY) && componentize.exists()
    {
        return componentize;
    }
    let python = env::var(ENV_PYTHON).unwrap_or_else(|_| "python3".into());
    println!(
        "cargo:warning=installing {COMPONENTIZE_PY} into {} (once)",
        venv.display()
    );
    run(
        Command::new(&python)
            .args(["-m", "venv", "--clear"])
            .arg(venv),
        "creating the virtualenv",
    );
    run(
        Command::new(bin.join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(COMPONENTIZE_PY),
        "installing componentize-py",
    );
    fs::write(&stamp, COMPONENTIZE_PY).expect("the virtualenv is writable");
    componentize
}

fn run(cmd: &mut Command, what: &str) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("{what} failed ({s})")),
        Err(e) => fail(&format!("{what}: {e}")),
    }
}

/// `<target>/<profile>` from `<target>/<profile>/build/<pkg>-<hash>/out`.
fn target_dir(out: &Path) -> PathBuf {
    out.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.to_path_buf())
}

fn fail(message: &str) -> ! {
    eprintln!("error: building the pycage guest: {message}");
    eprintln!("hint: set {ENV_COMPONENT}=/path/to/pycage-guest.wasm to use a prebuilt component");
    std::process::exit(1);
}

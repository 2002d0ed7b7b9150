//! The environment probe: what code run through a backend finds there, asked of the backend
//! itself by running one fixed snippet (`probe.py`) through the runner.
//!
//! The answer is guest output, so it is untrusted like any run's value: every field is
//! checked, module names are kept only when they are in the host's own lists, and anything
//! else is [`DescribeError::Malformed`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::DescribeError;
use crate::{ErrorKind, InputFile, Limits, RunRequest, RunResult, Runner};

/// The public top-level modules of CPython's standard library, 3.11 to 3.14 (the union of
/// their `sys.stdlib_module_names` without the private `_` names). The probe tries to import
/// each that its interpreter names (but `this` and `antigravity`, which do more than import,
/// and the Windows-only modules elsewhere), and the text names those that fail: what cannot be
/// imported, since everything else can.
#[rustfmt::skip]
pub const STDLIB_MODULES: &[&str] = &[
    "abc", "aifc", "annotationlib", "antigravity", "argparse", "array", "ast", "asynchat",
    "asyncio", "asyncore", "atexit", "audioop", "base64", "bdb", "binascii", "bisect", "builtins",
    "bz2", "cProfile", "calendar", "cgi", "cgitb", "chunk", "cmath", "cmd", "code", "codecs",
    "codeop", "collections", "colorsys", "compileall", "compression", "concurrent", "configparser",
    "contextlib", "contextvars", "copy", "copyreg", "crypt", "csv", "ctypes", "curses",
    "dataclasses", "datetime", "dbm", "decimal", "difflib", "dis", "distutils", "doctest", "email",
    "encodings", "ensurepip", "enum", "errno", "faulthandler", "fcntl", "filecmp", "fileinput",
    "fnmatch", "fractions", "ftplib", "functools", "gc", "genericpath", "getopt", "getpass",
    "gettext", "glob", "graphlib", "grp", "gzip", "hashlib", "heapq", "hmac", "html", "http",
    "idlelib", "imaplib", "imghdr", "imp", "importlib", "inspect", "io", "ipaddress", "itertools",
    "json", "keyword", "lib2to3", "linecache", "locale", "logging", "lzma", "mailbox", "mailcap",
    "marshal", "math", "mimetypes", "mmap", "modulefinder", "msilib", "msvcrt", "multiprocessing",
    "netrc", "nis", "nntplib", "nt", "ntpath", "nturl2path", "numbers", "opcode", "operator",
    "optparse", "os", "ossaudiodev", "pathlib", "pdb", "pickle", "pickletools", "pipes", "pkgutil",
    "platform", "plistlib", "poplib", "posix", "posixpath", "pprint", "profile", "pstats", "pty",
    "pwd", "py_compile", "pyclbr", "pydoc", "pydoc_data", "pyexpat", "queue", "quopri", "random",
    "re", "readline", "reprlib", "resource", "rlcompleter", "runpy", "sched", "secrets", "select",
    "selectors", "shelve", "shlex", "shutil", "signal", "site", "smtpd", "smtplib", "sndhdr",
    "socket", "socketserver", "spwd", "sqlite3", "sre_compile", "sre_constants", "sre_parse", "ssl",
    "stat", "statistics", "string", "stringprep", "struct", "subprocess", "sunau", "symtable",
    "sys", "sysconfig", "syslog", "tabnanny", "tarfile", "telnetlib", "tempfile", "termios",
    "textwrap", "this", "threading", "time", "timeit", "tkinter", "token", "tokenize", "tomllib",
    "trace", "traceback", "tracemalloc", "tty", "turtle", "turtledemo", "types", "typing",
    "unicodedata", "unittest", "urllib", "uu", "uuid", "venv", "warnings", "wave", "weakref",
    "webbrowser", "winreg", "winsound", "wsgiref", "xdrlib", "xml", "xmlrpc", "zipapp", "zipfile",
    "zipimport", "zlib", "zoneinfo",
];

/// The third-party packages the probe looks for (found, not imported: importing them costs
/// seconds).
pub const PROBED_PACKAGES: &[&str] = &[
    "numpy",
    "pandas",
    "scipy",
    "sympy",
    "matplotlib",
    "PIL",
    "sklearn",
    "requests",
    "yaml",
    "bs4",
];

const PROBE: &str = include_str!("probe.py");
const INPUT_NAME: &str = "pycage-probe-input.txt";
const OUTPUT_NAME: &str = "pycage-probe-output.txt";

/// What code run through a backend finds, as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Environment {
    /// The interpreter's version, `major.minor.micro` (`3.14.0`).
    pub python_version: String,
    /// The implementation (`cpython`).
    pub implementation: String,
    /// `sys.platform` (`wasi`, `linux`).
    pub platform: String,
    /// The modules of [`STDLIB_MODULES`] that do not import.
    pub unavailable_modules: Vec<String>,
    /// The packages of [`PROBED_PACKAGES`] that are installed.
    pub third_party: Vec<String>,
    /// The packages baked into a custom guest, one Markdown phrase each (see
    /// [`Backend::packages`](crate::Backend::packages)).
    #[serde(default)]
    pub packages: Vec<String>,
    /// True when the code can start a subprocess.
    pub subprocesses: bool,
    /// True when the code can start a thread.
    pub threads: bool,
    /// True when the kernel has a route to the internet for the code (no packet is sent to
    /// find out).
    pub network: bool,
    /// The code's working directory (`/work` when that is where `.` is).
    pub working_directory: String,
    /// True when input files reach the working directory.
    pub input_files: bool,
    /// True when the files the code writes come back in the result.
    pub returns_files: bool,
}

/// What the probe snippet returns.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    python_version: String,
    implementation: String,
    platform: String,
    unavailable_modules: Vec<String>,
    third_party: Vec<String>,
    subprocesses: bool,
    threads: bool,
    network: bool,
    working_directory: String,
    sees_input_file: bool,
    writes_files: bool,
}

/// Runs the probe through `runner`'s backend, with default limits (the runner's own may be
/// too tight for it). A backend that refuses input files is asked again without one.
pub(crate) async fn probe(runner: &Runner) -> Result<Environment, DescribeError> {
    let mut result = runner.run_request(request(true)).await;
    let mut gave_input = true;
    if result.error.as_ref().map(|e| e.kind) == Some(ErrorKind::InvalidInput) {
        result = runner.run_request(request(false)).await;
        gave_input = false;
    }
    read(result, gave_input)
}

fn request(with_input: bool) -> RunRequest {
    let names = |list: &[&str]| Value::from(list.to_vec());
    let mut vars = Map::new();
    vars.insert("_probe_stdlib".into(), names(STDLIB_MODULES));
    vars.insert("_probe_third_party".into(), names(PROBED_PACKAGES));
    vars.insert(
        "_probe_input".into(),
        json!(if with_input { INPUT_NAME } else { "" }),
    );
    vars.insert("_probe_output".into(), json!(OUTPUT_NAME));
    let request = RunRequest::new(PROBE).vars(vars).limits(Limits::default());
    if with_input {
        request.file(InputFile::new(INPUT_NAME, b"probe".to_vec()))
    } else {
        request
    }
}

/// The environment from the probe's result, every field checked.
pub(crate) fn read(result: RunResult, gave_input: bool) -> Result<Environment, DescribeError> {
    if let Some(error) = result.error {
        return Err(DescribeError::Probe {
            backend: result.backend,
            error,
        });
    }
    let answer: Answer = serde_json::from_value(result.value)
        .map_err(|e| DescribeError::Malformed(format!("the probe's answer: {e}")))?;
    let malformed = |field: &str| DescribeError::Malformed(format!("the probe's `{field}`"));
    if !is_version(&answer.python_version) {
        return Err(malformed("python_version"));
    }
    for (field, value) in [
        ("implementation", &answer.implementation),
        ("platform", &answer.platform),
    ] {
        if !is_word(value) {
            return Err(malformed(field));
        }
    }
    if !is_directory(&answer.working_directory) {
        return Err(malformed("working_directory"));
    }
    let returns_files =
        answer.writes_files && result.files.iter().any(|file| file.path == OUTPUT_NAME);
    Ok(Environment {
        python_version: answer.python_version,
        implementation: answer.implementation,
        platform: answer.platform,
        unavailable_modules: known(STDLIB_MODULES, &answer.unavailable_modules),
        third_party: known(PROBED_PACKAGES, &answer.third_party),
        packages: Vec::new(),
        subprocesses: answer.subprocesses,
        threads: answer.threads,
        network: answer.network,
        working_directory: answer.working_directory,
        input_files: gave_input && answer.sees_input_file,
        returns_files,
    })
}

/// The names of `list` that `found` holds, in `list`'s order: nothing the guest made up
/// reaches a model's prompt.
fn known(list: &[&str], found: &[String]) -> Vec<String> {
    list.iter()
        .filter(|name| found.iter().any(|f| f == *name))
        .map(|name| (*name).to_owned())
        .collect()
}

/// `3.14.0`: three numbers of at most four digits each.
fn is_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| (1..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A short ASCII word (`cpython`, `wasi`, `linux`).
fn is_word(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An absolute path (`/work`, `C:\work`) of printable characters, short enough for a prompt.
fn is_directory(text: &str) -> bool {
    let bytes = text.as_bytes();
    let absolute = bytes.first() == Some(&b'/')
        || (bytes.len() >= 3 && bytes[0].is_ascii_alphabetic() && &bytes[1..3] == b":\\");
    absolute && text.len() <= 256 && !text.chars().any(char::is_control)
}

//! `pycage run`: resolve the arguments into a runner and a request, run, report.

use pycage::{ErrorKind, InputFile, Limits, RunRequest, RunResult, Runner, WasmBackend};
use pycage_tools::json::{self, JsonError};
use serde_json::{Map, Value};
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::cli::RunArgs;
use crate::exit::Exit;
use crate::{report, sandbox};

/// What a `run` needs, resolved from the arguments.
struct RunSettings {
    code: String,
    runner: Runner,
    vars: Map<String, Value>,
    limits: Limits,
    files: Vec<InputFile>,
    json: bool,
    json_files: bool,
    out_dir: Option<PathBuf>,
    force: bool,
    /// The wasm backend, when that is the one in use (for the first-run notice).
    wasm: Option<WasmBackend>,
}

pub async fn run(args: RunArgs) -> Exit {
    let settings = match resolve(args) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("pycage: {message}");
            return Exit::Usage;
        }
    };
    if let Err(message) = sandbox::check_ready(&settings.runner, settings.wasm.as_ref()) {
        eprintln!("pycage: {message}");
        return Exit::Internal;
    }
    let request = RunRequest::new(settings.code)
        .vars(settings.vars)
        .files(settings.files)
        .limits(settings.limits);
    let result = settings.runner.run_request(request).await;
    if settings.json {
        report::json(&result, settings.json_files);
    } else {
        report::human(&result);
    }
    if let Some(dir) = &settings.out_dir
        && let Err(e) = report::write_files(&result.files, dir, settings.force)
    {
        eprintln!("pycage: --out-dir {}: {e}", dir.display());
        return Exit::Usage;
    }
    exit_of(&result)
}

/// How `pycage run` exits for `result`.
pub(crate) fn exit_of(result: &RunResult) -> Exit {
    match result.error.as_ref().map(|e| e.kind) {
        None => Exit::Ok,
        Some(ErrorKind::InvalidInput) => Exit::Usage,
        Some(ErrorKind::BackendError) => Exit::Internal,
        Some(_) => Exit::GuestFailed,
    }
}

fn resolve(args: RunArgs) -> Result<RunSettings, String> {
    let code = read_code(args.file.as_deref(), args.code)?;
    let vars = parse_vars(&args.vars)?;

    let (tools, policy) = sandbox::tools(&args.sandbox)?;
    let limits = sandbox::limits(&args.sandbox)?;
    let files = read_files(&args.files, &limits)?;
    let (runner, wasm) = sandbox::runner(&args.sandbox, tools, policy, limits.clone())?;
    Ok(RunSettings {
        code,
        runner,
        vars,
        limits,
        files,
        json: args.json,
        json_files: args.json_files,
        out_dir: args.out_dir,
        force: args.force,
        wasm,
    })
}

/// The `--file` inputs: `NAME=PATH`, or a bare `PATH` named after the file. A host file over
/// the input budget is refused before it is read.
fn read_files(specs: &[String], limits: &Limits) -> Result<Vec<InputFile>, String> {
    let mut files = Vec::new();
    for spec in specs {
        let (name, path) = match spec.split_once('=') {
            Some((name, path)) => (name.to_owned(), PathBuf::from(path)),
            None => {
                let path = PathBuf::from(spec);
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| format!("--file {spec}: give NAME=PATH (no file name here)"))?
                    .to_owned();
                (name, path)
            }
        };
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("--file {}: {e}", path.display()))?
            .len();
        if size > limits.max_input_bytes() {
            return Err(format!(
                "--file {}: {size} bytes; the input limit is {}",
                path.display(),
                limits.max_input_bytes()
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("--file {}: {e}", path.display()))?;
        files.push(InputFile::new(name, bytes));
    }
    Ok(files)
}

pub(crate) fn read_code(file: Option<&Path>, code: Option<String>) -> Result<String, String> {
    if let Some(code) = code {
        return Ok(code);
    }
    let (bytes, name) = match file {
        Some(p) if p == Path::new("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("reading standard input: {e}"))?;
            (buf, "standard input".to_owned())
        }
        Some(p) => (
            std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))?,
            p.display().to_string(),
        ),
        None => return Err("give a FILE, `-` for standard input, or -c CODE".into()),
    };
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{name} is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

fn parse_vars(specs: &[String]) -> Result<Map<String, Value>, String> {
    let mut vars = Map::new();
    for spec in specs {
        let Some((name, json)) = spec.split_once('=') else {
            return Err(format!("--var `{spec}`: expected NAME=JSON"));
        };
        let value = json::parse(json.as_bytes(), json::MAX_DEPTH).map_err(|e| match e {
            JsonError::Syntax => {
                format!("--var {name}: the value is not JSON; quote strings: {name}='\"text\"'")
            }
            other => format!("--var {name}: in the value, {other}"),
        })?;
        if vars.insert(name.to_owned(), value).is_some() {
            return Err(format!("--var {name} is given twice"));
        }
    }
    Ok(vars)
}

//! `pycage run`: resolve the arguments into a runner and a request, run, report.

use pycage::{
    ErrorKind, InputFile, Journal, JournalKey, Limits, OnDivergence, RunRequest, RunResult, Runner,
    WasmBackend,
};
use pycage_tools::json::{self, JsonError};
use serde_json::{Map, Value};
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::cli::{Divergence, JournalArgs, OutputArgs, RunArgs};
use crate::exit::Exit;
use crate::{report, sandbox};

/// What a `run` needs, resolved from the arguments.
struct RunSettings {
    code: String,
    runner: Runner,
    vars: Map<String, Value>,
    limits: Limits,
    files: Vec<InputFile>,
    replay: Option<Journal>,
    on_divergence: OnDivergence,
    journal: JournalArgs,
    output: OutputArgs,
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
    let mut request = RunRequest::new(settings.code)
        .vars(settings.vars)
        .files(settings.files)
        .limits(settings.limits)
        .on_divergence(settings.on_divergence);
    if settings.journal.journal_out.is_some() {
        request = request.record_journal();
    }
    if let Some(journal) = settings.replay {
        request = request.replay(journal);
    }
    let result = settings.runner.run_request(request).await;
    report(&result, &settings.journal, &settings.output)
}

/// Reports a run's result as `output` asks, writes its journal and suspended state where
/// `journal` says, and gives the exit: `pycage run`'s and `pycage resume`'s end.
pub(crate) fn report(result: &RunResult, journal: &JournalArgs, output: &OutputArgs) -> Exit {
    if output.json {
        report::json(result, output.json_files);
    } else {
        report::human(result);
    }
    let mut exit = exit_of(result);
    if let Some(dir) = &output.out_dir
        && let Err(e) = report::write_files(&result.files, dir, output.force)
    {
        eprintln!("pycage: --out-dir {}: {e}", dir.display());
        exit = Exit::Usage;
    }
    if let (Some(path), Some(recorded)) = (&journal.journal_out, &result.journal)
        && let Err(e) = write_json(path, recorded)
    {
        eprintln!("pycage: --journal-out {}: {e}", path.display());
        exit = Exit::Usage;
    }
    if let Some(state) = &result.suspended {
        match &journal.suspend_out {
            Some(path) => match write_json(path, state) {
                Ok(()) => eprintln!(
                    "pycage: suspended; its state is in {}: pycage resume {} --approve | --deny \
                     | --answer JSON",
                    path.display(),
                    path.display()
                ),
                Err(e) => {
                    eprintln!("pycage: --suspend-out {}: {e}", path.display());
                    exit = Exit::Usage;
                }
            },
            None if !output.json => eprintln!(
                "pycage: suspended; pass --suspend-out FILE (or --json) to keep its state for \
                 `pycage resume`"
            ),
            None => {}
        }
    }
    exit
}

/// `value` as pretty JSON in a new file at `path`, readable by its owner only (a journal or
/// a suspended state holds the code, its inputs and every call's arguments), replacing one
/// there atomically.
fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), String> {
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // tempfile makes the file with mode 0600 on Unix; `persist` renames it into place.
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| e.to_string())?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .map_err(|e| e.to_string())?;
    file.persist(path).map_err(|e| e.error.to_string())?;
    Ok(())
}

/// The journal key `args` names (or the user's default key file), when the run signs or
/// checks anything with it.
pub(crate) fn journal_key(args: &JournalArgs) -> Result<JournalKey, String> {
    let path = journal_key_path(args)?;
    JournalKey::load_or_create(&path).map_err(|e| format!("--journal-key: {e}"))
}

/// Where the journal key `args` names lives (or the user's default key file).
pub(crate) fn journal_key_path(args: &JournalArgs) -> Result<PathBuf, String> {
    match &args.journal_key {
        Some(path) => Ok(path.clone()),
        None => JournalKey::default_path().ok_or_else(|| {
            "no configuration directory is known for the journal key; pass --journal-key FILE"
                .into()
        }),
    }
}

/// How `pycage run` exits for `result`.
pub(crate) fn exit_of(result: &RunResult) -> Exit {
    match result.error.as_ref().map(|e| e.kind) {
        None => Exit::Ok,
        Some(ErrorKind::InvalidInput) => Exit::Usage,
        Some(ErrorKind::BackendError) => Exit::Internal,
        Some(ErrorKind::Suspended) => Exit::Suspended,
        Some(_) => Exit::GuestFailed,
    }
}

fn resolve(args: RunArgs) -> Result<RunSettings, String> {
    let code = read_code(args.file.as_deref(), args.code)?;
    let vars = parse_vars(&args.vars)?;

    let (tools, mut policy) = sandbox::tools(&args.sandbox)?;
    policy.approve = args.approve;
    let limits = sandbox::limits(&args.sandbox)?;
    let files = read_files(&args.files, &limits)?;
    let replay = match &args.replay {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--replay {}: {e}", path.display()))?;
            Some(
                Journal::from_json(&text)
                    .map_err(|e| format!("--replay {}: {e}", path.display()))?,
            )
        }
        None => None,
    };
    let signs = args.journal.journal_out.is_some()
        || args.journal.suspend_out.is_some()
        || replay.is_some()
        || !policy.approve.is_empty();
    let key = signs.then(|| journal_key(&args.journal)).transpose()?;
    let (runner, wasm) = sandbox::runner(&args.sandbox, tools, policy, limits.clone(), key)?;
    Ok(RunSettings {
        code,
        runner,
        vars,
        limits,
        files,
        replay,
        on_divergence: match args.on_divergence {
            Some(Divergence::Live) => OnDivergence::GoLive,
            Some(Divergence::Fail) | None => OnDivergence::Fail,
        },
        journal: args.journal,
        output: args.output,
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

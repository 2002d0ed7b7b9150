//! `pycage resume`: finish a run suspended at a call that waits for approval.
//!
//! Each state resumes once and only while it is young: its id (under the signature) is
//! claimed in a ledger beside the journal key before the run goes on (`<key>.resumed/<id>`,
//! made with `create_new`, so two resumes of one state cannot both win), and a state older
//! than `--max-age` (24 h unless told; at most [`MAX_AGE_LIMIT`]) is refused. A copy of the
//! file, or the same file given again, does not approve the call a second time.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pycage::{Decision, JournalKey, Suspended};
use pycage_tools::units::format_duration;

use crate::cli::ResumeArgs;
use crate::exit::Exit;
use crate::{run, sandbox};

/// How old a suspended state may be unless `--max-age` says.
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The largest `--max-age`; ledger entries older than this are removed (the states they
/// name are refused by age then).
const MAX_AGE_LIMIT: Duration = Duration::from_secs(30 * 24 * 3600);

pub async fn resume(args: ResumeArgs) -> Exit {
    let prepared = resolve(args);
    let Prepared {
        runner,
        wasm,
        state,
        decision,
        key,
        ledger,
        max_age,
        args,
    } = match prepared {
        Ok(prepared) => prepared,
        Err(message) => {
            eprintln!("pycage: {message}");
            return Exit::Usage;
        }
    };
    if let Err(message) = sandbox::check_ready(&runner, wasm.as_ref()) {
        eprintln!("pycage: {message}");
        return Exit::Internal;
    }
    // A state that does not verify is refused by the runner, as a result; one that does is
    // claimed first, so it goes on at most once.
    if state.verify(&key).is_ok()
        && let Err(message) = claim(&state, &ledger, max_age, now())
    {
        eprintln!("pycage: {message}");
        return Exit::Usage;
    }
    let result = runner.resume(state, decision).await;
    run::report(&result, &args.journal, &args.output)
}

struct Prepared {
    runner: pycage::Runner,
    wasm: Option<pycage::WasmBackend>,
    state: Suspended,
    decision: Decision,
    key: JournalKey,
    ledger: PathBuf,
    max_age: Duration,
    args: ResumeArgs,
}

fn resolve(mut args: ResumeArgs) -> Result<Prepared, String> {
    let text = run::read_code(Some(&args.file), None)?;
    let state = Suspended::from_json(&text).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let decision = if args.decision.approve {
        Decision::Approve
    } else if args.decision.deny {
        Decision::Deny
    } else {
        let answer = args.decision.answer.as_deref().unwrap_or_default();
        let value = pycage_tools::json::parse(answer.as_bytes(), pycage_tools::json::MAX_DEPTH)
            .map_err(|e| format!("--answer: {e}; quote a string: --answer '\"text\"'"))?;
        Decision::Answer(value)
    };
    let max_age = args.max_age.unwrap_or(DEFAULT_MAX_AGE);
    if max_age > MAX_AGE_LIMIT {
        return Err(format!(
            "--max-age {} is above the limit of {}",
            format_duration(max_age),
            format_duration(MAX_AGE_LIMIT)
        ));
    }
    // The run re-executes as it ran: with its seed, unless the flags name one (a different
    // seed is refused by the runner, saying so).
    if args.sandbox.seed().is_none() {
        args.sandbox.seed = state.seed;
    }
    let (tools, policy) = sandbox::tools(&args.sandbox)?;
    let limits = sandbox::limits(&args.sandbox)?;
    let key_path = run::journal_key_path(&args.journal)?;
    let key = run::journal_key(&args.journal)?;
    let (runner, wasm) = sandbox::runner(&args.sandbox, tools, policy, limits, Some(key.clone()))?;
    Ok(Prepared {
        runner,
        wasm,
        state,
        decision,
        key,
        ledger: ledger_of(&key_path),
        max_age,
        args,
    })
}

/// The ledger of resumed states beside the key file at `key`: `<key>.resumed`.
fn ledger_of(key: &Path) -> PathBuf {
    let mut name = key.file_name().unwrap_or_default().to_owned();
    name.push(".resumed");
    key.with_file_name(name)
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Claims `state` for one resume at time `now`: refused when it has no id, is older than
/// `max_age`, or was claimed before.
fn claim(state: &Suspended, ledger: &Path, max_age: Duration, now: u64) -> Result<(), String> {
    let id_ok = state.id.len() == 32 && state.id.bytes().all(|c| c.is_ascii_hexdigit());
    if !id_ok || state.suspended_at == 0 {
        return Err(
            "this suspended state has no id or time (an older pycage wrote it), so it cannot \
             be resumed only once: run the code again"
                .into(),
        );
    }
    let age = Duration::from_secs(now.saturating_sub(state.suspended_at));
    if age > max_age {
        return Err(format!(
            "this suspended state is {} old, past --max-age {}: run the code again (or give \
             a larger --max-age, up to {})",
            format_duration(age),
            format_duration(max_age),
            format_duration(MAX_AGE_LIMIT)
        ));
    }
    let cannot =
        |e: std::io::Error| format!("the ledger of resumed states {}: {e}", ledger.display());
    let mut dir = std::fs::DirBuilder::new();
    dir.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut dir, 0o700);
    dir.create(ledger).map_err(cannot)?;
    prune(ledger);
    let entry = ledger.join(&state.id);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&entry)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!(
            "this suspended run was resumed before (its id is in {}); a state resumes once: \
             run the code again",
            ledger.display()
        )),
        Err(e) => Err(cannot(e)),
    }
}

/// Removes the ledger's entries older than [`MAX_AGE_LIMIT`]: their states are refused by
/// age anyway. Best effort: an entry that cannot be read or removed stays.
fn prune(ledger: &Path) {
    let Ok(entries) = std::fs::read_dir(ledger) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > MAX_AGE_LIMIT);
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
#[path = "resume_tests.rs"]
mod tests;

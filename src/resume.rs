//! `pycage resume`: finish a run suspended at a call that waits for approval.

use pycage::{Decision, Suspended};

use crate::cli::ResumeArgs;
use crate::exit::Exit;
use crate::{run, sandbox};

pub async fn resume(args: ResumeArgs) -> Exit {
    let prepared = resolve(args);
    let (runner, wasm, state, decision, args) = match prepared {
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
    let result = runner.resume(state, decision).await;
    run::report(&result, &args.journal, &args.output)
}

type Prepared = (
    pycage::Runner,
    Option<pycage::WasmBackend>,
    Suspended,
    Decision,
    ResumeArgs,
);

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
    // The run re-executes as it ran: with its seed, unless the flags name one (a different
    // seed is refused by the runner, saying so).
    if args.sandbox.seed().is_none() {
        args.sandbox.seed = state.seed;
    }
    let (tools, policy) = sandbox::tools(&args.sandbox)?;
    let limits = sandbox::limits(&args.sandbox)?;
    let key = run::journal_key(&args.journal)?;
    let (runner, wasm) = sandbox::runner(&args.sandbox, tools, policy, limits, Some(key))?;
    Ok((runner, wasm, state, decision, args))
}

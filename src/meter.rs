//! `pycage meter FILE...`: each program in a fresh deterministic sandbox, scored by fuel.
//!
//! Fuel is the cost figure: in deterministic mode the same program, inputs and seed take the
//! same fuel on any machine and under any load, where seconds vary with both. The wall time is
//! printed beside it for reference only.

use pycage::RunResult;
use serde_json::json;

use crate::cli::MeterArgs;
use crate::exit::Exit;
use crate::{run, sandbox};

pub async fn meter(mut args: MeterArgs) -> Exit {
    args.sandbox.deterministic = true;
    let seed = args.sandbox.seed().unwrap_or(0);
    // Every file is read before the first runs, so a typo does not cost a long benchmark.
    let mut programs = Vec::with_capacity(args.files.len());
    for file in &args.files {
        match run::read_code(Some(file), None) {
            Ok(code) => programs.push((file.display().to_string(), code)),
            Err(message) => {
                eprintln!("pycage: {message}");
                return Exit::Usage;
            }
        }
    }
    let runner = match sandbox::ready_runner(&args.sandbox) {
        Ok(runner) => runner,
        Err(exit) => return exit,
    };
    let mut exit = Exit::Ok;
    let mut total_fuel: u64 = 0;
    for (name, code) in &programs {
        let result = runner.run(code).await;
        total_fuel = total_fuel.saturating_add(result.fuel_consumed.unwrap_or(0));
        report(name, seed, &result, args.json);
        exit = worst(exit, &result);
    }
    if !args.json && programs.len() > 1 {
        println!(
            "total  fuel {total_fuel}  ({} programs, seed {seed})",
            programs.len()
        );
    }
    exit
}

fn report(name: &str, seed: u64, result: &RunResult, as_json: bool) {
    let digest = blake3::hash(result.stdout.as_bytes()).to_hex();
    let status = result.error.as_ref().map_or("ok", |e| e.kind.as_str());
    let ms = result.duration.as_secs_f64() * 1000.0;
    if as_json {
        let line = json!({
            "file": name,
            "status": status,
            "fuel": result.fuel_consumed,
            "stdout_blake3": digest.as_str(),
            "stdout_bytes": result.stdout.len(),
            "stdout_truncated": result.stdout_truncated,
            "seed": seed,
            "error": result.error,
            "duration_ms": ms,
        });
        println!("{line}");
    } else {
        let fuel = result
            .fuel_consumed
            .map_or_else(|| "-".to_owned(), |f| f.to_string());
        println!(
            "{name}  {status}  fuel {fuel}  stdout {}  ({ms:.1} ms)",
            &digest.as_str()[..16]
        );
    }
}

/// The exit of a batch: the worst of its runs, as `pycage run` would exit for each.
fn worst(so_far: Exit, result: &RunResult) -> Exit {
    let this = run::exit_of(result);
    if this as u8 > so_far as u8 {
        this
    } else {
        so_far
    }
}

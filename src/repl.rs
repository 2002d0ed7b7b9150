//! `pycage repl`: a session on a terminal, so a person can try the sandbox by hand.
//!
//! Each entry runs in one session (variables, imports and files persist). A one-line entry
//! is first tried as an expression (`return (...)`), and its value is echoed as JSON, as
//! Python's own prompt echoes a value; when that does not compile (a statement), the entry
//! runs as it is. A syntax error is found before any code runs, so nothing runs twice. A
//! block (a line ending in `:`) continues until an empty line.

use pycage::{ErrorKind, Limits, RunResult, Runner, Session};
use pycage_tools::units::{format_duration, format_size};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::cli::ReplArgs;
use crate::exit::Exit;
use crate::sandbox;

pub async fn repl(args: ReplArgs) -> Exit {
    let runner = match sandbox::ready_runner(&args.sandbox) {
        Ok(runner) => runner,
        Err(exit) => return exit,
    };
    let mut session = match open(&runner).await {
        Ok(s) => s,
        Err(exit) => return exit,
    };
    let mut editor = match DefaultEditor::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("pycage: cannot read the terminal: {e}");
            return Exit::Internal;
        }
    };
    println!(
        "pycage repl: one session on the {} backend; state persists between entries. \
         `exit` or Ctrl-D leaves.\n[each run: {}]",
        runner.backend().name(),
        limits_line(runner.limits())
    );
    let mut block = String::new();
    loop {
        let prompt = if block.is_empty() { ">>> " } else { "... " };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                block.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("pycage: cannot read the terminal: {e}");
                return Exit::Internal;
            }
        };
        if block.is_empty() && matches!(line.trim(), "exit" | "quit" | "exit()" | "quit()") {
            break;
        }
        let _ = editor.add_history_entry(line.as_str());
        if !block.is_empty() || line.trim_end().ends_with(':') {
            if !line.trim().is_empty() {
                block.push_str(&line);
                block.push('\n');
                continue;
            }
        } else {
            block.push_str(&line);
        }
        let entry = std::mem::take(&mut block);
        if entry.trim().is_empty() {
            continue;
        }
        let result = run_entry(&session, &entry).await;
        show(&result, runner.limits());
        if result.session_ended || session.ended().is_some() {
            println!("[the session ended; a new one starts, with nothing in it]");
            session = match open(&runner).await {
                Ok(s) => s,
                Err(exit) => return exit,
            };
        }
    }
    Exit::Ok
}

async fn open(runner: &Runner) -> Result<Session, Exit> {
    runner.session().await.map_err(|e| {
        eprintln!("pycage: no session on this backend: {e}");
        if e.kind == ErrorKind::Unsupported {
            Exit::Usage
        } else {
            Exit::Internal
        }
    })
}

/// Runs one entry: a single line as an expression first, else as it is.
async fn run_entry(session: &Session, entry: &str) -> RunResult {
    if !entry.contains('\n') {
        let as_expression = session.run(&format!("return ({entry}\n)")).await;
        let not_an_expression = as_expression
            .error
            .as_ref()
            .is_some_and(|e| e.kind == ErrorKind::SyntaxError);
        if !not_an_expression {
            return as_expression;
        }
    }
    session.run(entry).await
}

fn show(result: &RunResult, limits: &Limits) {
    print!("{}", result.stdout);
    if !result.stdout.is_empty() && !result.stdout.ends_with('\n') {
        println!();
    }
    eprint!("{}", result.stderr);
    if !result.value.is_null() {
        println!("{}", result.value);
    }
    for file in &result.files {
        println!("[wrote {} ({})]", file.path, format_size(file.size));
    }
    if let Some(error) = &result.error {
        match &error.traceback {
            Some(tb) => eprint!("{tb}"),
            None => eprintln!("{}: {}", error.kind, error.message),
        }
        if error.traceback.is_some() && error.kind != ErrorKind::GuestException {
            eprintln!("{}: {}", error.kind, error.message);
        }
        eprintln!("[limits of each run: {}]", limits_line(limits));
    }
}

/// The limits a person hits at a prompt, on one line.
fn limits_line(l: &Limits) -> String {
    let mut line = format!(
        "wall {}, memory {} (the session's), output {} each, {} tool calls",
        format_duration(l.wall_timeout()),
        format_size(l.memory_bytes()),
        format_size(l.max_output_bytes()),
        l.max_tool_calls()
    );
    if let Some(fuel) = l.fuel() {
        line.push_str(&format!(", fuel {fuel}"));
    }
    line
}

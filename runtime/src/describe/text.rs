//! The description's text: Markdown for a model, made from the facts alone.

use std::fmt::Write;

use pycage_tools::units::{format_duration, format_size};

use super::signature;
use super::{Environment, Persistence, ToolSignature};
use crate::Limits;
use crate::result::thousands;

/// The host's HTTP tool, named in the environment when it is exposed.
const FETCH_TOOL: &str = "net.fetch";

/// What the text is made from.
pub(crate) struct Facts<'a> {
    pub persistence: Persistence,
    pub environment: &'a Environment,
    pub limits: &'a Limits,
    pub tools: &'a [ToolSignature],
}

/// The whole text. Each section writes into one `String` (`fmt::Write` for a `String` cannot
/// fail, so its results are ignored).
pub(crate) fn render(facts: &Facts<'_>) -> String {
    let mut out = String::new();
    out.push_str(
        "Runs Python code in a sandbox and returns what it produced: the value the code \
         returns, its printed output, the error that ended it, and the files it wrote.\n",
    );
    environment(&mut out, facts.environment, facts.tools);
    files(&mut out, facts);
    code(&mut out, facts);
    tools(&mut out, facts.tools, facts.persistence);
    limits(&mut out, facts);
    out
}

fn environment(out: &mut String, env: &Environment, tools: &[ToolSignature]) {
    let _ = writeln!(out, "\n## Environment\n");
    let _ = writeln!(
        out,
        "- Python {} ({}, platform `{}`).",
        env.python_version, env.implementation, env.platform
    );
    if env.unavailable_modules.is_empty() {
        let _ = writeln!(out, "- The standard library can be imported.");
    } else {
        let _ = writeln!(
            out,
            "- The standard library can be imported, except {}.",
            code_list(&env.unavailable_modules)
        );
    }
    if !env.packages.is_empty() {
        let _ = writeln!(
            out,
            "- Third-party packages, baked into this sandbox (nothing else can be installed): {}.",
            env.packages.join(", ")
        );
    } else if env.third_party.is_empty() {
        let _ = writeln!(
            out,
            "- No third-party packages are installed (no {}).",
            code_list(&["numpy", "pandas"])
        );
    } else {
        let _ = writeln!(
            out,
            "- Third-party packages: {}.",
            code_list(&env.third_party)
        );
    }
    let importable = |m: &str| !env.unavailable_modules.iter().any(|u| u == m);
    let _ = writeln!(
        out,
        "- {}",
        match (env.network, importable("socket")) {
            (false, true) => {
                "No network access: `socket` imports, but there is no route to the internet."
            }
            (false, false) => "No network access.",
            (true, _) => "The network is reachable.",
        }
    );
    if tools.iter().any(|t| t.qualified == FETCH_TOOL) {
        let _ = writeln!(
            out,
            "- HTTP(S) requests go through the host's `{FETCH_TOOL}` tool (below), to the hosts it \
             lists only: `await fetch(url, ...)`, or `fetch_sync(url, ...)` without `await`; \
             `urllib.request.urlopen` uses it too. Every other host is blocked."
        );
    }
    let _ = writeln!(
        out,
        "- {}",
        match (env.subprocesses, importable("subprocess")) {
            (false, true) => "No subprocesses: `subprocess` imports, but cannot start one.",
            (false, false) => "No subprocesses.",
            (true, _) => "Subprocesses can be started.",
        }
    );
    let _ = writeln!(
        out,
        "- {}",
        match (env.threads, importable("threading")) {
            (false, true) => {
                "No threads: `threading` imports, but cannot start one (`asyncio` works)."
            }
            (false, false) => "No threads (`asyncio` works).",
            (true, _) => "Threads can be started.",
        }
    );
}

fn files(out: &mut String, facts: &Facts<'_>) {
    let env = facts.environment;
    let _ = writeln!(out, "\n## Files and state\n");
    let _ = write!(
        out,
        "- The working directory is `{}`.",
        env.working_directory
    );
    if env.input_files {
        out.push_str(" The files given in `files` are there when the code starts.");
    }
    if env.returns_files {
        out.push_str(
            " The files the code creates or changes there are returned after the run (names \
             and sizes).",
        );
    } else {
        out.push_str(" Files the code writes are not returned: return or print what matters.");
    }
    out.push('\n');
    let inputs = if env.input_files {
        "`vars` and `files`"
    } else {
        "`vars`"
    };
    match facts.persistence {
        Persistence::OneShot => {
            let _ = writeln!(
                out,
                "- Every call starts a fresh interpreter: nothing persists from one call to the \
                 next (no variables, imports or files). Pass what the code needs in {inputs}, \
                 and `return` what you need back."
            );
        }
        Persistence::Session => {
            let _ = writeln!(
                out,
                "- The calls share one session: global variables, functions, imports and the \
                 files in the working directory persist from one call to the next, until the \
                 session ends. {inputs} add to what is there. An exception, a `MemoryError` \
                 or a refused tool call leaves the session as it was. A call that passes its \
                 wall time is interrupted with `KeyboardInterrupt`, as in a notebook, and the \
                 session keeps what the code did so far; code that does not stop within half a \
                 second of it, or that runs out of fuel, ends the session, and every later \
                 call says `session_ended` (start again, passing what the code needs)."
            );
        }
        Persistence::OnRequest => {
            let _ = writeln!(
                out,
                "- A call without a `session_id` starts a fresh interpreter: nothing persists \
                 from it. To keep state, call `create_session` and pass the `session_id` it \
                 returns: the calls that pass it share one session, where global variables, \
                 functions, imports and the files in the working directory persist until the \
                 session ends, expires or is closed (`close_session`). {inputs} add to what is \
                 there. An exception, a `MemoryError` or a refused tool call leaves the \
                 session as it was. A call that passes its wall time is interrupted with \
                 `KeyboardInterrupt`, as in a notebook, and the session keeps what the code \
                 did so far; code that does not stop within half a second of it, or that runs \
                 out of fuel, ends the session, and later calls with its id say \
                 `session_ended`."
            );
        }
    }
}

fn code(out: &mut String, facts: &Facts<'_>) {
    let _ = writeln!(out, "\n## Writing the code\n");
    out.push_str(
        "- The code runs as a script in which top-level `await` and a top-level `return` are \
         allowed.\n\
         - The value the code `return`s is the result, as JSON: tuples and sets become lists, \
         dict keys become strings, other objects their `repr()`. Without `return` the result is \
         `null`.\n",
    );
    let _ = writeln!(
        out,
        "- `print()` output and stderr are returned, up to {} each (past that, the middle is \
         cut).",
        format_size(facts.limits.max_output_bytes())
    );
    out.push_str(
        "- The names given in `vars` are global variables when the code starts.\n\
         - An exception the code does not catch ends the run: its type, message and traceback \
         are returned.\n",
    );
}

fn tools(out: &mut String, tools: &[ToolSignature], persistence: Persistence) {
    let _ = writeln!(out, "\n## Tools\n");
    if tools.is_empty() {
        out.push_str("No tools are exposed: the code cannot reach the host.\n");
        return;
    }
    out.push_str(
        "Each tool is an `async` function in the code's globals: call it with keyword \
         arguments and `await` it (`r = await name(arg=value)`), or through its namespace \
         (`r = await namespace.name(arg=value)`; a variable or built-in of the namespace's \
         name takes precedence). `call_tool(name, **kwargs)` calls a tool by its name or \
         `namespace.name` without `await`. A tool returns JSON \
         (dicts, lists, strings, numbers); calls run one at a time. A refused or failed call \
         raises `ToolError`, whose `.kind` is `not-found`, `invalid-arguments`, `denied`, \
         `failed` or `limit-exceeded`.\n",
    );
    for tool in tools {
        let _ = writeln!(out, "\n### `{}`\n", tool.qualified);
        let _ = writeln!(out, "```python\n{}\n```\n", tool.signature);
        if tool.binding.is_none() {
            let _ = writeln!(
                out,
                "Its bare name is shared with another tool: call it as `await {0}(...)` \
                 or `call_tool(\"{0}\", ...)`.\n",
                tool.qualified
            );
        }
        let _ = writeln!(out, "{}", one_line(&tool.description));
        if tool.needs_approval {
            let _ = match persistence {
                Persistence::OneShot | Persistence::OnRequest => writeln!(
                    out,
                    "\nA call of it needs a person's approval: the run pauses there until the \
                     user decides (it may come back `suspended` meanwhile); then it resumes from \
                     its start (earlier calls answered as before) and the call returns the \
                     tool's result, the user's answer, or raises `ToolError` with kind \
                     `denied`. In a session such a call is always `denied`."
                ),
                Persistence::Session => writeln!(
                    out,
                    "\nA call of it needs a person's approval, which a session cannot wait \
                     for: in a session it raises `ToolError` with kind `denied`."
                ),
            };
        }
        let params = signature::parameters(&tool.parameters);
        if !params.is_empty() {
            out.push('\n');
        }
        for p in params {
            let need = if p.required { "required" } else { "optional" };
            let _ = write!(out, "- `{}` ({}, {need})", p.name, p.annotation);
            if let Some(d) = p.description {
                let _ = write!(out, ": {d}");
            }
            out.push('\n');
        }
    }
}

fn limits(out: &mut String, facts: &Facts<'_>) {
    let l = facts.limits;
    let _ = writeln!(out, "\n## Limits of each call\n");
    let _ = writeln!(
        out,
        "- Wall time: {} (time waiting for tools included); past it the run is stopped.",
        format_duration(l.wall_timeout())
    );
    let whole = match facts.persistence {
        Persistence::OneShot => "",
        Persistence::Session => ", for the whole session (what earlier calls keep counts)",
        Persistence::OnRequest => ", in a session for the whole session",
    };
    let _ = writeln!(out, "- Memory: {}{whole}.", format_size(l.memory_bytes()));
    if let Some(fuel) = l.fuel() {
        let _ = writeln!(
            out,
            "- Fuel: {} units (about one per WebAssembly instruction).",
            thousands(fuel)
        );
    }
    let _ = writeln!(
        out,
        "- Output: {} of each of stdout and stderr.",
        format_size(l.max_output_bytes())
    );
    let _ = writeln!(
        out,
        "- Return value: {} of JSON.",
        format_size(l.max_value_bytes())
    );
    let _ = writeln!(out, "- Code: {}.", format_size(l.max_code_bytes()));
    if !facts.tools.is_empty() {
        let _ = writeln!(
            out,
            "- Tool calls: at most {} per call; one call's arguments at most {} of JSON, its \
             result at most {}, its time at most {}.",
            thousands(u64::from(l.max_tool_calls())),
            format_size(l.max_tool_args_bytes()),
            format_size(l.max_tool_result_bytes()),
            format_duration(l.tool_timeout())
        );
    }
    let env = facts.environment;
    if env.input_files || env.returns_files {
        let over = match facts.persistence {
            Persistence::OneShot => "in all",
            Persistence::Session => "over the whole session",
            Persistence::OnRequest => "in all (in a session, over its whole life)",
        };
        let _ = writeln!(
            out,
            "- Files: input files at most {} together; writes at most {} {over}; at most {} \
             files and directories; one file at most {}; returned contents at most {} (a file \
             past it is listed with its size only). A write past a budget raises `OSError`.",
            format_size(l.max_input_bytes()),
            format_size(l.max_written_bytes()),
            thousands(u64::from(l.max_files())),
            format_size(l.max_file_bytes()),
            format_size(l.max_returned_bytes()),
        );
    }
}

/// `` `a`, `b` ``.
fn code_list<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

//! `pycage describe`: what a model is told about a `run_python` tool in the sandbox the
//! flags make, as text or as one JSON object.

use crate::cli::DescribeArgs;
use crate::exit::Exit;
use crate::sandbox;

pub async fn describe(args: DescribeArgs) -> Exit {
    let runner = match sandbox::ready_runner(&args.sandbox) {
        Ok(runner) => runner,
        Err(exit) => return exit,
    };
    let description = match runner.description().session(args.session).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pycage: {e}");
            return Exit::Internal;
        }
    };
    if args.json {
        match serde_json::to_string(&description) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("pycage: the description is not serializable: {e}");
                return Exit::Internal;
            }
        }
    } else {
        print!("{}", description.text());
    }
    Exit::Ok
}

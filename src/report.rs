//! Printing a run's result: human-readable, or one JSON object.

use std::io::Write;

use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use pycage::{OutputFile, RunResult};

/// The whole result as one JSON object on stdout; produced files with their bytes (base64)
/// only when `with_bytes`.
pub fn json(result: &RunResult, with_bytes: bool) {
    let mut out = std::io::stdout().lock();
    let text = serde_json::to_value(result)
        .map(|mut v| {
            if !with_bytes && let Some(files) = v["files"].as_array_mut() {
                for f in files.iter_mut().filter_map(|f| f.as_object_mut()) {
                    f.remove("bytes");
                }
            }
            v.to_string()
        })
        .unwrap_or_else(|e| {
            format!("{{\"ok\":false,\"error\":{{\"kind\":\"backend_error\",\"message\":\"result not serializable: {e}\"}}}}")
        });
    let _ = writeln!(out, "{text}");
}

/// Writes the produced files into `dir` (created if missing), through a capability handle on
/// it, so no path (and no symbolic link already in `dir`) leads out of it. Refuses to
/// replace a file unless `force`.
///
/// # Errors
///
/// The first file that could not be written, and why; files written before it stay.
pub fn write_files(files: &[OutputFile], dir: &Path, force: bool) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let root = Dir::open_ambient_dir(dir, ambient_authority()).map_err(|e| e.to_string())?;
    for file in files {
        // The guest named these files: check them as strictly as input names.
        pycage::files::check_path(&file.path).map_err(|e| e.message)?;
        let Some(bytes) = &file.bytes else {
            eprintln!(
                "pycage: {} ({} bytes) not written: over the run's max_returned_bytes",
                file.path, file.size
            );
            continue;
        };
        if let Some((parent, _)) = file.path.rsplit_once('/') {
            root.create_dir_all(parent)
                .map_err(|e| format!("{}: {e}", file.path))?;
        }
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true);
        if force {
            options.create(true).truncate(true);
        } else {
            options.create_new(true);
        }
        let mut out = root.open_with(&file.path, &options).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!("{} exists (pass --force to replace it)", file.path)
            } else {
                format!("{}: {e}", file.path)
            }
        })?;
        out.write_all(bytes)
            .map_err(|e| format!("{}: {e}", file.path))?;
    }
    Ok(())
}

/// The guest's stdout and stderr passed through, the value on stdout, the error on stderr.
pub fn human(result: &RunResult) {
    {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(result.stdout.as_bytes());
        if !result.value.is_null() {
            let _ = writeln!(out, "{}", result.value);
        }
        let _ = out.flush();
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(result.stderr.as_bytes());
    if let Some(error) = &result.error {
        if let Some(tb) = &error.traceback {
            let _ = write!(err, "{tb}");
            if !tb.ends_with('\n') {
                let _ = writeln!(err);
            }
        }
        let _ = writeln!(err, "pycage: {}: {}", error.kind, error.message);
    }
    if result.stdout_truncated || result.stderr_truncated {
        let _ = writeln!(err, "pycage: output was over the cap; its middle was cut");
    }
    if !result.files.is_empty() {
        let list: Vec<String> = result
            .files
            .iter()
            .map(|f| format!("{} ({} bytes)", f.path, f.size))
            .collect();
        let _ = writeln!(err, "pycage: files produced: {}", list.join(", "));
    }
}

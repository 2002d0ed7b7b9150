//! `pycage prepare [--out DIR]`: compiles the wasm guest and writes its artifact where a later
//! process finds it, so the first run of a new process (a container, a replica) loads it in
//! milliseconds instead of compiling for seconds. An artifact already there is kept when it
//! checks out (its BLAKE3 against its sidecar); a corrupt or truncated one is compiled again.
//! Artifacts of other pycage builds, engines or targets have other names and are never used.

use std::time::Instant;

use pycage::{ArtifactSource, WasmBackend};

use crate::cli::PrepareArgs;
use crate::exit::Exit;

pub async fn prepare(args: PrepareArgs) -> Exit {
    let dir = match args.out {
        Some(dir) => dir,
        None => match pycage::wasm::default_cache_dir() {
            Some(dir) => dir,
            None => {
                eprintln!(
                    "pycage: no cache directory (PYCAGE_CACHE_DIR is `off`, or no home \
                     directory): name one with --out DIR"
                );
                return Exit::Usage;
            }
        },
    };
    let backend = match WasmBackend::new(Some(dir.clone())) {
        Ok(backend) => backend,
        Err(e) => {
            eprintln!("pycage: {e}");
            return Exit::Internal;
        }
    };
    let started = Instant::now();
    let source = match backend.prepare().await {
        Ok(source) => source,
        Err(e) => {
            eprintln!("pycage: {e}");
            return Exit::Internal;
        }
    };
    let took = started.elapsed();
    let Some(path) = backend.artifact_path() else {
        eprintln!("pycage: no artifact path under {}", dir.display());
        return Exit::Internal;
    };
    if source == ArtifactSource::CompiledUncached {
        eprintln!(
            "pycage: compiled the guest, but could not write it under {} (see the warning \
                 above)",
            dir.display()
        );
        return Exit::Internal;
    }
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    println!("{}", path.display());
    eprintln!(
        "pycage: {} in {:.0} ms: {} ({:.1} MiB); serve with PYCAGE_CACHE_DIR={}",
        crate::sandbox::describe_source(source),
        took.as_secs_f64() * 1000.0,
        path.display(),
        size as f64 / f64::from(1 << 20),
        dir.display()
    );
    Exit::Ok
}

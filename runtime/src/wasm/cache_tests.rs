use super::*;

/// The smallest valid component: no imports, no exports. Compiles in microseconds.
const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";
const DIGEST: &str = "0123456789abcdef0123456789abcdef";

fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("pycage-cache-{name}-"))
        .tempdir()
        .unwrap()
}

fn load_source(engine: &Engine, dir: &Path) -> ArtifactSource {
    load_or_compile(engine, EMPTY_COMPONENT, DIGEST, Some(dir))
        .unwrap()
        .1
}

#[test]
fn compile_then_verify_then_trust_the_identity() {
    let engine = Engine::default();
    let dir = temp_dir("cycle");
    let dir = dir.path();
    assert_eq!(load_source(&engine, dir), ArtifactSource::Compiled);
    assert!(is_cached(&engine, DIGEST, Some(dir)));
    assert_eq!(load_source(&engine, dir), ArtifactSource::CacheVerified);
    assert_eq!(load_source(&engine, dir), ArtifactSource::Cache);
    assert_eq!(load_source(&engine, dir), ArtifactSource::Cache);
}

#[test]
fn a_modified_artifact_is_hashed_again_and_rebuilt() {
    let engine = Engine::default();
    let dir = temp_dir("corrupt");
    let dir = dir.path();
    load_source(&engine, dir);
    load_source(&engine, dir); // stamps the identity
    let path = artifact_path(dir, &engine, DIGEST);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        load_source(&engine, dir),
        ArtifactSource::Compiled,
        "a flipped byte"
    );

    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(
        load_source(&engine, dir),
        ArtifactSource::Compiled,
        "a truncated file"
    );

    std::fs::write(&path, b"not an artifact").unwrap();
    assert_eq!(
        load_source(&engine, dir),
        ArtifactSource::Compiled,
        "garbage"
    );
    assert_eq!(load_source(&engine, dir), ArtifactSource::CacheVerified);
}

#[test]
fn a_missing_or_garbled_checksum_means_rebuild() {
    let engine = Engine::default();
    let dir = temp_dir("sum");
    let dir = dir.path();
    load_source(&engine, dir);
    let sum = sum_path(&artifact_path(dir, &engine, DIGEST));
    std::fs::remove_file(&sum).unwrap();
    assert!(!is_cached(&engine, DIGEST, Some(dir)));
    assert_eq!(load_source(&engine, dir), ArtifactSource::Compiled);
    std::fs::write(&sum, "zz\n").unwrap();
    assert_eq!(load_source(&engine, dir), ArtifactSource::Compiled);
    // A well-formed sidecar for other bytes is a mismatch, not a pass.
    std::fs::write(&sum, format!("{}\n", blake3::hash(b"other").to_hex())).unwrap();
    assert_eq!(load_source(&engine, dir), ArtifactSource::Compiled);
}

#[test]
fn no_directory_means_no_cache() {
    let engine = Engine::default();
    let (_, source) = load_or_compile(&engine, EMPTY_COMPONENT, DIGEST, None).unwrap();
    assert_eq!(source, ArtifactSource::CompiledUncached);
    assert!(!is_cached(&engine, DIGEST, None));
}

#[test]
fn prune_keeps_the_most_recently_used() {
    let dir = temp_dir("prune");
    let dir = dir.path();
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let path = dir.join(format!("guest-{name}.cwasm"));
        std::fs::write(&path, b"x").unwrap();
        std::fs::write(sum_path(&path), b"y").unwrap();
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
        std::fs::File::options()
            .write(true)
            .open(sum_path(&path))
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    prune(dir, 2);
    let mut left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "guest-d.cwasm",
            "guest-d.cwasm.sum",
            "guest-e.cwasm",
            "guest-e.cwasm.sum"
        ]
    );
}

//! The Kubernetes manifests in `deploy/kubernetes` validate, strictly, against the
//! Kubernetes schemas (the `kubernetes-validate` tool from PyPI, in the interop virtualenv
//! `scripts/setup` makes), and say what the server does: its probes are routes it serves,
//! and the pod's grace outlasts the preStop pause plus pycage's shutdown grace.

use crate::os_support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_kubernetes_manifests_validate_against_the_schemas() {
    let tool =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/kubernetes-validate");
    if !tool.exists() {
        os_support::skip("kubernetes-validate is missing (scripts/setup installs it)");
        return;
    }
    let files = manifests();
    assert!(files.len() >= 4, "{files:?}");
    let out = Command::new(&tool)
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .args(&files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for kind in [
        "deployment",
        "service",
        "horizontalpodautoscaler",
        "poddisruptionbudget",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}/pycage")),
            "{text}"
        );
    }
}

#[test]
fn the_deployment_matches_what_the_server_does() {
    let deployment = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/deployment.yaml"),
    )
    .unwrap();
    for probe in ["path: /readyz", "path: /healthz"] {
        assert!(deployment.contains(probe), "{probe}");
    }
    let number = |key: &str| -> u64 {
        let line = deployment
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key}"));
        line.split(':').nth(1).unwrap().trim().parse().unwrap()
    };
    let grace = number("terminationGracePeriodSeconds:");
    let pre_stop = number("seconds:");
    let args: Vec<&str> = deployment.lines().map(str::trim).collect();
    let at = args
        .iter()
        .position(|l| *l == "- --shutdown-grace")
        .unwrap();
    let shutdown: u64 = args[at + 1]
        .trim_start_matches("- ")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(
        grace > pre_stop + shutdown,
        "terminationGracePeriodSeconds {grace} must outlast preStop {pre_stop} + shutdown grace {shutdown}"
    );
}

/// The value after `key` on the first line of `text` that starts with it (trimmed).
fn after<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no line starts with {key:?}"))
        .trim()
}

#[test]
fn the_image_and_the_deployment_agree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    let deployment =
        std::fs::read_to_string(root.join("deploy/kubernetes/deployment.yaml")).unwrap();
    assert_eq!(after(&dockerfile, "FROM "), "scratch");
    // The image's user is the pod's.
    let (uid, gid) = after(&dockerfile, "USER ").split_once(':').unwrap();
    assert_eq!(after(&deployment, "runAsUser:"), uid);
    assert_eq!(after(&deployment, "runAsGroup:"), gid);
    // The baked artifact is where the pod's PYCAGE_CACHE_DIR points.
    let cache = after(&dockerfile, "ENV PYCAGE_CACHE_DIR=");
    assert!(
        dockerfile.contains(&format!("COPY artifacts/ {cache}/")),
        "{dockerfile}"
    );
    let lines: Vec<&str> = deployment.lines().map(str::trim).collect();
    let env = lines
        .iter()
        .position(|l| *l == "- name: PYCAGE_CACHE_DIR")
        .unwrap();
    assert_eq!(lines[env + 1], format!("value: {cache}"));
    // The root is read-only; the scratch directories need a writable /tmp.
    assert_eq!(after(&deployment, "readOnlyRootFilesystem:"), "true");
    assert!(lines.contains(&"mountPath: /tmp"), "{deployment}");
    // The token file the image's default command reads is where the pod mounts its Secret.
    assert!(
        dockerfile.contains("\"--token-file\", \"/etc/pycage/token\""),
        "{dockerfile}"
    );
    assert!(lines.contains(&"mountPath: /etc/pycage"), "{deployment}");
}

//! `pycage backends`, and the backends `--backend` names.

use std::path::Path;
use std::sync::Arc;

use pycage::{Availability, Backend, BackendKind, BackendOptions, Guest, Unavailable, WasmBackend};
use serde_json::json;

use crate::cli::BackendsArgs;
use crate::exit::Exit;

/// The backend `kind`, and the wasm backend when it is that one (for the first-run
/// notice); deterministic with `seed` and running `guest` (the wasm backend only); with the
/// network when `network` (bubblewrap and docker only).
pub fn by_name(
    kind: BackendKind,
    seed: Option<u64>,
    guest: Option<&Path>,
    network: bool,
) -> Result<(Arc<dyn Backend>, Option<WasmBackend>), String> {
    if seed.is_some() && kind != BackendKind::Wasm {
        return Err(format!(
            "--deterministic needs the wasm backend; `{kind}` runs on the host's clocks and entropy"
        ));
    }
    if guest.is_some() && kind != BackendKind::Wasm {
        return Err(format!(
            "--guest needs the wasm backend; `{kind}` runs the host's own Python"
        ));
    }
    let mut options = BackendOptions::new().allow_network(network);
    let wasm = if kind == BackendKind::Wasm && !network {
        // One run needs one instance: reserve pooling slots for a few, not for a thousand.
        let mut builder = WasmBackend::builder().max_instances(2);
        if let Some(seed) = seed {
            builder = builder.deterministic(seed);
        }
        if let Some(path) = guest {
            let guest = Guest::from_path(path).map_err(|e| format!("--guest: {e}"))?;
            builder = builder.guest(guest);
        }
        let wasm = builder.build().map_err(|e| e.to_string())?;
        options = options.wasm(wasm.clone());
        Some(wasm)
    } else {
        None
    };
    let backend = kind.backend(&options).map_err(|e| e.to_string())?;
    Ok((backend, wasm))
}

pub fn list(args: BackendsArgs) -> Exit {
    let mut wasm = None;
    let rows: Vec<_> = BackendKind::ALL
        .iter()
        .map(|&kind| {
            let (isolation, sessions, availability) = match by_name(kind, None, None, false) {
                Ok((backend, w)) => {
                    if w.is_some() {
                        wasm = w;
                    }
                    (
                        backend.provides_isolation(),
                        backend.supports_sessions(),
                        backend.availability(),
                    )
                }
                Err(e) => (
                    true,
                    false,
                    Availability::Unavailable(Unavailable::refused(e)),
                ),
            };
            (kind, isolation, sessions, availability)
        })
        .collect();
    let in_place = wasm.map(|w| w.resets_slots_in_place());
    let containment = pycage::os::bubblewrap::containment_note();
    if args.json {
        let table: Vec<_> = rows
            .iter()
            .map(|(kind, isolation, sessions, availability)| {
                let (reason, reason_kind) = match availability {
                    Availability::Available => (None, None),
                    Availability::Unavailable(why) => {
                        (Some(why.reason()), Some(why.kind().as_str()))
                    }
                };
                let mut row = json!({
                    "name": kind.name(),
                    "isolation": isolation,
                    "sessions": sessions,
                    "available": availability.is_available(),
                    "reason": reason,
                    "reason_kind": reason_kind,
                    "network": network_note(*kind),
                });
                if *kind == BackendKind::Wasm
                    && let Some(in_place) = in_place
                {
                    row["slot_reset"] = json!(if in_place { "in_place" } else { "release" });
                }
                row
            })
            .collect();
        println!("{}", json!(table));
        return Exit::Ok;
    }
    println!(
        "{:<16} {:<10} {:<9} {:<29} AVAILABILITY",
        "BACKEND", "ISOLATION", "SESSIONS", "NETWORK"
    );
    for (kind, isolation, sessions, availability) in &rows {
        let isolation = if *isolation { "yes" } else { "NONE" };
        let sessions = if *sessions { "yes" } else { "no" };
        let note = match (kind, availability) {
            (BackendKind::Local, Availability::Available) => " (only with --allow-no-isolation)",
            _ => "",
        };
        let network = network_note(*kind);
        let name = kind.name();
        println!("{name:<16} {isolation:<10} {sessions:<9} {network:<29} {availability}{note}");
    }
    println!();
    println!("process trees of native runs: {containment}");
    if let Some(in_place) = in_place {
        println!(
            "wasm memory slots after a run: {}",
            slot_reset_note(in_place)
        );
    }
    Exit::Ok
}

/// How code on the backend `kind` can reach the network: the `net.fetch` tool everywhere
/// (`--net-allow`); the whole network too with `--allow-network` on bubblewrap and docker;
/// always, unfiltered, on `local`.
pub fn network_note(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Bubblewrap | BackendKind::Docker => "--net-allow, --allow-network",
        BackendKind::Local => "unfiltered (no isolation)",
        _ => "--net-allow",
    }
}

/// How the wasm backend's used memory slots are made fresh again, and why (SECURITY.md).
pub fn slot_reset_note(in_place: bool) -> &'static str {
    if in_place {
        "reset in place (the snapshot's bytes copied back; this host has no swap)"
    } else {
        "released (this host swaps, or its kernel lacks PAGEMAP_SCAN; see SECURITY.md), so \
         fresh runs fault in more of the guest's heap"
    }
}

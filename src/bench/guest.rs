//! The `guest_*` rows: a custom guest (`pycage bench --guest FILE`) measured side by side with
//! the built-in one, in the same process, samples interleaved where they are latencies.

use std::time::Instant;

use pycage::{Guest, Runner, WasmBackend};

use super::cases::{check, in_guest_seconds, memory_per_sandbox, native_seconds, runner, us};
use super::{Baseline, Figure, Row, Settings, Summary};

const BUILTIN: &str = "the built-in guest";

pub async fn rows(
    s: &Settings,
    guest: &Guest,
    builtin: &Runner,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let backend = || {
        WasmBackend::builder()
            .guest(guest.clone())
            .build()
            .map_err(|e| e.to_string())
    };
    if wanted("guest_component") {
        rows.push(Row {
            case: "guest_component_bytes",
            unit: "bytes",
            pycage: Figure::Value(guest.bytes().len() as f64),
            baseline: Some(baseline(Figure::Value(
                Guest::builtin().bytes().len() as f64
            ))),
            target: None,
        });
    }
    if wanted("guest_first_compile") {
        // Compiled without the artifact cache, one after the other: what a first run costs.
        let compile = |guest: Guest| async move {
            let backend = WasmBackend::builder()
                .cache_dir(None)
                .guest(guest)
                .build()
                .map_err(|e| e.to_string())?;
            let t = Instant::now();
            backend.prepare().await.map_err(|e| e.to_string())?;
            Ok::<f64, String>(t.elapsed().as_secs_f64() * 1e3)
        };
        eprintln!("pycage bench: compiling both guests without the cache...");
        let custom = compile(guest.clone()).await?;
        let default = compile(Guest::builtin()).await?;
        rows.push(Row {
            case: "guest_first_compile",
            unit: "ms",
            pycage: Figure::Value(custom),
            baseline: Some(baseline(Figure::Value(default))),
            target: None,
        });
    }
    eprintln!("pycage bench: preparing the custom guest...");
    let custom = runner(backend()?, 100)?;
    check(custom.run("pass").await)?;
    if wanted("guest_fresh_pass") {
        for _ in 0..s.iterations.min(20) {
            check(custom.run("pass").await)?;
            check(builtin.run("pass").await)?;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..s.iterations {
            super::cases::idle(s).await;
            let t = Instant::now();
            check(custom.run("pass").await)?;
            ours.push(us(t.elapsed()));
            super::cases::idle(s).await;
            let t = Instant::now();
            check(builtin.run("pass").await)?;
            theirs.push(us(t.elapsed()));
        }
        let (ours, theirs) = (Summary::of(ours), Summary::of(theirs));
        let ratio = ours.p50 / theirs.p50;
        rows.push(Row {
            case: "guest_fresh_pass",
            unit: "us",
            pycage: Figure::Latency(ours),
            baseline: Some(baseline(Figure::Latency(theirs))),
            target: Some("p50 <= 1.5x the built-in guest's"),
        });
        rows.push(Row {
            case: "guest_fresh_pass_ratio_p50",
            unit: "ratio",
            pycage: Figure::Value(ratio),
            baseline: None,
            target: Some("<= 1.5"),
        });
    }
    if wanted("guest_import_preloaded") {
        // Every preloaded module in one statement (the data guest's: numpy and pandas).
        let preloaded = guest.manifest().map(|m| m.preload.join(", "));
        match preloaded.filter(|modules| !modules.is_empty()) {
            Some(modules) => {
                let n = s.iterations.clamp(5, 200);
                let work = format!("import {modules}");
                rows.push(Row {
                    case: "guest_import_preloaded",
                    unit: "us",
                    pycage: Figure::Latency(in_guest_seconds(&custom, "", &work, n).await?),
                    baseline: Some(Baseline {
                        name: "`import json` in the same guest (in-guest time)".into(),
                        figure: Figure::Latency(
                            in_guest_seconds(&custom, "", "import json", n).await?,
                        ),
                    }),
                    target: Some("<= 50 us"),
                });
            }
            None => eprintln!(
                "pycage bench: guest_import_preloaded left out: the guest preloads no module"
            ),
        }
    }
    if wanted("guest_numpy_compute") {
        numpy_compute(s, guest, &custom, &mut rows).await?;
    }
    if wanted("guest_per_live_sandbox") {
        let (rss, pss) = memory_per_sandbox(&custom, 100).await?;
        let (rss_default, pss_default) = memory_per_sandbox(builtin, 100).await?;
        for (case, ours, theirs) in [
            ("guest_rss_per_live_sandbox_100", rss, rss_default),
            ("guest_pss_per_live_sandbox_100", pss, pss_default),
        ] {
            rows.push(Row {
                case,
                unit: "bytes",
                pycage: Figure::Value(ours),
                baseline: Some(baseline(Figure::Value(theirs))),
                target: None,
            });
        }
    }
    Ok(rows)
}

/// numpy work: elementwise math over a million doubles, a reduction, a sort and a 200 x 200
/// matrix product, the kinds of call a model's analysis code makes.
const NUMPY_WORK: &str = "a = np.arange(1_000_000, dtype=np.float64)\n\
                          s = float(np.sqrt(a * 0.5 + 1.0).sum())\n\
                          b = np.sort(a[::-1])\n\
                          m = np.ones((200, 200)) @ np.ones((200, 200))";

/// `guest_numpy_compute`: [`NUMPY_WORK`] in the guest against native numpy, in the
/// `--peers` Python (`scripts/peers` installs the same numpy version there). Left out, with
/// the reason, when the guest has no numpy or no native numpy was given.
async fn numpy_compute(
    s: &Settings,
    guest: &Guest,
    custom: &Runner,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let has_numpy = guest
        .manifest()
        .is_some_and(|m| m.packages.iter().any(|p| p.name == "numpy"));
    let python = s.peers.as_deref().filter(|python| {
        std::process::Command::new(python)
            .args(["-I", "-c", "import numpy"])
            .status()
            .is_ok_and(|status| status.success())
    });
    let (true, Some(python)) = (has_numpy, python) else {
        eprintln!(
            "pycage bench: guest_numpy_compute left out: it needs a guest with numpy and \
             --peers PYTHON with numpy installed (scripts/peers installs it)"
        );
        return Ok(());
    };
    let n = s.iterations.clamp(3, 20);
    let import = "import numpy as np";
    rows.push(Row {
        case: "guest_numpy_compute",
        unit: "us",
        pycage: Figure::Latency(in_guest_seconds(custom, import, NUMPY_WORK, n).await?),
        baseline: Some(Baseline {
            name: format!("native numpy ({python} -I)"),
            figure: Figure::Latency(native_seconds(python, &["-I"], import, NUMPY_WORK, n)?),
        }),
        target: None,
    });
    Ok(())
}

fn baseline(figure: Figure) -> Baseline {
    Baseline {
        name: BUILTIN.into(),
        figure,
    }
}

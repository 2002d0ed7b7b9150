//! `GET /metrics`: what the API has done, in the Prometheus text format (prometheus-client).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use pycage::{RunResult, ToolCallEvent, ToolCallObserver};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    /// `ok` or `error`.
    outcome: &'static str,
    /// The error kind (`timeout`, `memory_limit`, ...), empty for a run that succeeded.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    /// The exposed tool's qualified name (`math.add`); empty when the call named no exposed
    /// tool, so the guest cannot mint labels (the series stay as many as the tools).
    tool: String,
    /// `ok`, or the call's error kind (`failed`, `limit-exceeded`, `not-found`, ...).
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    /// `busy`, `draining`, `invalid_input`, `invalid_limits`, `unauthorized`, ...
    reason: String,
}

/// The API's metrics and the registry that encodes them.
#[derive(Debug)]
pub(super) struct Metrics {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    duration: Histogram,
    fuel: Histogram,
    tool_calls: Family<ToolLabels, Counter>,
    rejected: Family<RejectLabels, Counter>,
    pub(super) in_flight: Gauge,
    pub(super) queued: Gauge,
    pub(super) sessions: Gauge,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let mut registry = Registry::with_prefix("pycage");
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "runs",
            "Runs finished, by outcome and error kind",
            runs.clone(),
        );
        // 0.1 ms to ~26 s.
        let duration = Histogram::new(exponential_buckets(0.0001, 2.0, 19));
        registry.register(
            "run_duration_seconds",
            "Wall-clock time of a run, from its request to its result",
            duration.clone(),
        );
        // 10^5 to ~10^11 instructions' worth of fuel.
        let fuel = Histogram::new(exponential_buckets(1e5, 4.0, 11));
        registry.register("run_fuel", "Fuel a run consumed (wasm)", fuel.clone());
        let tool_calls = Family::<ToolLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls the runs made, answered by the broker, by tool and outcome",
            tool_calls.clone(),
        );
        let rejected = Family::<RejectLabels, Counter>::default();
        registry.register(
            "requests_rejected",
            "Requests refused before any code ran, by reason",
            rejected.clone(),
        );
        let in_flight = Gauge::default();
        registry.register("runs_in_flight", "Runs running now", in_flight.clone());
        let queued = Gauge::default();
        registry.register("runs_queued", "Runs waiting for a run slot", queued.clone());
        let sessions = Gauge::default();
        registry.register("sessions_live", "Sessions open now", sessions.clone());
        Metrics {
            registry,
            runs,
            duration,
            fuel,
            tool_calls,
            rejected,
            in_flight,
            queued,
            sessions,
        }
    }

    pub(super) fn ran(&self, result: &RunResult) {
        let (outcome, kind) = match &result.error {
            None => ("ok", String::new()),
            Some(e) => (
                "error",
                serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
            ),
        };
        self.runs.get_or_create(&RunLabels { outcome, kind }).inc();
        self.duration.observe(result.duration.as_secs_f64());
        if let Some(fuel) = result.fuel_consumed {
            self.fuel.observe(fuel as f64);
        }
    }

    pub(super) fn rejected(&self, reason: &str) {
        self.rejected
            .get_or_create(&RejectLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The text exposition.
    pub(super) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl ToolCallObserver for Metrics {
    fn observe(&self, call: &ToolCallEvent<'_>) {
        self.tool_calls
            .get_or_create(&ToolLabels {
                tool: call.tool.unwrap_or_default().to_owned(),
                outcome: call.outcome,
            })
            .inc();
    }
}

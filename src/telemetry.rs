//! Prometheus metrics: the recorder, every metric's HELP text, histogram buckets (histograms, not
//! summaries, so that replicas aggregate), and the gauges read at scrape time. Calls only touch handles
//! registered once, so the hot path allocates nothing for labels.
//!
//! Where they are served (SPEC 11 r3): on the main listener to an operator token with
//! `seal.metrics.read`, or, with `metrics.listen`, on a listener of their own without a token and not
//! on the main listener at all.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Histogram, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};

/// `metrics:` in the configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `HOST:PORT` where /metrics is served without a token (a scraper's network, not the agents');
    /// None: on the main listener, to operator tokens with `seal.metrics.read`.
    pub listen: Option<String>,
}

pub const REQUEST_DURATION: &str = "sealgate_request_duration_seconds";
pub const UPSTREAM_DURATION: &str = "sealgate_upstream_duration_seconds";

/// From 1 ms (a refusal from memory) to 30 s (beyond the longest sensible upstream timeout).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// What the gateway answered a `/v1/invoke` call, as the request histogram labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// 2xx: the tool's answer (or a SKIP's stored one).
    Success,
    /// 4xx: the gateway refused the call.
    Refused,
    /// 5xx: the upstream, the store or the gateway's capacity failed it.
    Failed,
}

impl RequestOutcome {
    pub fn of(status: axum::http::StatusCode) -> RequestOutcome {
        if status.is_success() {
            RequestOutcome::Success
        } else if status.is_client_error() {
            RequestOutcome::Refused
        } else {
            RequestOutcome::Failed
        }
    }
}

/// The process-wide recorder and the request histograms (installing a recorder twice fails, and
/// tests build several gateways in one process).
struct Installed {
    handle: PrometheusHandle,
    /// Indexed by `RequestOutcome as usize`.
    requests: [Histogram; 3],
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

fn installed() -> &'static Installed {
    INSTALLED.get_or_init(|| {
        // `set_buckets` refuses only an empty list.
        let recorder = PrometheusBuilder::new()
            .set_buckets(LATENCY_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (e.g. by an embedding program): keep ours local then.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        metrics::gauge!("sealgate_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        let request = |outcome: &'static str, class: &'static str| {
            metrics::histogram!(REQUEST_DURATION, "outcome" => outcome, "code_class" => class)
        };
        Installed {
            handle,
            requests: [
                request("success", "2xx"),
                request("refused", "4xx"),
                request("failed", "5xx"),
            ],
        }
    })
}

/// Installs the recorder once (before any handle is registered) and returns its handle for `/metrics`.
pub fn install() -> PrometheusHandle {
    installed().handle.clone()
}

/// Folds the histogram samples recorded since the last scrape into their buckets. The recorder keeps
/// every sample until then, so without this a gateway that nobody scrapes grows by each call's samples
/// (about 40 MB per million calls).
pub fn fold_samples() {
    installed().handle.run_upkeep();
}

/// Records one `/v1/invoke` request, from its arrival to its answer.
pub fn observe_request(outcome: RequestOutcome, elapsed: Duration) {
    installed().requests[outcome as usize].record(elapsed.as_secs_f64());
}

/// The upstream histogram's handles of one upstream, one per outcome.
pub struct UpstreamLatency([Histogram; 5]);

/// How a call to an upstream ended, as the upstream histogram labels it.
pub const UPSTREAM_OUTCOMES: [&str; 5] =
    ["ok", "unavailable", "timeout", "bad_response", "too_large"];

impl UpstreamLatency {
    pub fn new(upstream: &str) -> UpstreamLatency {
        installed();
        UpstreamLatency(UPSTREAM_OUTCOMES.map(|outcome| {
            metrics::histogram!(UPSTREAM_DURATION, "upstream" => upstream.to_string(), "outcome" => outcome)
        }))
    }

    /// `outcome` indexes [`UPSTREAM_OUTCOMES`].
    pub fn record(&self, outcome: usize, elapsed: Duration) {
        if let Some(histogram) = self.0.get(outcome) {
            histogram.record(elapsed.as_secs_f64());
        }
    }
}

/// The HELP text of every metric the gateway writes.
fn describe() {
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from the arrival of a /v1/invoke request to its answer, by outcome (success, refused, failed) and HTTP code class"
    );
    describe_histogram!(
        UPSTREAM_DURATION,
        Unit::Seconds,
        "Time an upstream took to answer a forwarded call, by upstream and outcome (ok, unavailable, timeout, bad_response, too_large)"
    );
    describe_gauge!(
        "sealgate_calls_in_flight",
        "/v1/invoke calls admitted and not yet answered (limits.max_concurrent_calls caps it)"
    );
    describe_gauge!(
        "sealgate_sessions_live",
        "Sessions in the store that are neither revoked nor expired"
    );
    describe_gauge!(
        "sealgate_claims_pending",
        "PENDING claims in the store: calls in flight, or whose outcome is unknown and awaits an operator"
    );
    describe_gauge!(
        "sealgate_approvals_pending",
        "Approval requests waiting for an operator's decision (SPEC 13)"
    );
    describe_gauge!(
        "sealgate_build_info",
        "Always 1; the version label names the running build"
    );
    describe_counter!(
        "sealgate_decisions_total",
        "Policy decisions on calls, by decision (allow, deny) and SPEC code"
    );
    describe_counter!(
        "sealgate_connections_refused_total",
        "Connections closed at once because limits.max_connections were open"
    );
    describe_counter!(
        "sealgate_calls_shed_total",
        "Calls refused with 5006 because limits.max_concurrent_calls were in progress"
    );
    describe_counter!(
        "sealgate_audit_events_total",
        "Audit events recorded, by event type"
    );
    describe_counter!(
        "sealgate_claims_total",
        "Claims taken on calls, by what the claim found (PROCEED, SKIP, PENDING, ...)"
    );
    describe_counter!(
        "sealgate_audit_batches_total",
        "Audit batches stored (each one commit of the store, shared by the calls it holds)"
    );
    describe_counter!(
        "sealgate_audit_head_conflicts_total",
        "Audit batches chained again because another replica moved the chain head first"
    );
    describe_counter!(
        "sealgate_audit_sink_errors_total",
        "Audit events a sink (file, stdout) failed to write"
    );
    describe_counter!(
        "sealgate_retention_removed_total",
        "Records removed from the store by retention, by kind"
    );
    describe_counter!(
        "sealgate_answer_guard_total",
        "What the answer guard found in tools' answers (SPEC 18), by kind and action (redacted, stripped, refused)"
    );
    describe_counter!(
        "sealgate_shadow_differences_total",
        "Calls a context's shadow version decided differently from the version in force (SPEC 6.4), by context"
    );
    describe_gauge!(
        "sealgate_upstream_up",
        "1 while an MCP upstream's server runs, 0 once it failed to start or exited; no series before its first start"
    );
}

//! OpenTelemetry traces over OTLP/HTTP protobuf (SPEC 11 r3 `telemetry`). Every API request (`/v1/…`) gets
//! a server span, the child of the caller's `traceparent` span when it sent one; a `/v1/invoke` call adds a
//! child span per phase (verify, decide, claim, forward, settle). Finished spans go to a bounded queue that
//! a thread of the SDK exports in batches, so a slow or down collector never holds up a call, and a full
//! queue drops spans rather than grow.
//!
//! Export is off unless an endpoint is configured; the request path then pays a few branches and no
//! allocation. Spans carry codes, names and ids only: never argument values, tokens, keys or payloads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, Span};
use opentelemetry_sdk::Resource;
use serde::{Deserialize, Serialize};

/// The `telemetry` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans are POSTed to its `/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// The share of traces exported, chosen by trace id (0.0 to 1.0). The gateway decides alone: a
    /// caller's `traceparent` sampled flag neither turns export off nor on (SPEC 20 r12).
    pub sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
        }
    }
}

impl TelemetryConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err((
                SAMPLE_RATIO_KEY,
                format!("must be from 0.0 to 1.0, not {}", self.sample_ratio),
            ));
        }
        match &self.otlp_endpoint {
            Some(endpoint) => collector_url(endpoint)
                .map(drop)
                .map_err(|message| (ENDPOINT_KEY, message)),
            None => Ok(()),
        }
    }
}

const ENDPOINT_KEY: &str = "telemetry.otlp_endpoint";
const SAMPLE_RATIO_KEY: &str = "telemetry.sample_ratio";
const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const DISABLED_VAR: &str = "OTEL_SDK_DISABLED";
/// The SDK's sampler variables, which the gateway does not read: their parent-based samplers would let a
/// caller's flags turn export off (SPEC 20 r12).
const IGNORED_SAMPLER_VARS: [&str; 2] = ["OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"];
/// One export request's limit, connection and answer included (OTLP's default timeout).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long stopping waits for the last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The tracer of this process, set once by [`start`]; unset, every function here does nothing.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

tokio::task_local! {
    /// The exported span of the API request this task serves: set at the HTTP edge (`trace.rs`),
    /// read by the pipeline and the error answers, which record on it.
    static REQUEST: Context;
}

/// Whether spans are exported: the one check the request path makes when they are not.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Where spans are sent: the traces URL, and the setting that named it (errors name the setting, never
/// the value, which may hold a credential in its query). `env` reads a variable.
fn traces_url(
    config: &TelemetryConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<(url::Url, &'static str)>, String> {
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if set(DISABLED_VAR).is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let (base, setting) = match (&config.otlp_endpoint, set(TRACES_ENDPOINT_VAR)) {
        (Some(base), _) => (base.clone(), ENDPOINT_KEY),
        // The signal's own variable is the whole URL (OTLP exporter specification).
        (None, Some(url)) => {
            let url = collector_url(&url).map_err(|e| format!("{TRACES_ENDPOINT_VAR}: {e}"))?;
            return Ok(Some((url, TRACES_ENDPOINT_VAR)));
        }
        (None, None) => match set(ENDPOINT_VAR) {
            Some(base) => (base, ENDPOINT_VAR),
            None => return Ok(None),
        },
    };
    let mut url = collector_url(&base).map_err(|e| format!("{setting}: {e}"))?;
    let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
    url.set_path(&path);
    Ok(Some((url, setting)))
}

/// The traces URL as logs may show it: without its query, which may hold a credential (a user name or
/// password is refused).
fn shown(url: &url::Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// An http(s) URL with a host and no user name or password. Messages never quote it.
fn collector_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw.trim()).map_err(|e| format!("not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("must be an http:// or https:// URL with a host".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry a user name or password; pass credentials in OTEL_EXPORTER_OTLP_HEADERS"
                .to_owned(),
        );
    }
    Ok(url)
}

/// The running export, to be stopped (and its last spans sent) when the gateway stops.
pub struct Exporter {
    provider: SdkTracerProvider,
}

/// Starts exporting when `telemetry.otlp_endpoint` or an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable names a
/// collector; None when none does. Runs on the gateway's runtime, which carries the export requests.
/// `replica_id` names this process in the spans' resource (`service.instance.id`).
pub fn start(config: &TelemetryConfig, replica_id: &str) -> Result<Option<Exporter>, String> {
    let Some((url, setting)) = traces_url(config, |name| std::env::var(name).ok())? else {
        return Ok(None);
    };
    let shown = shown(&url);
    let client = crate::outbound::client_builder()
        .no_proxy()
        .timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("telemetry: cannot build the HTTP client: {e}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.as_str())
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(OnRuntime {
            client,
            runtime: tokio::runtime::Handle::current(),
            collector: shown.clone(),
            failing: AtomicBool::new(false),
        })
        .build()
        .map_err(|e| format!("telemetry: cannot export traces: {e}"))?;
    let provider = SdkTracerProvider::builder()
        // By trace id alone, so that a request span and its phases agree, and never by the caller's
        // sampled flag (the SDK's default sampler follows a remote parent's).
        .with_sampler(Sampler::TraceIdRatioBased(config.sample_ratio))
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .with_resource(resource(replica_id))
        .build();
    if TRACER.set(provider.tracer("sealgate")).is_err() {
        return Err("telemetry: traces are already being exported".to_owned());
    }
    tracing::info!(collector = %shown, from = setting, sample_ratio = config.sample_ratio, "exporting OpenTelemetry traces");
    for variable in IGNORED_SAMPLER_VARS {
        if std::env::var_os(variable).is_some() {
            tracing::warn!(
                variable,
                "ignored: telemetry.sample_ratio decides which calls are traced"
            );
        }
    }
    Ok(Some(Exporter { provider }))
}

impl Exporter {
    /// Sends what is queued (for at most a few seconds) and stops the export thread.
    pub async fn stop(self) {
        let provider = self.provider;
        // A blocking call that waits on the export thread, which needs this runtime for its requests.
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        if let Ok(Err(e)) = stopped {
            tracing::warn!(error = %e, "the last spans could not be exported");
        }
    }
}

/// `service.name` sealgate, its version and the replica, then what `OTEL_RESOURCE_ATTRIBUTES` and
/// `OTEL_SERVICE_NAME` say, in that order of precedence (OpenTelemetry's resource specification).
fn resource(replica_id: &str) -> Resource {
    let mut builder = Resource::builder_empty()
        .with_service_name("sealgate")
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", replica_id.to_owned()),
        ])
        .with_attributes(
            EnvResourceDetector::new()
                .detect()
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
    {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// The exporter's HTTP client: the gateway's reqwest, driven on the gateway's runtime. The SDK's export
/// thread runs no runtime of its own; it waits for the request here instead.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    /// The traces URL as logs may show it.
    collector: String,
    /// Whether the last export failed: a failing collector is logged once, not once per batch.
    failing: AtomicBool,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self
            .runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| HttpError::from(e.to_string()))
            .and_then(|answer| answer);
        let failed = match &sent {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!(
                "the collector answered {}",
                crate::outbound::failed_status(response.status(), response.headers())
            )),
            Err(e) => Some(causes(e.as_ref())),
        };
        self.note(failed);
        sent
    }
}

/// Why a request failed: the causes of the error, not the error itself, whose text quotes the URL.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::from("cannot reach the collector");
    let mut cause = error.source();
    while let Some(source) = cause {
        text.push_str(": ");
        text.push_str(&source.to_string());
        cause = source.source();
    }
    text
}

impl OnRuntime {
    fn note(&self, failed: Option<String>) {
        let was_failing = self.failing.swap(failed.is_some(), Ordering::Relaxed);
        match failed {
            Some(why) if !was_failing => tracing::warn!(
                collector = %self.collector,
                error = %why,
                "cannot export traces; spans are dropped while the collector fails"
            ),
            None if was_failing => {
                tracing::info!(collector = %self.collector, "exporting traces again")
            }
            _ => {}
        }
    }
}

/// The server span of an API request: `METHOD ROUTE`, a child of the caller's span when `parent` (its
/// `traceparent`: trace id, span id, flags) names one. None when export is off.
pub fn request_span(
    method: &str,
    route: &str,
    parent: Option<(&str, &str, u8)>,
) -> Option<Context> {
    let tracer = TRACER.get()?;
    let parent = match parent.and_then(remote_parent) {
        Some(span) => Context::new().with_remote_span_context(span),
        None => Context::new(),
    };
    let span = tracer
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
        ])
        .start_with_context(tracer, &parent);
    Some(parent.with_span(span))
}

fn remote_parent((trace_id, span_id, flags): (&str, &str, u8)) -> Option<SpanContext> {
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(flags);
    Some(SpanContext::new(
        trace_id,
        span_id,
        flags,
        true,
        TraceState::default(),
    ))
}

/// A request span's trace id, span id and flags, in `traceparent`'s lower-case hex.
pub fn ids(request: &Context) -> (String, String, u8) {
    let span = request.span();
    let context = span.span_context();
    (
        context.trace_id().to_string(),
        context.span_id().to_string(),
        context.trace_flags().to_u8(),
    )
}

/// The HTTP status of the answer. The span ends when the last task that holds it does: a call whose
/// client left still runs, and its span with it.
pub fn answered(request: &Context, status: u16) {
    let status = KeyValue::new("http.response.status_code", i64::from(status));
    request.span().set_attribute(status);
}

/// The SPEC code of a refusal and its name, on the span of the request this task serves; a refusal
/// answered with a 5xx (the upstream, the store, overload) marks the span failed, as OpenTelemetry's HTTP
/// conventions do.
pub fn refused(code: u16, name: &'static str, server_error: bool) {
    with_request_span(|span| {
        span.set_attributes([
            KeyValue::new("sealgate.code", i64::from(code)),
            KeyValue::new("error.type", name),
        ]);
        if server_error {
            span.set_status(Status::error(name));
        }
    });
}

/// What a call was, as far as the gateway learnt it: names and ids, never arguments.
#[derive(Default)]
pub struct CallAttributes<'a> {
    pub tool: Option<&'a str>,
    pub context: Option<&'a str>,
    /// PROCEED, SKIP, PENDING or NONE (SPEC 7.2).
    pub claim: Option<&'a str>,
    pub session_id: Option<&'a str>,
}

/// Records a call's attributes on the span of the request this task serves.
pub fn record_call(call: CallAttributes<'_>) {
    with_request_span(|span| {
        let known = [
            ("sealgate.tool", call.tool),
            ("sealgate.context", call.context),
            ("sealgate.claim", call.claim),
            ("sealgate.session_id", call.session_id),
        ];
        span.set_attributes(
            known
                .into_iter()
                .filter_map(|(key, value)| Some(KeyValue::new(key, value?.to_owned()))),
        );
    });
}

fn with_request_span(record: impl FnOnce(&opentelemetry::trace::SpanRef<'_>)) {
    if !enabled() {
        return;
    }
    let _ = REQUEST.try_with(|request| {
        let span = request.span();
        if span.is_recording() {
            record(&span);
        }
    });
}

/// `future`, run as part of the request whose exported span is `span` (as is, without one).
pub async fn within<F: std::future::Future>(span: Option<Context>, future: F) -> F::Output {
    match span {
        Some(span) => REQUEST.scope(span, future).await,
        None => future.await,
    }
}

/// The exported span of the request this task serves, to carry to a task spawned for it.
pub fn current() -> Option<Context> {
    if !enabled() {
        return None;
    }
    REQUEST.try_with(Context::clone).ok()
}

/// The phases of a `/v1/invoke` call, each a child span of the call's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Checks 2–9: token, session, signature, window and replay, binding.
    Verify,
    /// The policy (SPEC 6.3) and the route.
    Decide,
    /// Rate, budget, approval and the claim, made durable before the forward.
    Claim,
    /// The upstream.
    Forward,
    /// The final record: the claim settled and the outcome's audit event.
    Settle,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Verify => "verify",
            Phase::Decide => "decide",
            Phase::Claim => "claim",
            Phase::Forward => "forward",
            Phase::Settle => "settle",
        }
    }
}

/// The span of the phase a call is in: entering the next phase ends it, and so does dropping it.
#[derive(Default)]
pub struct Phases {
    open: Option<(Phase, Span)>,
}

impl Phases {
    /// Ends the current phase's span and starts `phase`'s; staying in the same phase changes nothing.
    pub fn enter(&mut self, phase: Phase) {
        if self.open.as_ref().is_some_and(|(open, _)| *open == phase) {
            return;
        }
        // Ended before the next starts: phases never overlap.
        self.open = None;
        self.open = phase_span(phase).map(|span| (phase, span));
    }
}

fn phase_span(phase: Phase) -> Option<Span> {
    let tracer = TRACER.get()?;
    let request = REQUEST.try_with(Context::clone).ok()?;
    if !request.span().span_context().is_sampled() {
        return None;
    }
    Some(tracer.start_with_context(phase.name(), &request))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_from(
        key: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<Option<(String, &'static str)>, String> {
        let config = TelemetryConfig {
            otlp_endpoint: key.map(str::to_owned),
            ..TelemetryConfig::default()
        };
        let env = |name: &str| {
            vars.iter()
                .find(|(var, _)| *var == name)
                .map(|(_, value)| value.to_string())
        };
        traces_url(&config, env).map(|found| found.map(|(url, from)| (url.to_string(), from)))
    }

    #[test]
    fn the_key_wins_then_the_traces_variable_as_is_then_the_base_variable() {
        let both = [
            (TRACES_ENDPOINT_VAR, "http://traces:4318/custom"),
            (ENDPOINT_VAR, "http://base:4318"),
        ];
        assert_eq!(
            url_from(Some("http://key:4318/"), &both).unwrap(),
            Some(("http://key:4318/v1/traces".to_owned(), ENDPOINT_KEY))
        );
        assert_eq!(
            url_from(None, &both).unwrap(),
            Some(("http://traces:4318/custom".to_owned(), TRACES_ENDPOINT_VAR))
        );
        assert_eq!(
            url_from(None, &both[1..]).unwrap(),
            Some(("http://base:4318/v1/traces".to_owned(), ENDPOINT_VAR))
        );
        assert_eq!(
            url_from(None, &[(ENDPOINT_VAR, "https://base/otlp?k=v")]).unwrap(),
            Some(("https://base/otlp/v1/traces?k=v".to_owned(), ENDPOINT_VAR))
        );
        assert_eq!(url_from(None, &[(ENDPOINT_VAR, " ")]).unwrap(), None);
        assert_eq!(url_from(None, &[]).unwrap(), None);
    }

    #[test]
    fn otel_sdk_disabled_turns_export_off() {
        let vars = [(DISABLED_VAR, "TRUE"), (ENDPOINT_VAR, "http://base:4318")];
        assert_eq!(url_from(Some("http://key:4318"), &vars).unwrap(), None);
        let vars = [(DISABLED_VAR, "false"), (ENDPOINT_VAR, "http://base:4318")];
        assert!(url_from(None, &vars).unwrap().is_some());
    }

    #[test]
    fn a_bad_endpoint_is_refused_by_the_setting_that_named_it_without_its_value() {
        let cases = [
            (Some("ftp://collector"), vec![], ENDPOINT_KEY),
            (
                Some("http://user:hunter2@collector:4318"),
                vec![],
                ENDPOINT_KEY,
            ),
            (
                None,
                vec![(TRACES_ENDPOINT_VAR, "collector:4318 hunter2")],
                TRACES_ENDPOINT_VAR,
            ),
            (
                None,
                vec![(ENDPOINT_VAR, "not a url hunter2")],
                ENDPOINT_VAR,
            ),
        ];
        for (key, vars, setting) in cases {
            let error = url_from(key, &vars).unwrap_err();
            assert!(error.starts_with(setting), "{error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://user:hunter2@collector".to_owned()),
            ..TelemetryConfig::default()
        };
        let (key, message) = config.validate().unwrap_err();
        assert_eq!(key, ENDPOINT_KEY);
        assert!(!message.contains("hunter2"), "{message}");
        for ratio in [-0.1, 1.5, f64::NAN] {
            let config = TelemetryConfig {
                sample_ratio: ratio,
                ..TelemetryConfig::default()
            };
            assert_eq!(config.validate().unwrap_err().0, SAMPLE_RATIO_KEY);
        }
    }

    #[test]
    fn without_export_every_span_function_does_nothing() {
        // No test here starts export: the tracer stays unset, as when no endpoint is configured.
        assert!(request_span("POST", "/v1/invoke", None).is_none());
        let mut phases = Phases::default();
        phases.enter(Phase::Verify);
        assert!(phases.open.is_none());
        refused(2001, "POLICY_VIOLATION_TOOL_DENIED", false);
        record_call(CallAttributes::default());
    }
}

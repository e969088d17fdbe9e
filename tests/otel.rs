//! OpenTelemetry traces through the real binary: a local OTLP/HTTP collector (an axum server on port 0)
//! receives the gateway's exports and decodes them with the official protobuf definitions
//! (`opentelemetry-proto`). A call is one server span in the caller's trace with a child per phase, its
//! ids are the ones the answer and the error body carry, its attributes name the code, tool and context,
//! and nothing of its arguments or credentials is exported. A collector that is down costs calls nothing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use common::{code, tool_call, until, write_config, Gateway, Keys, Lines};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use prost::Message;
use serde_json::{json, Value};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";
const PHASES: [&str; 5] = ["verify", "decide", "claim", "forward", "settle"];

/// One export as the collector received it.
struct Export {
    raw: Vec<u8>,
    decoded: ExportTraceServiceRequest,
}

/// What the collector received.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Export>>>);

impl Collector {
    /// Serves `POST /v1/traces` on a free loopback port; returns its base URL.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        base
    }

    /// Every span received, with the `service.name` of its resource.
    fn spans(&self) -> Vec<(String, Span)> {
        let exports = self.0.lock().unwrap();
        let mut spans = Vec::new();
        for export in exports.iter() {
            for resource_spans in &export.decoded.resource_spans {
                let resource = resource_spans.resource.clone().unwrap_or_default();
                let service = text(&resource.attributes, "service.name").unwrap_or_default();
                for scope_spans in &resource_spans.scope_spans {
                    for span in &scope_spans.spans {
                        spans.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        spans
    }

    /// The bytes of every export, as sent.
    fn raw(&self) -> Vec<Vec<u8>> {
        let exports = self.0.lock().unwrap();
        exports.iter().map(|export| export.raw.clone()).collect()
    }

    /// The spans of `trace_id` once its request span and `children` children of it have arrived.
    async fn trace(&self, trace_id: &str, children: usize) -> (Span, Vec<Span>) {
        let complete = || {
            let spans: Vec<Span> = self
                .spans()
                .into_iter()
                .map(|(_, span)| span)
                .filter(|span| hex::encode(&span.trace_id) == trace_id)
                .collect();
            let request = spans
                .iter()
                .find(|span| span.kind == SpanKind::Server as i32)?
                .clone();
            let mut phases: Vec<Span> = spans
                .into_iter()
                .filter(|span| span.parent_span_id == request.span_id)
                .collect();
            phases.sort_by_key(|span| span.start_time_unix_nano);
            (phases.len() == children).then_some((request, phases))
        };
        until(
            Duration::from_secs(20),
            "the trace's spans exported",
            || {
                let done = complete().is_some();
                async move { done }
            },
        )
        .await;
        complete().unwrap()
    }
}

/// OTLP/HTTP's trace endpoint: protobuf in, protobuf out.
async fn receive(
    axum::extract::State(collector): axum::extract::State<Collector>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    if headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()) != Some(b"application/x-protobuf") {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let Ok(decoded) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let raw = body.to_vec();
    collector.0.lock().unwrap().push(Export { raw, decoded });
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (StatusCode::OK, protobuf, answer)
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        any_value::Value::StringValue(text) => Some(text.clone()),
        _ => None,
    }
}

fn number(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        any_value::Value::IntValue(number) => Some(*number),
        _ => None,
    }
}

/// The span id of an answered `traceparent`.
fn answered_span_id(traceparent: &str) -> &str {
    traceparent.split('-').nth(2).unwrap()
}

/// The gateway on the test configuration plus `extra`, with `env` set and export batches sent every
/// 50 ms (the SDK's own `OTEL_BSP_SCHEDULE_DELAY`) rather than every 5 s; its standard error captured.
async fn start(dir: &std::path::Path, extra: &str, env: &[(&str, &str)]) -> (Gateway, Lines) {
    Gateway::start_capturing(
        dir,
        |_| String::new(),
        extra,
        |command| {
            command
                .env("OTEL_BSP_SCHEDULE_DELAY", "50")
                .envs(env.iter().copied());
        },
    )
    .await
}

#[tokio::test]
async fn a_call_is_a_span_in_the_callers_trace_with_a_child_per_phase_and_no_argument_values() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::default();
    let base = collector.start().await;
    let extra = format!("telemetry: {{ otlp_endpoint: {base:?} }}\n");
    let (gw, _stderr) = start(
        dir.path(),
        &extra,
        &[("OTEL_SERVICE_NAME", "sealgate-under-test")],
    )
    .await;
    let (key, token) = gw.session("exec-otel").await;
    let marker = "marker-5d1c0e7a";

    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(
                1,
                "tool.read",
                json!({"path": format!("/workspace/{marker}")}),
            ),
            &[&format!("00-{TRACE}-{PARENT}-01")],
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let (call, phases) = collector.trace(TRACE, PHASES.len()).await;
    // The call's span is the child of the caller's, and it is the span the answer names.
    assert_eq!(call.name, "POST /v1/invoke");
    assert_eq!(hex::encode(&call.parent_span_id), PARENT);
    assert_eq!(hex::encode(&call.span_id), answered_span_id(&answered));
    assert!(answered.starts_with(&format!("00-{TRACE}-")), "{answered}");
    // One child per phase, in order, none overlapping the next, all within the call.
    let names: Vec<&str> = phases.iter().map(|span| span.name.as_str()).collect();
    assert_eq!(names, PHASES);
    for pair in phases.windows(2) {
        assert!(pair[0].end_time_unix_nano <= pair[1].start_time_unix_nano);
    }
    for phase in &phases {
        assert_eq!(hex::encode(&phase.trace_id), TRACE);
        assert!(phase.start_time_unix_nano >= call.start_time_unix_nano);
        assert!(phase.end_time_unix_nano <= call.end_time_unix_nano);
    }
    let attributes = &call.attributes;
    assert_eq!(
        text(attributes, "sealgate.tool").as_deref(),
        Some("tool.read")
    );
    assert_eq!(
        text(attributes, "sealgate.context").as_deref(),
        Some("test")
    );
    assert_eq!(
        text(attributes, "sealgate.claim").as_deref(),
        Some("PROCEED")
    );
    assert_eq!(
        text(attributes, "sealgate.session_id").as_deref(),
        Some("exec-otel")
    );
    assert_eq!(number(attributes, "http.response.status_code"), Some(200));
    assert_eq!(number(attributes, "sealgate.code"), None);

    // The resource names the service as OTEL_SERVICE_NAME says; the control API has spans of its own.
    let spans = collector.spans();
    assert!(spans
        .iter()
        .all(|(service, _)| service == "sealgate-under-test"));
    assert!(spans
        .iter()
        .any(|(_, span)| span.name == "POST /v1/seal/sessions"));
    // Nothing of the arguments or the token is exported, in any field of any span.
    for raw in collector.raw() {
        let raw = String::from_utf8_lossy(&raw);
        for secret in [marker, token.as_str()] {
            assert!(!raw.contains(secret), "exported: {secret}");
        }
    }
}

#[tokio::test]
async fn a_refused_call_carries_its_code_and_a_trace_started_here_has_one_id_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::default();
    let base = collector.start().await;
    // The standard variable turns export on too.
    let (gw, _stderr) = start(
        dir.path(),
        "",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str())],
    )
    .await;
    let (key, token) = gw.session("exec-otel-refused").await;

    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(1, "tool.forbidden", json!({})),
            &[&format!("00-{TRACE}-{PARENT}-01")],
        )
        .await;
    assert_eq!((status, code(&body)), (403, 2001), "{body}");
    assert_eq!(body["error"]["trace_id"], TRACE);
    let (call, phases) = collector.trace(TRACE, 3).await;
    let names: Vec<&str> = phases.iter().map(|span| span.name.as_str()).collect();
    assert_eq!(names, ["verify", "decide", "settle"]);
    assert_eq!(hex::encode(&call.span_id), answered_span_id(&answered));
    assert_eq!(number(&call.attributes, "sealgate.code"), Some(2001));
    assert_eq!(
        text(&call.attributes, "error.type").as_deref(),
        Some("POLICY_VIOLATION_TOOL_DENIED")
    );
    assert_eq!(
        text(&call.attributes, "sealgate.tool").as_deref(),
        Some("tool.forbidden")
    );
    assert_eq!(
        number(&call.attributes, "http.response.status_code"),
        Some(403)
    );

    // Without a traceparent the trace starts here: the exported span, the answer's traceparent, the
    // error body and the audit event all carry the one trace id, and the sampled flag says it is exported.
    let (status, body, answered) = gw
        .call_traced(&key, &token, tool_call(2, "tool.forbidden", json!({})), &[])
        .await;
    assert_eq!((status, code(&body)), (403, 2001), "{body}");
    let trace_id = body["error"]["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(
        answered,
        format!("00-{trace_id}-{}-01", answered_span_id(&answered))
    );
    let (call, _) = collector.trace(&trace_id, 3).await;
    assert!(call.parent_span_id.is_empty(), "a root span");
    assert_eq!(hex::encode(&call.span_id), answered_span_id(&answered));
    let events = gw.audit_events(&format!("trace_id={trace_id}")).await;
    let codes: Vec<&Value> = events.iter().map(|event| &event["code"]).collect();
    assert_eq!(codes, [&json!(2001)]);
}

/// SPEC 20 r12: the gateway decides which calls are traced. A caller's "not sampled" flag does not hide its
/// call from the traces, and with `sample_ratio: 0` a caller's "sampled" flag does not force export; the
/// answered flags carry the gateway's decision either way.
#[tokio::test]
async fn the_gateway_decides_which_calls_are_traced_whatever_the_callers_flag() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::default();
    let base = collector.start().await;
    let extra = format!("telemetry: {{ otlp_endpoint: {base:?} }}\n");
    // The SDK's variable would follow the caller's flag: it is ignored, and the log says so.
    let (gw, stderr) = start(
        dir.path(),
        &extra,
        &[("OTEL_TRACES_SAMPLER", "parentbased_always_on")],
    )
    .await;
    let (key, token) = gw.session("exec-otel-unsampled").await;
    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(1, "tool.read", json!({"path": "/workspace/a"})),
            &[&format!("00-{TRACE}-{PARENT}-00")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(answered.ends_with("-01"), "{answered}");
    let (call, phases) = collector.trace(TRACE, PHASES.len()).await;
    assert_eq!(hex::encode(&call.parent_span_id), PARENT);
    assert_eq!(phases.len(), PHASES.len());
    stderr.wait_for("about the ignored sampler variable", |l| {
        l.contains("WARN") && l.contains("OTEL_TRACES_SAMPLER") && l.contains("sample_ratio")
    });

    let quiet = tempfile::tempdir().unwrap();
    let extra = format!("telemetry: {{ otlp_endpoint: {base:?}, sample_ratio: 0.0 }}\n");
    let (gw, _stderr) = start(quiet.path(), &extra, &[]).await;
    let (key, token) = gw.session("exec-otel-ratio").await;
    let sampled = "4bf92f3577b34da6a3ce929d0e0e4737";
    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(1, "tool.read", json!({"path": "/workspace/a"})),
            &[&format!("00-{sampled}-{PARENT}-01")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        answered,
        format!("00-{sampled}-{}-00", answered_span_id(&answered))
    );
}

#[test]
fn a_sample_ratio_outside_zero_to_one_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    for ratio in ["1.5", "-0.1"] {
        let extra = format!("telemetry: {{ sample_ratio: {ratio} }}\n");
        let config = write_config(dir.path(), &keys, "http://127.0.0.1:9", "", &extra);
        common::assert_refused_at_start_up(&config, "telemetry.sample_ratio", "hunter2");
    }
}

#[tokio::test]
async fn with_the_collector_down_calls_answer_and_the_log_names_it_without_its_query() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1; the query stands for a credential that no log line may show.
    let endpoint = "http://127.0.0.1:1/otlp?api_key=hunter2";
    let (gw, stderr) = start(
        dir.path(),
        "",
        &[("SEALGATE_TELEMETRY__OTLP_ENDPOINT", endpoint)],
    )
    .await;
    let (key, token) = gw.session("exec-otel-down").await;
    for id in 0..20 {
        let (status, body) = gw
            .call(
                &key,
                &token,
                tool_call(id, "tool.read", json!({"path": "/workspace/a"})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let warning = stderr.wait_for("about the failing collector", |line| {
        line.contains("cannot export traces")
    });
    assert!(
        warning.contains("http://127.0.0.1:1/otlp/v1/traces"),
        "{warning}"
    );
    let lines = stderr.lines();
    assert!(
        lines.iter().all(|line| !line.contains("hunter2")),
        "{lines:#?}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|line| line.contains("cannot export traces"))
            .count(),
        1,
        "one line for a collector that stays down: {lines:#?}"
    );
}

#[test]
fn a_bad_collector_url_stops_start_up_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let extra = "telemetry: { otlp_endpoint: \"http://otel:hunter2@collector:4318\" }\n";
    let config = write_config(dir.path(), &keys, "http://127.0.0.1:9", "", extra);
    common::assert_refused_at_start_up(&config, "telemetry.otlp_endpoint", "hunter2");

    let config = write_config(dir.path(), &keys, "http://127.0.0.1:9", "", "");
    let (status, output) = common::run_cli_with_env(
        &["serve", "--config", config.to_str().unwrap()],
        &[
            ("TEST_TOOL_CREDENTIAL", "x"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "collector:4318/hunter2",
            ),
        ],
    );
    assert_ne!(status, 0, "{output}");
    assert!(
        output.contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        "{output}"
    );
    assert!(!output.contains("hunter2"), "{output}");
}

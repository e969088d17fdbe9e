//! `/metrics` from the real binary after real calls, parsed strictly as the Prometheus text format
//! (0.0.4): every family has HELP and TYPE, histograms are cumulative and end in +Inf = count, and the
//! gauges say what the gateway holds. Who may read them (SPEC 11 r3): an operator token with
//! `seal.metrics.read` on the main listener, or anyone on `metrics.listen`, which then is the only place.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{code, tool_call, Gateway};
use reqwest::Method;
use serde_json::json;

/// One sample: its labels (sorted) and value.
type Samples = Vec<(BTreeMap<String, String>, f64)>;

#[derive(Default, Debug)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    /// By sample name (`x`, `x_bucket`, `x_sum`, `x_count`).
    samples: BTreeMap<String, Samples>,
}

/// Parses `name{a="b",c="d"} value` strictly: quoted values with `\\`, `\"` and `\n` escapes.
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
        "bad metric name in {line}"
    );
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            let (start, first) = chars
                .next()
                .unwrap_or_else(|| panic!("open labels: {line}"));
            if first == '}' {
                rest = &inner[start + 1..];
                break;
            }
            let eq = inner[start..]
                .find('=')
                .unwrap_or_else(|| panic!("label without '=': {line}"))
                + start;
            let key = inner[start..eq].trim_start_matches(',').to_string();
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "unquoted: {line}");
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c @ ('\\' | '"')) => value.push(c),
                        other => panic!("bad escape {other:?}: {line}"),
                    },
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => panic!("unterminated label value: {line}"),
                }
            }
            assert!(
                labels.insert(key, value).is_none(),
                "repeated label: {line}"
            );
            if chars.peek().map(|&(_, c)| c) == Some(',') {
                chars.next();
            }
        }
    }
    let value = rest.trim();
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("bad value {other:?}: {line}")),
    };
    (name.to_string(), labels, value)
}

/// The family a sample belongs to: histogram samples carry a suffix.
fn family_of<'a>(name: &'a str, families: &BTreeMap<String, Family>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if families.get(base).and_then(|f| f.kind.as_deref()) == Some("histogram") {
                return base;
            }
        }
    }
    name
}

fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let (name, text) = help.split_once(' ').expect("HELP without text");
            let family = families.entry(name.to_string()).or_default();
            assert!(family.help.is_none(), "second HELP for {name}");
            assert!(family.samples.is_empty(), "HELP after samples of {name}");
            family.help = Some(text.to_string());
        } else if let Some(kind) = line.strip_prefix("# TYPE ") {
            let (name, kind) = kind.split_once(' ').expect("TYPE without type");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            let family = families.entry(name.to_string()).or_default();
            assert!(family.kind.is_none(), "second TYPE for {name}");
            assert!(family.samples.is_empty(), "TYPE after samples of {name}");
            family.kind = Some(kind.to_string());
        } else if line.starts_with('#') {
            continue;
        } else {
            let (name, labels, value) = parse_sample(line);
            let base = family_of(&name, &families).to_string();
            families
                .entry(base)
                .or_default()
                .samples
                .entry(name)
                .or_default()
                .push((labels, value));
        }
    }
    families
}

/// Checks one histogram family: per label set, buckets cumulative in `le` order, `+Inf` equal to
/// `_count`, and a `_sum`. Returns the total count per label set (without `le`).
fn check_histogram(name: &str, family: &Family) -> BTreeMap<BTreeMap<String, String>, f64> {
    let buckets = &family.samples[&format!("{name}_bucket")];
    let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
    for (labels, value) in buckets {
        let mut labels = labels.clone();
        let le = labels.remove("le").expect("a bucket without le");
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        series.entry(labels).or_default().push((le, *value));
    }
    let lookup = |suffix: &str, labels: &BTreeMap<String, String>| {
        family.samples[&format!("{name}{suffix}")]
            .iter()
            .find(|(l, _)| l == labels)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name}{suffix} missing for {labels:?}"))
    };
    let mut counts = BTreeMap::new();
    for (labels, mut points) in series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(points.len() > 2, "{name} {labels:?}: too few buckets");
        for pair in points.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{name} {labels:?}: repeated le");
            assert!(pair[0].1 <= pair[1].1, "{name} {labels:?}: not cumulative");
        }
        let (last_le, total) = *points.last().unwrap();
        assert_eq!(last_le, f64::INFINITY, "{name} {labels:?}: no +Inf bucket");
        assert_eq!(total, lookup("_count", &labels), "{name} {labels:?}");
        assert!(lookup("_sum", &labels) >= 0.0);
        counts.insert(labels, total);
    }
    counts
}

fn gauge(families: &BTreeMap<String, Family>, name: &str) -> f64 {
    let family = families
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(family.kind.as_deref(), Some("gauge"), "{name}");
    let samples = &family.samples[name];
    assert_eq!(samples.len(), 1, "{name}");
    samples[0].1
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn metrics_are_histograms_and_gauges_with_help_in_the_text_format() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let patterns = json!({"allowed_tool_patterns": ["tool.*", "slow.*"]});
    let (key, token) = gw.session_with("exec-metrics", patterns).await;
    let (pay_key, pay_token) = gw.session("exec-other").await;
    gw.session("exec-revoked").await;
    gw.admin(Method::DELETE, "/v1/seal/sessions/exec-revoked", None)
        .await;
    for id in 1..=2 {
        let (status, _) = gw
            .call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200);
    }
    let (status, _) = gw
        .call(&key, &token, tool_call(3, "tool.forbidden", json!({})))
        .await;
    assert_eq!(status, 403);
    // Sent, never answered in time: 5002, and its claim stays PENDING for an operator.
    let (status, _) = gw
        .call(&key, &token, tool_call(4, "slow.op", json!({})))
        .await;
    assert_eq!(status, 504);
    // Held for an operator's decision (SPEC 13): 4003, one pending approval.
    let (status, _) = gw
        .call(
            &pay_key,
            &pay_token,
            tool_call(5, "pay.send", json!({"amount": 1})),
        )
        .await;
    assert_eq!(status, 403);

    let response = gw
        .client
        .get(format!("{}/metrics", gw.base))
        .bearer_auth(gw.keys.operator_token("seal.metrics.read"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let families = parse(&response.text().await.unwrap());

    for (name, family) in &families {
        assert!(name.starts_with("sealgate_"), "{name}");
        let help = family.help.as_deref().unwrap_or_default();
        assert!(help.len() > 10, "{name} has no HELP");
        assert!(family.kind.is_some(), "{name} has no TYPE");
        assert_ne!(family.kind.as_deref(), Some("summary"), "{name}");
    }

    let requests = &families["sealgate_request_duration_seconds"];
    assert_eq!(requests.kind.as_deref(), Some("histogram"));
    let counts = check_histogram("sealgate_request_duration_seconds", requests);
    let count = |pairs: &[(&str, &str)]| counts.get(&labels(pairs)).copied().unwrap_or(0.0);
    assert_eq!(count(&[("outcome", "success"), ("code_class", "2xx")]), 2.0);
    assert_eq!(count(&[("outcome", "refused"), ("code_class", "4xx")]), 2.0);
    assert_eq!(count(&[("outcome", "failed"), ("code_class", "5xx")]), 1.0);

    let upstream = &families["sealgate_upstream_duration_seconds"];
    let counts = check_histogram("sealgate_upstream_duration_seconds", upstream);
    let count = |pairs: &[(&str, &str)]| counts.get(&labels(pairs)).copied().unwrap_or(0.0);
    assert_eq!(count(&[("upstream", "tool"), ("outcome", "ok")]), 2.0);
    assert_eq!(count(&[("upstream", "slow"), ("outcome", "timeout")]), 1.0);
    // The slow call took at least its upstream's timeout (300 ms): its sum says so.
    let slow_sum = upstream.samples["sealgate_upstream_duration_seconds_sum"]
        .iter()
        .find(|(l, _)| l == &labels(&[("upstream", "slow"), ("outcome", "timeout")]))
        .unwrap()
        .1;
    assert!(slow_sum >= 0.3, "{slow_sum}");

    assert_eq!(gauge(&families, "sealgate_calls_in_flight"), 0.0);
    assert_eq!(gauge(&families, "sealgate_sessions_live"), 2.0);
    assert_eq!(gauge(&families, "sealgate_claims_pending"), 1.0);
    assert_eq!(gauge(&families, "sealgate_approvals_pending"), 1.0);
    let build = &families["sealgate_build_info"];
    assert_eq!(
        build.samples["sealgate_build_info"],
        [(labels(&[("version", env!("CARGO_PKG_VERSION"))]), 1.0)]
    );
    // Every answer above waited for an audit batch; a lone gateway never finds the chain head moved.
    let counter = |name: &str| {
        families
            .get(name)
            .and_then(|family| family.samples.get(name))
            .map_or(0.0, |samples| samples[0].1)
    };
    assert!(counter("sealgate_audit_batches_total") >= 1.0);
    assert_eq!(counter("sealgate_audit_head_conflicts_total"), 0.0);
}

async fn scrape(gw: &Gateway, base: &str, scope: Option<&str>) -> (u16, String) {
    let mut request = gw.client.get(format!("{base}/metrics"));
    if let Some(scope) = scope {
        request = request.bearer_auth(gw.keys.operator_token(scope));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn error_code(text: &str) -> u64 {
    code(&serde_json::from_str(text).unwrap_or_else(|_| panic!("not an error body: {text}")))
}

#[tokio::test]
async fn the_main_listener_serves_metrics_only_to_seal_metrics_read() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (status, text) = scrape(&gw, &gw.base, None).await;
    assert_eq!((status, error_code(&text)), (401, 6001), "{text}");
    let (status, text) = scrape(&gw, &gw.base, Some("seal.audit.read")).await;
    assert_eq!((status, error_code(&text)), (403, 6002), "{text}");
    assert!(text.contains("seal.metrics.read"), "{text}");
    for scope in ["seal.metrics.read", "seal.admin"] {
        let (status, text) = scrape(&gw, &gw.base, Some(scope)).await;
        assert_eq!(status, 200, "{scope}: {text}");
        assert!(text.contains("sealgate_build_info"), "{text}");
    }
    // The token CLI knows the scope, as it knows every other.
    let key = dir.path().join("operator.pem");
    std::fs::write(&key, &gw.keys.operator_private).unwrap();
    let key = key.to_str().unwrap();
    let mint = |scope: &str| {
        common::run_cli(&[
            "token",
            "operator",
            "--key",
            key,
            "--sub",
            "prometheus",
            "--scope",
            scope,
        ])
    };
    let (status, minted) = mint("seal.metrics.read");
    assert_eq!(status, 0, "{minted}");
    let (status, refused) = mint("seal.metric.read");
    assert_ne!(status, 0, "{refused}");
    assert!(
        refused.contains("seal.metrics.read"),
        "the known scopes are listed: {refused}"
    );
}

#[tokio::test]
async fn metrics_listen_serves_them_without_a_token_there_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::mcp::free_port();
    let (gw, _tool) = Gateway::start(
        dir.path(),
        &format!("metrics: {{ listen: \"127.0.0.1:{port}\" }}\n"),
    )
    .await;
    let own = format!("http://127.0.0.1:{port}");
    let (status, text) = scrape(&gw, &own, None).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("sealgate_build_info"), "{text}");
    // Only /metrics there: not the API, not the agent endpoint.
    for path in ["/healthz", "/v1/seal/sessions", "/v1/invoke"] {
        let status = gw
            .client
            .get(format!("{own}{path}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 404, "{path} on the metrics listener");
    }
    // And not on the main listener, whatever the token.
    for scope in [None, Some("seal.admin")] {
        let (status, text) = scrape(&gw, &gw.base, scope).await;
        assert_eq!(
            (status, error_code(&text)),
            (404, 6003),
            "{scope:?}: {text}"
        );
    }
}

/// SPEC 20 r13: `sealgate_decisions_total` counts one decision per call, though an allowed call is
/// recorded by two events (ToolCallAuthorized, then ToolCallCompleted).
#[tokio::test]
async fn each_call_is_counted_as_one_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let patterns = json!({"allowed_tool_patterns": ["tool.*"]});
    let (key, token) = gw.session_with("exec-decisions", patterns).await;
    for id in 1..=3 {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Claimed calls too: their claim is taken between the two events.
    for id in 4..=5 {
        let path = format!("/workspace/decision-{id}");
        let (status, body) = gw
            .call(
                &key,
                &token,
                tool_call(id, "tool.read", json!({"path": path})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = gw
        .call(&key, &token, tool_call(6, "tool.forbidden", json!({})))
        .await;
    assert_eq!((status, code(&body)), (403, 2001), "{body}");

    let (status, text) = scrape(&gw, &gw.base, Some("seal.metrics.read")).await;
    assert_eq!(status, 200, "{text}");
    let families = parse(&text);
    let decisions = &families["sealgate_decisions_total"];
    assert_eq!(decisions.kind.as_deref(), Some("counter"));
    let count = |decision: &str| -> f64 {
        decisions.samples["sealgate_decisions_total"]
            .iter()
            .filter(|(labels, _)| labels["decision"] == decision)
            .map(|(_, value)| value)
            .sum()
    };
    assert_eq!(count("allow"), 5.0, "{text}");
    assert_eq!(count("deny"), 1.0, "{text}");
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The first argument of a metrics macro call that starts `text`: a string literal, or a `const` of
/// `file`.
fn metric_name(text: &str, file: &str) -> String {
    let text = text.trim_start();
    if let Some(literal) = text.strip_prefix('"') {
        return literal[..literal.find('"').unwrap()].to_owned();
    }
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap();
    let declared = format!("const {}: &str = \"", &text[..end]);
    let value = &file[file
        .find(&declared)
        .unwrap_or_else(|| panic!("{declared} not found"))
        + declared.len()..];
    value[..value.find('"').unwrap()].to_owned()
}

/// The metrics the source records and those it describes (HELP), by name.
fn metrics_in_source() -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut recorded, mut described) = (BTreeSet::new(), BTreeSet::new());
    for path in rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        let file = std::fs::read_to_string(&path).unwrap();
        for call in ["counter!(", "gauge!(", "histogram!("] {
            for (at, _) in file.match_indices(call) {
                let name = metric_name(&file[at + call.len()..], &file);
                if file[..at].ends_with("describe_") {
                    described.insert(name);
                } else {
                    recorded.insert(name);
                }
            }
        }
    }
    (recorded, described)
}

/// docs/metrics.md lists every metric the gateway records, and nothing else; each one has its HELP text.
#[test]
fn the_metrics_page_lists_every_metric_the_code_records() {
    let (recorded, described) = metrics_in_source();
    assert!(
        recorded.contains("sealgate_decisions_total"),
        "{recorded:?}"
    );
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    let listed: BTreeSet<String> = page
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .filter(|name| name.starts_with("sealgate_"))
        .collect();
    let unlisted: Vec<_> = recorded.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&recorded).collect();
    let undescribed: Vec<_> = recorded.difference(&described).collect();
    assert!(unlisted.is_empty(), "not in docs/metrics.md: {unlisted:?}");
    assert!(
        gone.is_empty(),
        "in docs/metrics.md, not in the code: {gone:?}"
    );
    assert!(undescribed.is_empty(), "without HELP text: {undescribed:?}");
}

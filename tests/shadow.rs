//! Shadow versions of security contexts (SPEC 6.4 r4) through the real binary: a `NAME.shadow.yaml` file
//! and a shadow set through the API each decide every call beside the version in force, which alone
//! takes effect; differences are recorded, counted and summarised; a shadow that fails validation
//! leaves everything as it was; and on PostgreSQL a shadow set through one replica decides on both, with
//! one summary counting both.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{code, start_tool, write_config, Gateway, Keys};
use reqwest::Method;
use sealgate::store::testing::TestDatabase;
use serde_json::{json, Value};

/// A candidate for the tests' `test` context: paths only under /workspace/src, `tool.off` on the deny
/// list, and payments without a person's approval.
const TEST_SHADOW: &str = r#"
name: test
deny_list: ["tool.forbidden", "secrets.*", "tool.off"]
capabilities:
  - { tool_pattern: "tool.*", path_allowlist: ["/workspace/src"], claim: auto }
  - { tool_pattern: "pay.*", claim: off }
"#;

/// A candidate for the `other` context (which allows every tool): only `tool.*` under /workspace.
fn other_shadow() -> Value {
    json!({"name": "other", "capabilities": [
        {"tool_pattern": "tool.*", "path_allowlist": ["/workspace"], "claim": "off"}]})
}

async fn shadow_of(gw: &Gateway, context: &str) -> (u16, Value) {
    gw.admin(
        Method::GET,
        &format!("/v1/security-contexts/{context}/shadow"),
        None,
    )
    .await
}

fn differences(shadow: &Value) -> Vec<(String, String, String, u64)> {
    shadow["summary"]["differences"]
        .as_array()
        .unwrap_or_else(|| panic!("no differences in {shadow}"))
        .iter()
        .map(|d| {
            let text = |key: &str| d[key].as_str().unwrap().to_owned();
            (
                text("tool"),
                text("live"),
                text("shadow"),
                d["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `detail` of every `SecurityContextChanged` event that has one, newest first.
async fn change_details(gw: &Gateway) -> Vec<String> {
    gw.audit_events("type=SecurityContextChanged")
        .await
        .iter()
        .filter_map(|e| e["detail"].as_str().map(str::to_owned))
        .collect()
}

fn metric(text: &str, context: &str) -> Option<u64> {
    let name = format!("sealgate_shadow_differences_total{{context=\"{context}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&name))
        .map(|value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn a_shadow_file_decides_every_call_beside_the_live_version_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    let shadow_file = dir.path().join("policies/test.shadow.yaml");
    std::fs::write(&shadow_file, TEST_SHADOW).unwrap();
    let gw = Gateway::spawn(dir.path(), &config, keys);
    let (key, token) = gw.session("shadowed").await;

    // What each call gets is what the version in force decides, whatever the shadow says.
    let calls = [
        ("tool.read", json!({"path": "/workspace/a.txt"}), 200, 0),
        ("tool.read", json!({"path": "/workspace/src/b.rs"}), 200, 0),
        ("tool.off", json!({}), 200, 0),
        ("pay.charge", json!({"amount": 5}), 403, 4003),
        ("secrets.read", json!({}), 403, 2001),
    ];
    let ran = tool.count();
    for (name, args, status, refusal) in calls {
        let (got, body) = gw.call_tool(&key, &token, name, args).await;
        assert_eq!(got, status, "{name}: {body}");
        if refusal != 0 {
            assert_eq!(code(&body), refusal, "{name}: {body}");
        }
    }
    assert_eq!(
        tool.count(),
        ran + 3,
        "the calls the live version allowed ran"
    );

    let events = gw.audit_events("type=ShadowDecisionDiffered").await;
    assert_eq!(events.len(), 3, "{events:#?}");
    let (_, live) = gw
        .admin(Method::GET, "/v1/security-contexts/test", None)
        .await;
    let (status, shadow) = shadow_of(&gw, "test").await;
    assert_eq!(status, 200, "{shadow}");
    assert_eq!(live["shadow_version"], shadow["version"], "{live}");
    assert_eq!(shadow["source"]["kind"], "file", "{shadow}");
    assert_eq!(shadow["live_version"], live["version"]);
    let path_event = events
        .iter()
        .find(|e| e["tool"] == "tool.read")
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(path_event["session_id"], "shadowed");
    assert_eq!(path_event["context_version"], live["version"]);
    let decisions = &path_event["decisions"];
    assert_eq!(decisions["live"]["decision"], "allow", "{decisions}");
    assert_eq!(
        decisions["live"]["rule"]["pattern"], "tool.*",
        "{decisions}"
    );
    assert_eq!(decisions["live"]["context_version"], live["version"]);
    assert_eq!(
        (
            &decisions["shadow"]["decision"],
            &decisions["shadow"]["code"]
        ),
        (&json!("deny"), &json!(2002)),
        "{decisions}"
    );
    assert_eq!(decisions["shadow"]["context_version"], shadow["version"]);
    assert!(
        path_event.get("payload").is_none(),
        "arguments are recorded only with include_payloads: {path_event}"
    );
    let pay_event = events.iter().find(|e| e["tool"] == "pay.charge").unwrap();
    assert_eq!(
        (
            &pay_event["decisions"]["live"]["decision"],
            &pay_event["decisions"]["shadow"]["decision"]
        ),
        (&json!("approval"), &json!("allow"))
    );

    assert_eq!(shadow["summary"]["calls"], 5, "{shadow}");
    assert_eq!(shadow["summary"]["differed"], 3, "{shadow}");
    assert!(shadow["summary"]["first_call_at"].is_string(), "{shadow}");
    let mut found = differences(&shadow);
    found.sort();
    assert_eq!(
        found,
        [
            ("pay.charge".into(), "approval".into(), "allow".into(), 1),
            ("tool.off".into(), "allow".into(), "2001".into(), 1),
            ("tool.read".into(), "allow".into(), "2002".into(), 1),
        ]
    );
    assert_eq!(metric(&gw.metrics().await, "test"), Some(3));

    // A file's shadow is read-only over the API, like a file's context.
    for method in [Method::PUT, Method::DELETE] {
        let body = (method == Method::PUT).then(|| json!({"name": "test", "capabilities": []}));
        let (status, answer) = gw
            .admin(method, "/v1/security-contexts/test/shadow", body)
            .await;
        assert_eq!(status, 409, "{answer}");
    }

    // A shadow edited into something invalid is refused and reported; the last good one stays.
    std::fs::write(
        &shadow_file,
        "name: test\ncapabilities:\n  - { tool_pattern: \"tool.**\" }\n",
    )
    .unwrap();
    common::until(Duration::from_secs(5), "the refusal", || async {
        !gw.audit_events("type=SecurityContextRejected")
            .await
            .is_empty()
    })
    .await;
    let rejected = gw.audit_events("type=SecurityContextRejected").await;
    let detail = rejected[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("test.shadow.yaml:3") && detail.contains("tool.**"),
        "{detail}"
    );
    let (_, kept) = shadow_of(&gw, "test").await;
    assert_eq!(kept["version"], shadow["version"]);

    // Removing the file removes the shadow; nothing is compared any more.
    std::fs::remove_file(&shadow_file).unwrap();
    common::until(Duration::from_secs(5), "the shadow's removal", || async {
        shadow_of(&gw, "test").await.0 == 404
    })
    .await;
    let (_, live) = gw
        .admin(Method::GET, "/v1/security-contexts/test", None)
        .await;
    assert!(live.get("shadow_version").is_none(), "{live}");
    let (status, body) = gw.call_tool(&key, &token, "tool.off", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        gw.audit_events("type=ShadowDecisionDiffered").await.len(),
        3
    );
    assert!(change_details(&gw)
        .await
        .contains(&"shadow removed".to_owned()));
}

#[tokio::test]
async fn a_shadow_set_through_the_api_is_checked_summarised_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "audit: { file: audit.jsonl }",
        "audit: { file: audit.jsonl, include_payloads: true }",
    );
    std::fs::write(&config, text).unwrap();
    let gw = Gateway::spawn(dir.path(), &config, keys.clone());
    let path = "/v1/security-contexts/other/shadow";

    // Refused: no such context, a reader's token, and an invalid candidate (naming the field).
    let (status, body) = gw
        .admin(
            Method::PUT,
            "/v1/security-contexts/nope/shadow",
            Some(json!({"capabilities": []})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let reader = keys.operator_token("seal.context.read");
    let (status, body) = gw
        .operator(Method::PUT, path, Some(&reader), Some(other_shadow()))
        .await;
    assert_eq!(status, 403, "{body}");
    let mut invalid = other_shadow();
    invalid["capabilities"][0]["tool_pattern"] = json!("tool.[ab]");
    let (status, body) = gw.admin(Method::PUT, path, Some(invalid)).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("capabilities[0].tool_pattern")),
        "{body}"
    );
    assert_eq!(shadow_of(&gw, "other").await.0, 404);

    let (status, set) = gw.admin(Method::PUT, path, Some(other_shadow())).await;
    assert_eq!(status, 201, "{set}");
    assert_eq!(set["source"]["kind"], "store", "{set}");
    assert_eq!(set["summary"]["calls"], 0, "{set}");
    let (key, token) = gw.session_in("on-other", "other").await;
    let ran = tool.count();
    for (name, args) in [
        ("tool.read", json!({"path": "/workspace/a"})),
        ("tool.read", json!({"path": "/etc/passwd"})),
        ("web.fetch", json!({"url": "https://example.com/"})),
    ] {
        let (status, body) = gw.call_tool(&key, &token, name, args).await;
        // `other` allows everything; `web` has no upstream, so that call fails after the decision.
        assert!(status == 200 || code(&body) == 5004, "{name}: {body}");
    }
    assert_eq!(tool.count(), ran + 2, "the shadow refused nothing that ran");
    let (_, shadow) = shadow_of(&gw, "other").await;
    assert_eq!(shadow["summary"]["calls"], 3, "{shadow}");
    let mut found = differences(&shadow);
    found.sort();
    assert_eq!(
        found,
        [
            ("tool.read".into(), "allow".into(), "2002".into(), 1),
            ("web.fetch".into(), "allow".into(), "2006".into(), 1),
        ]
    );
    let events = gw.audit_events("type=ShadowDecisionDiffered").await;
    let passwd = events.iter().find(|e| e["tool"] == "tool.read").unwrap();
    assert_eq!(
        passwd["payload"]["params"]["arguments"]["path"], "/etc/passwd",
        "with include_payloads the arguments are recorded: {passwd}"
    );

    // Setting it again starts the count over; removing it stops the comparisons.
    let (status, again) = gw.admin(Method::PUT, path, Some(other_shadow())).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["summary"]["calls"], 0, "{again}");
    let (status, body) = gw.admin(Method::DELETE, path, None).await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("deleted")),
        "{body}"
    );
    assert_eq!(shadow_of(&gw, "other").await.0, 404);
    assert_eq!(gw.admin(Method::DELETE, path, None).await.0, 404);
    let (status, body) = gw
        .call_tool(&key, &token, "tool.read", json!({"path": "/etc/hosts"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        gw.audit_events("type=ShadowDecisionDiffered").await.len(),
        2
    );
    assert_eq!(
        change_details(&gw).await,
        ["shadow removed", "shadow set", "shadow set"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_set_through_one_replica_decides_on_both_and_one_summary_counts_both() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = common::start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    let path = "/v1/security-contexts/other/shadow";
    let (status, set) = a.admin(Method::PUT, path, Some(other_shadow())).await;
    assert_eq!(status, 201, "{set}");
    common::until(
        Duration::from_secs(3),
        "the shadow on the other replica",
        || async { shadow_of(b, "other").await.0 == 200 },
    )
    .await;

    let (key, token) = a.session_in("replicated", "other").await;
    let ran = tool.count();
    for gw in [a, b] {
        let (status, body) = gw
            .call_tool(&key, &token, "tool.read", json!({"path": "/etc/passwd"}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(tool.count(), ran + 2);
    // Each replica adds its counts to the store's within about a second.
    common::until(Duration::from_secs(5), "both replicas' counts", || async {
        shadow_of(a, "other").await.1["summary"]["calls"] == 2
    })
    .await;
    let (_, shadow) = shadow_of(b, "other").await;
    assert_eq!(
        differences(&shadow),
        [("tool.read".into(), "allow".into(), "2002".into(), 2)]
    );
    for gw in [a, b] {
        assert_eq!(metric(&gw.metrics().await, "other"), Some(1));
    }

    let (status, body) = b.admin(Method::DELETE, path, None).await;
    assert_eq!(status, 200, "{body}");
    common::until(
        Duration::from_secs(3),
        "the removal on the other replica",
        || async { shadow_of(a, "other").await.0 == 404 },
    )
    .await;
}

//! The control API as documented: the served OpenAPI document checked against the real binary by
//! schemathesis, the session listing, the call count of sessions without a budget, and the SPEC error
//! body on unknown routes and methods.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{code, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// The pinned schemathesis that scripts/test.sh installs (or `SCHEMATHESIS`, a path to the program).
fn schemathesis() -> PathBuf {
    common::pinned_tool("schemathesis", "schemathesis", "SCHEMATHESIS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_the_served_document_true_to_the_control_api() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (status, doc) = gw.admin(Method::GET, "/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["operator"]["scheme"],
        "bearer"
    );
    assert!(doc["paths"]["/v1/seal/sessions"]["get"].is_object());
    // Something to find: a session and a claim that the generated requests may name.
    gw.session("exec-doc").await;
    let token = gw.keys.operator_token("seal.admin");
    let base = gw.base.clone();
    // schemathesis keeps a cache (.schemathesis/) in its working folder: the test's own folder.
    let workdir = dir.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(schemathesis())
            .current_dir(workdir)
            .arg("run")
            .arg(format!("{base}/openapi.json"))
            .args(["--url", &base])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_headers_conformance,response_schema_conformance",
            ])
            // The agent endpoint answers 5xx by design when its upstream fails; it is not control API.
            .args(["--exclude-path-regex", "invoke$"])
            .args(["--phases", "examples,coverage,fuzzing"])
            // One worker: hypothesis's lambda-source cache is not thread-safe, and two workers now
            // and then end a sound run with a runtime error (a KeyError inside hypothesis).
            .args(["--max-examples", "25", "--workers", "1"])
            .args(["--request-timeout", "10"])
            .env("NO_COLOR", "1")
            .output()
            .expect("run schemathesis")
    })
    .await
    .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "schemathesis failed:\n{report}");
    // A run that tested nothing would also exit 0.
    assert!(report.contains("passed"), "{report}");
}

#[tokio::test]
async fn sessions_are_listed_filtered_and_paged() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    for (id, extra) in [
        ("s-c", json!({"agent_id": "agent-1"})),
        ("s-a", json!({"agent_id": "agent-2"})),
        (
            "s-b",
            json!({"agent_id": "agent-1", "security_context": "other"}),
        ),
        ("s-d", json!({"budget": {"max_calls": 0}})),
    ] {
        gw.session_with(id, extra).await;
    }
    gw.admin(Method::DELETE, "/v1/seal/sessions/s-a", None)
        .await;
    let list = |query: &'static str| {
        let gw = &gw;
        async move {
            let (status, page) = gw
                .admin(Method::GET, &format!("/v1/seal/sessions{query}"), None)
                .await;
            assert_eq!(status, 200, "{query}: {page}");
            let ids: Vec<String> = page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["session_id"].as_str().unwrap().to_string())
                .collect();
            (ids, page)
        }
    };
    let (ids, page) = list("").await;
    assert_eq!(ids, ["s-a", "s-b", "s-c", "s-d"]);
    assert_eq!(page["next_cursor"], Value::Null);
    // Never a key or a token.
    assert!(!page.to_string().contains("public_key"));
    assert!(!page.to_string().contains("security_token"));

    let (ids, page) = list("?limit=3").await;
    assert_eq!(ids, ["s-a", "s-b", "s-c"]);
    assert_eq!(page["next_cursor"], "s-c");
    let (ids, page) = list("?limit=3&cursor=s-c").await;
    assert_eq!(
        (ids, &page["next_cursor"]),
        (vec!["s-d".into()], &Value::Null)
    );

    assert_eq!(list("?status=revoked").await.0, ["s-a"]);
    assert_eq!(list("?status=exhausted").await.0, ["s-d"]);
    assert_eq!(list("?status=active").await.0, ["s-b", "s-c"]);
    assert_eq!(list("?context=other").await.0, ["s-b"]);
    assert_eq!(list("?agent_id=agent-1").await.0, ["s-b", "s-c"]);
    // `agent` is the same filter's first name; given together, both must match.
    assert_eq!(list("?agent=agent-1").await.0, ["s-b", "s-c"]);
    assert_eq!(
        list("?agent_id=agent-1&agent=agent-1").await.0,
        ["s-b", "s-c"]
    );
    assert!(list("?agent_id=agent-1&agent=other").await.0.is_empty());
    // Paging under a filter: the page is full of matches, and the cursor continues after them.
    let (ids, page) = list("?status=active&limit=1").await;
    assert_eq!(
        (ids, &page["next_cursor"]),
        (vec!["s-b".into()], &json!("s-b"))
    );
    let (ids, page) = list("?status=active&limit=1&cursor=s-b").await;
    assert_eq!(
        (ids, &page["next_cursor"]),
        (vec!["s-c".into()], &Value::Null)
    );

    for (query, problem) in [
        ("?status=gone", "status"),
        ("?limit=0", "limit"),
        ("?stauts=active", "stauts"),
        // A NUL in a cursor or filter is refused before any store sees it (PostgreSQL text holds none).
        ("?cursor=a%00b", "\"cursor\" contains a control character"),
        ("?agent=%1F", "\"agent\" contains a control character"),
    ] {
        let (status, body) = gw
            .admin(Method::GET, &format!("/v1/seal/sessions{query}"), None)
            .await;
        assert_eq!((status, code(&body)), (422, 6005), "{query}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(problem));
    }
    // The session read scope, as for one session; nothing without a token.
    let reader = gw.keys.operator_token("seal.session.read");
    let creator = gw.keys.operator_token("seal.session.create");
    let (status, _) = gw
        .operator(Method::GET, "/v1/seal/sessions", Some(&reader), None)
        .await;
    assert_eq!(status, 200);
    let (status, body) = gw
        .operator(Method::GET, "/v1/seal/sessions", Some(&creator), None)
        .await;
    assert_eq!((status, code(&body)), (403, 6002));
    let (status, body) = gw
        .operator(Method::GET, "/v1/seal/sessions", None, None)
        .await;
    assert_eq!((status, code(&body)), (401, 6001));
}

#[tokio::test]
async fn a_session_without_a_budget_counts_its_allowed_calls() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-unlimited").await;
    for id in 1..=3 {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // A refusal is no allowed call.
    let (status, _) = gw
        .call(&key, &token, tool_call(4, "tool.forbidden", json!({})))
        .await;
    assert_eq!(status, 403);
    let (status, view) = gw
        .admin(Method::GET, "/v1/seal/sessions/exec-unlimited", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(view["calls"]["allowed"], 3, "{view}");
    assert_eq!(view["budget"]["max_calls"], Value::Null);
    assert_eq!(view["status"], "active");
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_with_the_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    for (method, path, status, number) in [
        (Method::GET, "/v1/nothing", 404, 6003),
        (Method::GET, "/v1/seal/sessions/a/b", 404, 6003),
        (Method::PUT, "/v1/seal/sessions", 405, 6005),
        (Method::PATCH, "/v1/seal/sessions/x", 405, 6005),
        (Method::GET, "/v1/invoke", 405, 6005),
        (Method::GET, "/v1/seal/invoke", 405, 6005),
        (Method::POST, "/metrics", 405, 6005),
    ] {
        let response = gw
            .client
            .request(method.clone(), format!("{}{path}", gw.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "{method} {path}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["protocol"], "seal/v1", "{method} {path}: {body}");
        assert_eq!(code(&body), number, "{method} {path}: {body}");
    }
}

//! Black-box tests of the audit trail (SPEC section 9): the events a scripted sequence yields, payloads kept
//! out, the chain checked independently of the gateway's code, `sealgate audit verify`, and a SIGKILL.

mod common;

use common::{run_cli, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Checks the chain of JSON lines with serde_jcs and sha2 directly, not with the gateway's own code.
fn verify_independently(lines: &[Value]) {
    let mut prev = "0".repeat(64);
    for (i, event) in lines.iter().enumerate() {
        let mut unhashed = event.as_object().unwrap().clone();
        let hash = unhashed.remove("hash").unwrap();
        assert_eq!(event["prev_hash"], json!(prev), "line {i}: prev_hash");
        let digest = hex::encode(Sha256::digest(serde_jcs::to_vec(&unhashed).unwrap()));
        assert_eq!(hash, json!(digest), "line {i}: hash");
        if i > 0 {
            assert_eq!(
                event["seq"].as_u64(),
                lines[i - 1]["seq"].as_u64().map(|s| s + 1)
            );
        }
        prev = digest;
    }
}

fn read_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_scripted_sequence_yields_exactly_the_expected_events() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let marker = "MARKER-7f3a9c-never-in-the-trail";
    let (key, token) = gw.session("exec-audit").await;
    let now = sealgate::clock::now_secs();
    // allowed, then SKIP
    let allowed = sealgate::envelope::sign_envelope(
        &key,
        tool_call(
            1,
            "tool.write",
            json!({"path": "/workspace/a", "note": marker}),
        ),
        &token,
        now,
    );
    assert_eq!(gw.post(&allowed).await.0, 200);
    assert_eq!(
        gw.call(
            &key,
            &token,
            tool_call(
                2,
                "tool.write",
                json!({"path": "/workspace/a", "note": marker})
            )
        )
        .await
        .0,
        200
    );
    // replay (1008), tampered (1002), denied tool (2001), path (2002)
    assert_eq!(gw.post(&allowed).await.0, 401);
    let mut tampered = sealgate::envelope::sign_envelope(
        &key,
        tool_call(3, "tool.off", json!({"note": marker})),
        &token,
        now,
    );
    tampered["payload"]["id"] = json!(4);
    assert_eq!(gw.post(&tampered).await.0, 401);
    assert_eq!(
        gw.call(
            &key,
            &token,
            tool_call(5, "tool.forbidden", json!({"note": marker}))
        )
        .await
        .0,
        403
    );
    assert_eq!(
        gw.call(
            &key,
            &token,
            tool_call(
                6,
                "tool.read",
                json!({"path": "/etc/passwd", "note": marker})
            )
        )
        .await
        .0,
        403
    );
    // revoke, then a refused call (1006)
    assert_eq!(
        gw.admin(Method::DELETE, "/v1/seal/sessions/exec-audit", None)
            .await
            .0,
        200
    );
    assert_eq!(
        gw.call(&key, &token, tool_call(7, "tool.off", json!({})))
            .await
            .0,
        401
    );

    let (status, page) = gw
        .admin(
            Method::GET,
            "/v1/audit?session_id=exec-audit&limit=100",
            None,
        )
        .await;
    assert_eq!(status, 200);
    let mut items = page["items"].as_array().unwrap().clone();
    items.reverse(); // the API is newest first
    let seen: Vec<(String, Option<u64>)> = items
        .iter()
        .map(|e| (e["type"].as_str().unwrap().to_string(), e["code"].as_u64()))
        .collect();
    let expected: Vec<(String, Option<u64>)> = [
        ("SessionCreated", None),
        ("ToolCallAuthorized", None),
        ("ToolCallCompleted", None),
        ("ClaimSkipped", None),
        ("EnvelopeRejected", Some(1008)),
        ("SignatureVerificationFailed", Some(1002)),
        ("PolicyViolationBlocked", Some(2001)),
        ("PolicyViolationBlocked", Some(2002)),
        ("SessionRevoked", None),
        ("EnvelopeRejected", Some(1006)),
    ]
    .iter()
    .map(|(t, c)| (t.to_string(), *c))
    .collect();
    assert_eq!(seen, expected);
    assert_eq!(items[1]["claim"], "PROCEED");
    assert_eq!(items[3]["claim"], "SKIP");
    assert_eq!(items[1]["request_id"], items[3]["request_id"]);
    assert_eq!(
        items[6]["rule"],
        json!({"kind": "deny_list", "index": 0, "pattern": "tool.forbidden"})
    );
    assert_eq!(items[7]["rule"]["kind"], "capability");
    assert_eq!(items[1]["payload_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(items[4]["signature"], allowed["signature"]);
    assert!(items.iter().all(|e| e["session_id"] == "exec-audit"));
    // Filters: by type and code, newest first, with a working cursor.
    let (_, denied) = gw
        .admin(
            Method::GET,
            "/v1/audit?type=PolicyViolationBlocked&code=2002",
            None,
        )
        .await;
    assert_eq!(denied["items"].as_array().unwrap().len(), 1);
    let (_, first) = gw
        .admin(Method::GET, "/v1/audit?session_id=exec-audit&limit=4", None)
        .await;
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    let (_, second) = gw
        .admin(
            Method::GET,
            &format!("/v1/audit?session_id=exec-audit&limit=4&cursor={cursor}"),
            None,
        )
        .await;
    assert!(first["items"][3]["seq"].as_u64() > second["items"][0]["seq"].as_u64());
    assert_eq!(
        gw.operator(
            Method::GET,
            "/v1/audit",
            Some(&gw.keys.operator_token("seal.claim.read")),
            None
        )
        .await
        .0,
        403
    );

    // The marker never reached the trail, neither the store nor the file.
    assert!(!page.to_string().contains(marker));
    let file = gw.audit_file().await;
    assert!(!file.contains(marker));
    verify_independently(&read_lines(&dir.path().join("audit.jsonl")));
}

fn audit_verify(path: &std::path::Path) -> (bool, String) {
    let (status, out) = run_cli(&["audit", "verify", path.to_str().unwrap()]);
    (status == 0, out)
}

#[tokio::test]
async fn audit_verify_names_the_first_broken_event() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-verify").await;
    for i in 0..4 {
        gw.call(&key, &token, tool_call(i, "tool.off", json!({})))
            .await;
    }
    drop(gw);
    let path = dir.path().join("audit.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 6);
    assert!(audit_verify(&path).0);

    let write = |name: &str, lines: Vec<String>| {
        let p = dir.path().join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    };
    let owned: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let seq_of = |line: &str| {
        serde_json::from_str::<Value>(line).unwrap()["seq"]
            .as_u64()
            .unwrap()
    };

    let mut edited = owned.clone();
    edited[2] = edited[2].replace("\"exec-verify\"", "\"exec-other\"");
    let (ok, out) = audit_verify(&write("edited.jsonl", edited));
    assert!(!ok && out.contains(&seq_of(lines[2]).to_string()), "{out}");

    let mut deleted = owned.clone();
    deleted.remove(3);
    let (ok, out) = audit_verify(&write("deleted.jsonl", deleted));
    assert!(!ok && out.contains(&seq_of(lines[4]).to_string()), "{out}");

    let mut reordered = owned.clone();
    reordered.swap(2, 3);
    let (ok, _) = audit_verify(&write("reordered.jsonl", reordered));
    assert!(!ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_a_burst_leaves_a_chain_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-burst").await;
    let gw_base = gw.base.clone();
    let client = reqwest::Client::new();
    let mut burst = Vec::new();
    for i in 0..60u64 {
        let envelope = sealgate::envelope::sign_envelope(
            &key,
            tool_call(i, "tool.off", json!({})),
            &token,
            sealgate::clock::now_secs(),
        );
        let (client, url) = (client.clone(), format!("{gw_base}/v1/invoke"));
        burst.push(tokio::spawn(async move {
            client.post(url).json(&envelope).send().await.is_ok()
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    tokio::task::block_in_place(|| gw.restart());
    for call in burst {
        let _ = call.await;
    }
    // The chain continues after the restart without a gap or a fork.
    gw.call(&key, &token, tool_call(1000, "tool.off", json!({})))
        .await;
    let (status, page) = gw.admin(Method::GET, "/v1/audit?limit=1000", None).await;
    assert_eq!(status, 200);
    let mut items = page["items"].as_array().unwrap().clone();
    items.reverse();
    verify_independently(&items);
    assert_eq!(items[0]["seq"], 1);
}

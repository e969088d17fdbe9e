//! Signed receipts and signed audit checkpoints (SPEC 14) through the real binary: `GET /v1/keys`, the
//! receipts of successes, SKIPs, `tools/list` and refusals, checkpoints in the chain, and the offline
//! verifiers — checked also with code we did not write (Python `cryptography` over `rfc8785`, and
//! `openssl pkeyutl -verify -rawin`), against tampering, across a SIGKILL, across a key rotation, and on
//! two replicas sharing PostgreSQL.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{code, run_cli, tool_call, until, Gateway};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The gateway of the black-box tests, with `audit_keys` added to its `audit:` section.
async fn start(dir: &Path, audit_keys: &str, extra: &str) -> (Gateway, Arc<common::Tool>) {
    let (tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let config = configure(dir, &keys, &tool_base, audit_keys, extra);
    (Gateway::spawn(dir, &config, keys), tool)
}

fn configure(
    dir: &Path,
    keys: &common::Keys,
    tool_base: &str,
    audit_keys: &str,
    extra: &str,
) -> PathBuf {
    let config = common::write_config(dir, keys, tool_base, "", extra);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "audit: { file: audit.jsonl }",
        &format!("audit: {{ file: audit.jsonl, {audit_keys} }}"),
    );
    std::fs::write(&config, text).unwrap();
    config
}

fn keys_url(gw: &Gateway) -> String {
    format!("{}/v1/keys", gw.base)
}

async fn key_set(gw: &Gateway) -> Value {
    let response = gw.client.get(keys_url(gw)).send().await.unwrap();
    assert_eq!(response.status(), 200, "/v1/keys needs no token");
    response.json().await.unwrap()
}

/// The kids of a JWK Set, in its order.
fn kids_of(set: &Value) -> Vec<String> {
    let keys = set["keys"].as_array().unwrap();
    keys.iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

fn events(export: &str) -> Vec<Value> {
    export
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn checkpoints(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "AuditCheckpoint")
        .collect()
}

fn save(dir: &Path, name: &str, value: &impl ToString) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).unwrap();
    path
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Sends `payload` signed now; returns the envelope with the answer.
async fn call(
    gw: &Gateway,
    key: &ed25519_dalek::SigningKey,
    token: &str,
    payload: Value,
) -> (Value, u16, Value) {
    let envelope =
        sealgate::envelope::sign_envelope(key, payload, token, sealgate::clock::now_secs());
    let (status, body) = gw.post(&envelope).await;
    (envelope, status, body)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The Python of `scripts/test.sh`'s venv (Python `cryptography` and the pinned `rfc8785`).
fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venvs/evidence/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test.sh, which installs the pinned rfc8785",
        python.display()
    );
    python
}

fn openssl_verifies(dir: &Path, name: &str, message: &Path) -> bool {
    let kid = std::fs::read_to_string(dir.join(format!("{name}.kid"))).unwrap();
    Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
        .arg(dir.join(format!("{kid}.pem")))
        .arg("-in")
        .arg(message)
        .arg("-sigfile")
        .arg(dir.join(format!("{name}.sig")))
        .output()
        .expect("openssl runs (scripts/test.sh installs it)")
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_and_checkpoints_verify_with_python_cryptography_and_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = start(dir.path(), "checkpoint_every: 4", "").await;
    let set = key_set(&gw).await;
    let kid = set["keys"][0]["kid"].as_str().unwrap().to_owned();
    assert_eq!(set["keys"].as_array().unwrap().len(), 1, "{set}");
    // The key made at first start is the owner's alone, and it is the key that /v1/keys names.
    let key_file = dir.path().join("data/signing.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let key = sealgate::envelope::read_signing_key_file(&key_file).unwrap();
    assert_eq!(
        sha256_hex(key.verifying_key().as_bytes())[..16],
        kid,
        "kid = first 16 hex digits of SHA-256(public key)"
    );

    let (agent_key, token) = gw.session("exec-evidence").await;
    let write = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "tool.write",
               "arguments": {"path": "/workspace/a.txt"}, "_meta": {"idempotency_key": "once"}}})
    };
    let proceed = call(&gw, &agent_key, &token, write(1)).await;
    let skip = call(&gw, &agent_key, &token, write(2)).await;
    let listed = call(
        &gw,
        &agent_key,
        &token,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .await;
    let denied = call(
        &gw,
        &agent_key,
        &token,
        tool_call(4, "tool.forbidden", json!({})),
    )
    .await;
    assert_eq!(
        [proceed.1, skip.1, listed.1, denied.1],
        [200, 200, 200, 403],
        "{}",
        denied.2
    );
    assert_eq!(proceed.2["receipt"]["claim"], "PROCEED");
    assert_eq!(skip.2["receipt"]["claim"], "SKIP");
    for field in ["request_id", "action_ref", "claimed_at"] {
        assert_eq!(
            skip.2["receipt"][field], proceed.2["receipt"][field],
            "{field}"
        );
    }
    assert_ne!(
        skip.2["receipt"]["event_seq"],
        proceed.2["receipt"]["event_seq"]
    );
    assert!(listed.2["receipt"].get("tool").is_none(), "{}", listed.2);
    assert_eq!(proceed.2["receipt"]["tool"], "tool.write");
    let refusal = &denied.2["error"]["receipt"];
    assert_eq!(
        (refusal["decision"].as_str(), refusal["code"].as_u64()),
        (Some("deny"), Some(2001))
    );

    // Refusals before check 8 passes carry no receipt: a replayed envelope and a bad signature.
    let (status, replayed) = gw.post(&proceed.0).await;
    assert_eq!((status, code(&replayed)), (401, 1008));
    let mut forged = proceed.0.clone();
    forged["payload"]["id"] = json!(99);
    let (status, bad) = gw.post(&forged).await;
    assert_eq!((status, code(&bad)), (401, 1002));
    for body in [&replayed, &bad] {
        assert!(body["error"].get("receipt").is_none(), "{body}");
    }

    // Each receipt's event_seq is the event that records its outcome.
    let answered = [
        (&proceed, "ToolCallCompleted"),
        (&skip, "ClaimSkipped"),
        (&listed, "ToolCallCompleted"),
        (&denied, "PolicyViolationBlocked"),
    ];
    let trail = events(&gw.export().await);
    for ((_, _, body), kind) in &answered {
        let receipt = if body["status"] == "success" {
            &body["receipt"]
        } else {
            &body["error"]["receipt"]
        };
        let seq = receipt["event_seq"].as_u64().unwrap();
        let event = &trail[seq as usize - 1];
        assert_eq!(
            (event["seq"].as_u64(), event["type"].as_str()),
            (Some(seq), Some(*kind))
        );
        assert_eq!(event["event_id"], receipt["event_id"]);
        assert_eq!(receipt["sig"]["kid"], kid.as_str());
        assert_eq!(receipt["replica_id"], event["replica"]);
    }

    // The gateway's own verifier, against the URL of /v1/keys and against a saved copy of it.
    let work = dir.path();
    let jwks = save(work, "keys.json", &set);
    let mut files = Vec::new();
    for (index, ((envelope, _, body), _)) in answered.iter().enumerate() {
        let response = save(work, &format!("response-{index}.json"), body);
        let sent = save(work, &format!("envelope-{index}.json"), envelope);
        for keys in [keys_url(&gw), text(&jwks).to_owned()] {
            let (status, out) = run_cli(&[
                "receipt",
                "verify",
                "--keys",
                &keys,
                text(&response),
                "--envelope",
                text(&sent),
            ]);
            assert_eq!(status, 0, "{out}");
            assert!(
                out.contains("payload_sha256 matches the envelope's payload"),
                "{out}"
            );
        }
        files.push(response);
        files.push(sent);
    }
    let trail_text = gw.export().await;
    assert!(checkpoints(&events(&trail_text)).len() >= 2, "{trail_text}");
    let exported = save(work, "export.jsonl", &trail_text);
    let (status, out) = run_cli(&["audit", "verify", text(&exported), "--keys", &keys_url(&gw)]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("checkpoints verified"), "{out}");

    // Python `cryptography` over `rfc8785`, from the JWK Set alone.
    let openssl_dir = tempfile::tempdir().unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/evidence/independent_verify.py"
    );
    let output = Command::new(python())
        .arg(script)
        .args([&jwks, &exported, &openssl_dir.path().to_path_buf()])
        .args(&files)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let counts: Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(counts["receipts"], 4);
    assert!(counts["checkpoints"].as_u64().unwrap() >= 2, "{counts}");

    // OpenSSL over the canonical bytes that Python wrote; and a changed byte fails.
    let signed: Vec<String> = std::fs::read_dir(openssl_dir.path())
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".msg").map(str::to_owned)
        })
        .collect();
    assert_eq!(
        signed.len() as u64,
        4 + counts["checkpoints"].as_u64().unwrap()
    );
    for name in &signed {
        let message = openssl_dir.path().join(format!("{name}.msg"));
        assert!(
            openssl_verifies(openssl_dir.path(), name, &message),
            "{name}"
        );
        let mut altered = std::fs::read(&message).unwrap();
        altered[2] ^= 1;
        let altered_path = openssl_dir.path().join("altered");
        std::fs::write(&altered_path, altered).unwrap();
        assert!(
            !openssl_verifies(openssl_dir.path(), name, &altered_path),
            "{name}"
        );
    }
}

/// Changes one value so that it still has its JSON type where it can.
fn changed(value: &Value) -> Value {
    match value {
        Value::String(s) if s.len() > 2 => Value::String(format!("{}x", &s[..s.len() - 1])),
        Value::Number(n) => json!(n.as_u64().unwrap_or(0) + 1),
        _ => json!("changed"),
    }
}

/// Recomputes every `prev_hash` and `hash` from the first event on, as someone who can write to the
/// database could (serde_jcs and sha2: not the gateway's code).
fn rechain(events: &mut [Value]) {
    let mut previous = events[0]["prev_hash"].as_str().unwrap().to_owned();
    for (index, event) in events.iter_mut().enumerate() {
        event["seq"] = json!(index + 1);
        event["prev_hash"] = json!(previous);
        let object = event.as_object_mut().unwrap();
        object.remove("hash");
        let hash = sha256_hex(&serde_jcs::to_vec(&object).unwrap());
        object.insert("hash".into(), json!(hash));
        previous = hash;
    }
}

fn lines(events: &[Value]) -> String {
    events.iter().map(|e| format!("{e}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_changed_receipt_field_and_a_rewritten_chain_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = start(dir.path(), "checkpoint_every: 3", "").await;
    let (key, token) = gw.session("exec-tamper").await;
    for id in 0..6 {
        let (_, status, _) = call(
            &gw,
            &key,
            &token,
            tool_call(id, "tool.off", json!({"n": id})),
        )
        .await;
        assert_eq!(status, 200);
    }
    let (envelope, status, body) =
        call(&gw, &key, &token, tool_call(9, "tool.off", json!({"n": 9}))).await;
    assert_eq!(status, 200, "{body}");
    let work = dir.path();
    let keys = save(work, "keys.json", &key_set(&gw).await);
    let sent = save(work, "envelope.json", &envelope);
    let verify = |body: &Value, envelope: &Path| {
        let response = save(work, "response.json", body);
        run_cli(&[
            "receipt",
            "verify",
            "--keys",
            text(&keys),
            text(&response),
            "--envelope",
            text(envelope),
        ])
    };
    assert_eq!(verify(&body, &sent).0, 0);

    let receipt = body["receipt"].as_object().unwrap().clone();
    let mut fields: Vec<(String, Option<&str>)> = receipt
        .keys()
        .filter(|k| *k != "sig")
        .map(|k| (k.clone(), None))
        .collect();
    for part in ["alg", "kid", "value"] {
        fields.push(("sig".into(), Some(part)));
    }
    for (field, part) in fields {
        let mut tampered = body.clone();
        let target = match part {
            Some(part) => &mut tampered["receipt"][&field][part],
            None => &mut tampered["receipt"][&field],
        };
        *target = changed(target);
        let (status, out) = verify(&tampered, &sent);
        let named = part.map_or(field.clone(), |part| format!("{field}.{part}"));
        assert_eq!(status, 1, "{named} changed, yet: {out}");
        assert!(out.contains("broken: sig"), "{named}: {out}");
    }
    let mut other_answer = body.clone();
    other_answer["payload"]["result"]["echo"]["n"] = json!(10);
    let (status, out) = verify(&other_answer, &sent);
    assert_eq!(status, 1);
    assert!(out.contains("answer_sha256 does not match"), "{out}");
    let mut other_envelope = envelope.clone();
    other_envelope["payload"]["params"]["arguments"]["n"] = json!(10);
    let (status, out) = verify(&body, &save(work, "other.json", &other_envelope));
    assert_eq!(status, 1);
    assert!(out.contains("payload_sha256 does not match"), "{out}");

    // The chain: an event inside a checkpointed range changed breaks it where it was changed.
    let trail = events(&gw.export().await);
    let signed = checkpoints(&trail);
    let last_checkpoint = signed.last().unwrap()["seq"].as_u64().unwrap();
    assert!(last_checkpoint >= 4, "{trail:?}");
    let inside = 2usize; // seq 2, covered by every checkpoint
    let mut edited = trail.clone();
    edited[inside - 1]["tool"] = json!("tool.other");
    let file = save(work, "edited.jsonl", &lines(&edited));
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&keys)]);
    assert_eq!(status, 1);
    assert!(
        out.contains("seq 2") && out.contains("hash does not match"),
        "{out}"
    );

    // Rewritten with a fresh, self-consistent hash chain: the chain alone passes, the checkpoints do not.
    rechain(&mut edited);
    let file = save(work, "rechained.jsonl", &lines(&edited));
    let (status, out) = run_cli(&["audit", "verify", text(&file)]);
    assert_eq!(status, 0, "{out}");
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&keys)]);
    assert_eq!(status, 1);
    let first = signed[0];
    assert!(
        out.contains(&format!(
            "seq {}, event_id {}",
            first["seq"],
            first["event_id"].as_str().unwrap()
        )) && out.contains("checkpoint.hash is not the hash of the event before it"),
        "{out}"
    );
    // ... also when the checkpoints' hashes are rewritten to match: their signatures fail.
    let mut resigned = edited.clone();
    for index in 1..resigned.len() {
        if resigned[index]["type"] == "AuditCheckpoint" {
            resigned[index]["checkpoint"]["hash"] = resigned[index - 1]["hash"].clone();
            rechain(&mut resigned);
        }
    }
    let file = save(work, "resigned.jsonl", &lines(&resigned));
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&keys)]);
    assert_eq!(status, 1);
    assert!(out.contains("checkpoint.sig does not verify"), "{out}");
    // ... and with every checkpoint removed, nothing in the file is signed.
    let mut unsigned: Vec<Value> = trail
        .iter()
        .filter(|e| e["type"] != "AuditCheckpoint")
        .cloned()
        .collect();
    rechain(&mut unsigned);
    let file = save(work, "unsigned.jsonl", &lines(&unsigned));
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&keys)]);
    assert_eq!(status, 1);
    assert!(out.contains("no AuditCheckpoint in these files"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_listed_newest_first_from_a_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = start(dir.path(), "checkpoint_every: 2", "").await;
    let (key, token) = gw.session("exec-listed").await;
    for id in 0..6 {
        call(&gw, &key, &token, tool_call(id, "tool.off", json!({}))).await;
    }
    let trail = events(&gw.export().await);
    let all: Vec<u64> = checkpoints(&trail)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(all.len() >= 4, "{all:?}");
    let list = |query: String| {
        let gw = &gw;
        async move {
            gw.operator(
                Method::GET,
                &format!("/v1/audit/checkpoints{query}"),
                Some(&gw.keys.operator_token("seal.audit.read")),
                None,
            )
            .await
        }
    };
    let seqs = |page: &Value| -> Vec<u64> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    };
    let (status, page) = list(String::new()).await;
    assert_eq!(status, 200);
    let newest_first: Vec<u64> = all.iter().rev().copied().collect();
    assert_eq!(seqs(&page), newest_first);
    assert!(page["next_cursor"].is_null());
    assert!(page["items"][0]["checkpoint"]["sig"].is_string());
    let (_, first) = list("?limit=2".into()).await;
    assert_eq!(seqs(&first), newest_first[..2]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = list(format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(seqs(&second), newest_first[2..4]);
    let from = all[1];
    let (_, recent) = list(format!("?from_seq={from}")).await;
    assert_eq!(seqs(&recent), newest_first[..all.len() - 1]);
    assert!(recent["next_cursor"].is_null());

    let (status, body) = list("?from_seq=soon".into()).await;
    assert_eq!((status, code(&body)), (422, 6005));
    let (status, body) = gw
        .operator(
            Method::GET,
            "/v1/audit/checkpoints",
            Some(&gw.keys.operator_token("seal.session.read")),
            None,
        )
        .await;
    assert_eq!((status, code(&body)), (403, 6002));
}

fn public_pem(key_file: &Path) -> String {
    let key = sealgate::envelope::read_signing_key_file(key_file).unwrap();
    sealgate::envelope::public_key_pem(&key.verifying_key()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_keeps_what_the_old_one_signed_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let config = configure(dir.path(), &keys, &tool_base, "checkpoint_every: 2", "");
    let mut gw = Gateway::spawn(dir.path(), &config, keys.clone());
    let (agent_key, token) = gw.session("exec-rotate").await;
    let (_, status, before) =
        call(&gw, &agent_key, &token, tool_call(1, "tool.off", json!({}))).await;
    assert_eq!(status, 200);
    let old_kid = before["receipt"]["sig"]["kid"].as_str().unwrap().to_owned();

    // The rotation of docs/evidence.md: a new key file, the old public key kept, a restart.
    let old_public = save(
        dir.path(),
        "old.pub.pem",
        &public_pem(&dir.path().join("data/signing.key")),
    );
    std::fs::create_dir(dir.path().join("keys")).unwrap();
    let new_key = common::signing_key_file(&dir.path().join("keys"));
    let rotated = configure(
        dir.path(),
        &keys,
        &tool_base,
        "checkpoint_every: 2",
        &format!(
            "signing: {{ key_file: {:?}, previous_public_keys: [{:?}] }}\n",
            new_key, old_public
        ),
    );
    assert_eq!(rotated, config);
    gw.restart();
    let set = key_set(&gw).await;
    let kids = kids_of(&set);
    assert_eq!(kids.len(), 2, "{set}");
    assert_eq!(kids[1], old_kid, "the retired key follows the current one");
    let (_, status, after) =
        call(&gw, &agent_key, &token, tool_call(2, "tool.off", json!({}))).await;
    assert_eq!(status, 200);
    assert_eq!(after["receipt"]["sig"]["kid"], kids[0].as_str());

    let work = dir.path();
    for (name, body) in [("before.json", &before), ("after.json", &after)] {
        let response = save(work, name, body);
        let (status, out) = run_cli(&[
            "receipt",
            "verify",
            "--keys",
            &keys_url(&gw),
            text(&response),
        ]);
        assert_eq!(status, 0, "{name}: {out}");
    }
    let exported = save(work, "export.jsonl", &gw.export().await);
    let (status, out) = run_cli(&["audit", "verify", text(&exported), "--keys", &keys_url(&gw)]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains(&old_kid) && out.contains(&kids[0]), "{out}");

    // Without the retired key, what it signed no longer verifies: the command names the kid.
    let current_only = json!({"keys": [set["keys"][0].clone()]});
    let keys_file = save(work, "current.json", &current_only);
    let (status, out) = run_cli(&[
        "audit",
        "verify",
        text(&exported),
        "--keys",
        text(&keys_file),
    ]);
    assert_eq!(status, 1);
    assert!(
        out.contains(&format!("checkpoint.kid \"{old_kid}\" is not a key")),
        "{out}"
    );
}

#[test]
fn key_files_that_others_can_read_or_that_postgres_lacks_stop_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let keys = common::Keys::new();
    let key = common::signing_key_file(dir.path());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = common::write_config(
        dir.path(),
        &keys,
        "http://127.0.0.1:9",
        "",
        &format!("signing: {{ key_file: {key:?} }}\n"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["serve", "--config", text(&config)])
        .env("TEST_TOOL_CREDENTIAL", "x")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("mode 0644") && said.contains("chmod 600"),
        "{said}"
    );

    // `serve --check` finds what `serve` refuses, without a database.
    let config = save(
        dir.path(),
        "pg.yaml",
        &"store: \"postgres://nobody@127.0.0.1:9/none\"\n",
    );
    let (status, out) = run_cli(&["serve", "--config", text(&config), "--check"]);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("signing.key_file: required on a postgres:// store"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_the_chain_verifies_and_the_unsigned_tail_is_signed_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints by the interval only, every 3 s: time enough for calls that stay unsigned.
    let (mut gw, _tool) = start(dir.path(), "checkpoint_secs: 3", "").await;
    let jwks = save(dir.path(), "keys.json", &key_set(&gw).await);
    let (key, token) = gw.session("exec-crash").await;
    let file = dir.path().join("audit.jsonl");
    let signed_file = || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        events(&text)
            .last()
            .is_some_and(|e| e["type"] == "AuditCheckpoint")
    };
    until(
        Duration::from_secs(10),
        "the session's event signed",
        || async { signed_file() },
    )
    .await;

    // Calls answered since that checkpoint, then a burst killed mid-way.
    for id in 100..103 {
        let (_, status, _) = call(&gw, &key, &token, tool_call(id, "tool.off", json!({}))).await;
        assert_eq!(status, 200);
    }
    let client = reqwest::Client::new();
    let mut burst = Vec::new();
    for id in 0..60u64 {
        let envelope = sealgate::envelope::sign_envelope(
            &key,
            tool_call(id, "tool.off", json!({})),
            &token,
            sealgate::clock::now_secs(),
        );
        let (client, url) = (client.clone(), format!("{}/v1/invoke", gw.base));
        burst.push(tokio::spawn(async move {
            client.post(url).json(&envelope).send().await.is_ok()
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    tokio::task::block_in_place(|| gw.kill());
    for sent in burst {
        let _ = sent.await;
    }
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&jwks)]);
    assert_eq!(status, 0, "{out}");
    let tail: u64 = out
        .lines()
        .find_map(|l| l.strip_suffix(" events follow the last checkpoint (unsigned)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no unsigned tail reported: {out}"));
    assert!(
        tail > 0,
        "the burst left events after the last checkpoint: {out}"
    );
    let crashed_at = events(&std::fs::read_to_string(&file).unwrap()).len() as u64;

    // After the restart the tail is signed within checkpoint_secs, by the same key.
    tokio::task::block_in_place(|| gw.restart());
    until(
        Duration::from_secs(15),
        "the tail signed after the restart",
        || async { signed_file() },
    )
    .await;
    let (status, out) = run_cli(&["audit", "verify", text(&file), "--keys", text(&jwks)]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("0 events follow the last checkpoint"), "{out}");
    let last = events(&std::fs::read_to_string(&file).unwrap());
    assert!(last.last().unwrap()["checkpoint"]["seq"].as_u64().unwrap() >= crashed_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_publish_both_configured_keys_and_checkpoint_one_chain() {
    let db = sealgate::store::testing::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let mut replicas: Vec<Gateway> = (0..2)
        .map(|i| {
            let folder = dir.path().join(format!("r{i}"));
            let signing = common::replica_signing(dir.path(), 2, i);
            let extra = format!("store: {:?}\nreplica_id: r{i}\n{signing}", db.url);
            let config = configure(&folder, &keys, &tool_base, "checkpoint_every: 4", &extra);
            Gateway::spawn(&folder, &config, keys.clone())
        })
        .collect();
    let (key, token) = replicas[0].session("exec-replicas").await;
    let kids = [
        kids_of(&key_set(&replicas[0]).await),
        kids_of(&key_set(&replicas[1]).await),
    ];
    assert_eq!(kids[0].len(), 2, "both replicas' keys: {kids:?}");
    assert_eq!(
        kids[0][0], kids[1][1],
        "each lists its own first, then the other's"
    );
    assert_eq!(kids[0][1], kids[1][0]);

    // Calls through both, then a clean stop of each in turn: its tail is signed with its own key.
    let mut receipts = Vec::new();
    for round in 0..2usize {
        for id in 0..5u64 {
            let gw = &replicas[(id as usize + round) % 2];
            let (_, status, body) = call(
                gw,
                &key,
                &token,
                tool_call(id + 10 * round as u64, "tool.off", json!({})),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            receipts.push(body);
        }
    }
    // The head is r0's own when it stops: its last batch ended with its checkpoint, or its stop adds one.
    let (_, status, body) = call(
        &replicas[0],
        &key,
        &token,
        tool_call(50, "tool.off", json!({})),
    )
    .await;
    assert_eq!(status, 200);
    receipts.push(body);
    let stopped = replicas.remove(0);
    stop_cleanly(stopped);
    let survivor = &replicas[0];
    for id in 100..103u64 {
        let (_, status, body) =
            call(survivor, &key, &token, tool_call(id, "tool.off", json!({}))).await;
        assert_eq!(status, 200);
        receipts.push(body);
    }
    let replica_of_receipts: std::collections::BTreeSet<&str> = receipts
        .iter()
        .map(|b| b["receipt"]["replica_id"].as_str().unwrap())
        .collect();
    assert_eq!(replica_of_receipts.len(), 2);
    for (index, body) in receipts.iter().enumerate() {
        let response = save(dir.path(), &format!("receipt-{index}.json"), body);
        let (status, out) = run_cli(&[
            "receipt",
            "verify",
            "--keys",
            &keys_url(survivor),
            text(&response),
        ]);
        assert_eq!(status, 0, "{out}");
    }

    let trail = events(&survivor.export().await);
    let signed = checkpoints(&trail);
    let signers: std::collections::BTreeSet<&str> = signed
        .iter()
        .map(|e| e["checkpoint"]["kid"].as_str().unwrap())
        .collect();
    assert_eq!(signers.len(), 2, "checkpoints of both replicas: {signed:?}");
    // Never the same head signed twice: no checkpoint directly follows another.
    for pair in trail.windows(2) {
        assert!(
            !(pair[0]["type"] == "AuditCheckpoint" && pair[1]["type"] == "AuditCheckpoint"),
            "{pair:?}"
        );
    }
    let exported = save(dir.path(), "export.jsonl", &lines(&trail));
    let (status, out) = run_cli(&[
        "audit",
        "verify",
        text(&exported),
        "--keys",
        &keys_url(survivor),
    ]);
    assert_eq!(status, 0, "{out}");
}

/// SIGTERM, and waits for the clean exit (the audit writer signs its tail on the way out).
fn stop_cleanly(mut gw: Gateway) {
    let pid = gw.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exit = gw.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_taken_right_after_traffic_ends_with_a_checkpoint_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    // The defaults (a checkpoint every 1000 events or 60 s): none is due after a few calls.
    let (gw, _tool) = start(work, "checkpoint_secs: 3600", "").await;
    let (key, token) = gw.session("exec-export").await;
    let (_, status, body) = call(&gw, &key, &token, tool_call(1, "tool.off", json!({}))).await;
    assert_eq!(status, 200, "{body}");

    let trail = events(&gw.export().await);
    let last = trail.last().unwrap();
    assert_eq!(last["type"], "AuditCheckpoint", "{trail:?}");
    let before = &trail[trail.len() - 2];
    assert_eq!(last["checkpoint"]["seq"], before["seq"]);
    assert_eq!(last["checkpoint"]["hash"], before["hash"]);
    let exported = save(work, "export.jsonl", &lines(&trail));
    let (status, out) = run_cli(&["audit", "verify", text(&exported), "--keys", &keys_url(&gw)]);
    assert_eq!(status, 0, "{out}");
    let signed_through = before["seq"].as_u64().unwrap();
    assert!(
        out.contains(&format!("signs seq 1..{signed_through}"))
            && out.contains("0 events follow the last checkpoint"),
        "{out}"
    );

    // Without new events a second export ends with the same checkpoint: none is added.
    assert_eq!(events(&gw.export().await), trail);

    // An export that begins at that checkpoint names no range that does not exist ("13..12").
    let seq = last["seq"].as_u64().unwrap();
    let tail = save(work, "tail.jsonl", &gw.export_from(seq).await);
    let (status, out) = run_cli(&["audit", "verify", text(&tail), "--keys", &keys_url(&gw)]);
    assert_eq!(status, 0, "{out}");
    assert!(
        out.contains(&format!(
            "the last, at seq {seq}, is the files' first event: it signs the chain before them \
             (through seq {signed_through})"
        )) && !out.contains(&format!("{seq}..{signed_through}")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_planted_in_the_store_is_neither_published_nor_trusted() {
    let db = sealgate::store::testing::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let (gw, _tool) = start(
        work,
        "checkpoint_secs: 60",
        &format!("store: {:?}\n", db.url),
    )
    .await;
    let (key, token) = gw.session("exec-planted").await;
    let (_, status, body) = call(&gw, &key, &token, tool_call(1, "tool.off", json!({}))).await;
    assert_eq!(status, 200, "{body}");

    // Someone with write access to the database adds a key of their own, and signs with it.
    let planted = sealgate::envelope::generate_signing_key().unwrap();
    let public = planted.verifying_key().to_bytes();
    let kid = sealgate::evidence::kid_of(&public);
    db.execute(&format!(
        "INSERT INTO signing_keys (kid, public_key, replica_id) VALUES ('{kid}', '\\x{}', 'r9')",
        hex::encode(public)
    ))
    .await;
    let mut forged = body.clone();
    let receipt = forged["receipt"].as_object_mut().unwrap();
    receipt.remove("sig");
    receipt.insert("replica_id".into(), json!("r9"));
    let value = {
        use base64::Engine as _;
        use ed25519_dalek::Signer as _;
        let message = sealgate::envelope::jcs_object(receipt);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(planted.sign(&message).to_bytes())
    };
    receipt.insert(
        "sig".into(),
        json!({"alg": "EdDSA", "kid": kid, "value": value}),
    );

    assert!(!kids_of(&key_set(&gw).await).contains(&kid));
    let genuine = save(work, "genuine.json", &body);
    let forged = save(work, "forged.json", &forged);
    let verify =
        |file: &Path| run_cli(&["receipt", "verify", "--keys", &keys_url(&gw), text(file)]);
    let (status, out) = verify(&genuine);
    assert_eq!(status, 0, "{out}");
    let (status, out) = verify(&forged);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains(&format!(
            "sig.kid \"{kid}\" is not a key of the given JWK Set"
        )),
        "{out}"
    );

    // The row is a hint at most: a replica that starts on this store warns that it is not configured.
    let folder = work.join("second");
    let keys = gw.keys.clone();
    let config = configure(
        &folder,
        &keys,
        "http://127.0.0.1:1",
        "checkpoint_secs: 60",
        &format!("store: {:?}\nreplica_id: r1\n", db.url),
    );
    let second = Gateway::spawn_with(Vec::new(), &folder, &config, keys, |command| {
        command.stderr(std::process::Stdio::piped());
    });
    let log = second.stderr();
    log.wait_for("warning about the planted key", |line| {
        line.contains(&kid) && line.contains("signing.replica_public_keys does not name")
    });
    assert!(!kids_of(&key_set(&second).await).contains(&kid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_url_that_redirects_or_is_plain_http_elsewhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let response = save(dir.path(), "response.json", &json!({"status": "success"}));
    let audit = save(dir.path(), "audit.jsonl", &"");
    let redirector = common::redirect::Redirector::start().await;
    let redirecting = format!("{}/v1/keys", redirector.base);
    for args in [
        vec!["receipt", "verify", "--keys", &redirecting, text(&response)],
        vec!["audit", "verify", text(&audit), "--keys", &redirecting],
    ] {
        let (status, out) = run_cli(&args);
        assert_eq!(status, 1, "{out}");
        assert!(
            out.contains(&format!(
                "answered HTTP 307 Temporary Redirect to {}/decoy (redirects are not followed)",
                redirector.base
            )),
            "{out}"
        );
    }
    assert_eq!((redirector.redirected(), redirector.followed()), (2, 0));
    for remote in [
        "http://192.0.2.1/v1/keys",
        "http://keys.example/v1/keys",
        "http://[2001:db8::1]/v1/keys",
    ] {
        let (status, out) = run_cli(&["receipt", "verify", "--keys", remote, text(&response)]);
        assert_eq!(status, 1, "{out}");
        assert!(
            out.contains("http:// is accepted only for a loopback host"),
            "{remote}: {out}"
        );
    }
}

/// A JSON-RPC tool that writes its answers by hand, so that their numbers reach the gateway as written:
/// `numbers.NAME` answers with the number that NAME stands for at `structuredContent.n`.
async fn numbers_tool(axum::Json(request): axum::Json<Value>) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let number = match request["params"]["name"].as_str() {
        Some("beyond_2_53") => "9007199254740993",
        Some("not_finite") => "1e400",
        Some("too_long") => "1.0000000000000000001",
        _ => "0.1",
    };
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"n"}}],"structuredContent":{{"safe":[9007199254740991,-9007199254740991,1.5,1.0,1e21,-0.0,5E-324],"n":{number}}}}}}}"#,
        request["id"]
    );
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_number_jcs_cannot_write_as_sent_is_refused_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let numbers = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/rpc", axum::routing::post(numbers_tool));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let upstream = format!("  numbers: {{ http: {{ url: \"{numbers}/rpc\" }} }}");
    let config = common::write_config(dir.path(), &keys, &tool_base, &upstream, "");
    let gw = Gateway::spawn(dir.path(), &config, keys);
    let (key, token) = gw.session_in("exec-numbers", "other").await;

    for (id, tool, digits) in [
        (1, "numbers.beyond_2_53", "9007199254740993"),
        (2, "numbers.not_finite", "1e400"),
        (3, "numbers.too_long", "1.0000000000000000001"),
    ] {
        let (_, status, body) = call(&gw, &key, &token, tool_call(id, tool, json!({}))).await;
        assert_eq!((status, code(&body)), (502, 5003), "{tool}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("a receipt cannot bind exactly")
                && message.contains("at $.result.structuredContent.n "),
            "{tool}: {message}"
        );
        assert!(
            !message.contains(digits),
            "the number is not quoted: {message}"
        );
        assert!(
            body.get("payload").is_none(),
            "nothing of the answer passes: {body}"
        );
    }

    // Numbers that JCS writes as the tool sent them pass, and the receipt binds them.
    let (_, status, body) = call(&gw, &key, &token, tool_call(4, "numbers.fine", json!({}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["payload"]["result"]["structuredContent"]["n"],
        json!(0.1)
    );
    let response = save(dir.path(), "response.json", &body);
    let (status, out) = run_cli(&[
        "receipt",
        "verify",
        "--keys",
        &keys_url(&gw),
        text(&response),
    ]);
    assert_eq!(status, 0, "{out}");
}

/// The answer of the hand-written MCP servers below to `tools/call` of `NAME` (or `NAME_sse`), with
/// the number NAME stands for at `structuredContent.n`, written as text.
fn numbers_mcp_number(tool: &str) -> &'static str {
    match tool.trim_end_matches("_sse") {
        "beyond_2_53" => "9007199254740993",
        "too_long" => "1.0000000000000000001",
        _ => "0.5",
    }
}

const NUMBERS_MCP_TOOLS: [&str; 3] = ["beyond_2_53", "too_long", "fine"];

/// An MCP server over stdio, written by hand so that its answers carry numbers as written (see
/// [`numbers_mcp_number`]).
const NUMBERS_MCP_SERVER: &str = r#"
import json, sys
NUMBERS = {"beyond_2_53": "9007199254740993", "too_long": "1.0000000000000000001", "fine": "0.5"}
TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in NUMBERS]
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message["method"]
    if method == "tools/call":
        n = NUMBERS[message["params"]["name"]]
        answer = '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"n"}],"structuredContent":{"n":%s}}}' % (json.dumps(message["id"]), n)
    else:
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "numbers", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        else:
            result = {}
        answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
    sys.stdout.write(answer + "\n")
    sys.stdout.flush()
"#;

/// The same MCP server over Streamable HTTP (stateless: no session, no event stream of its own). A
/// tool whose name ends in `_sse` answers in an SSE event instead of a JSON body.
async fn numbers_mcp_http(axum::Json(message): axum::Json<Value>) -> axum::response::Response {
    use axum::http::{header::CONTENT_TYPE, StatusCode};
    use axum::response::IntoResponse as _;
    let Some(id) = message.get("id") else {
        return StatusCode::ACCEPTED.into_response();
    };
    let answer = match message["method"].as_str() {
        Some("tools/call") => {
            let tool = message["params"]["name"].as_str().unwrap_or_default();
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"n"}}],"structuredContent":{{"n":{}}}}}}}"#,
                numbers_mcp_number(tool)
            );
            if tool.ends_with("_sse") {
                let event = format!("event: message\ndata: {answer}\n\n");
                return ([(CONTENT_TYPE, "text/event-stream")], event).into_response();
            }
            answer
        }
        Some("initialize") => json!({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "numbers", "version": "1"}}})
        .to_string(),
        Some("tools/list") => {
            let tools: Vec<Value> = NUMBERS_MCP_TOOLS
                .iter()
                .flat_map(|name| [name.to_string(), format!("{name}_sse")])
                .map(|name| json!({"name": name, "inputSchema": {"type": "object"}}))
                .collect();
            json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}}).to_string()
        }
        _ => json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string(),
    };
    ([(CONTENT_TYPE, "application/json")], answer).into_response()
}

/// Calls the `numbers` MCP upstream of `gw`: the answers with 2^53+1 and with a fraction longer than a
/// double (each `tool` and `tool_sse` in `suffixes`) are refused with 5003 naming where, without the
/// number; 0.5 passes, and its receipt verifies.
async fn mcp_numbers_are_held_to_rule_5(gw: &Gateway, dir: &Path, suffixes: &[&str]) {
    let (key, token) = gw.session_in("exec-mcp-numbers", "other").await;
    let mut id = 0;
    for suffix in suffixes {
        for (tool, problem) in [
            ("beyond_2_53", "integer is outside ±(2^53−1)"),
            ("too_long", "shortest round-trip form"),
        ] {
            id += 1;
            let tool = format!("numbers.{tool}{suffix}");
            let (_, status, body) = call(gw, &key, &token, tool_call(id, &tool, json!({}))).await;
            assert_eq!((status, code(&body)), (502, 5003), "{tool}: {body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(problem)
                    && message.contains("at $.result.structuredContent.n ")
                    && !message.contains(numbers_mcp_number(tool.trim_start_matches("numbers.")))
                    && body.get("payload").is_none(),
                "{tool}: {body}"
            );
        }
        id += 1;
        let tool = format!("numbers.fine{suffix}");
        let (_, status, body) = call(gw, &key, &token, tool_call(id, &tool, json!({}))).await;
        assert_eq!(status, 200, "{tool}: {body}");
        assert_eq!(
            body["payload"]["result"]["structuredContent"]["n"],
            json!(0.5)
        );
        let response = save(dir, "response.json", &body);
        let (status, out) = run_cli(&[
            "receipt",
            "verify",
            "--keys",
            &keys_url(gw),
            text(&response),
        ]);
        assert_eq!(status, 0, "{tool}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_answer_over_stdio_with_a_number_jcs_cannot_write_as_sent_is_refused_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let script = save(dir.path(), "numbers_mcp.py", &NUMBERS_MCP_SERVER);
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let upstream = format!(
        "  numbers: {{ mcp: {{ command: python3, args: [{:?}] }}, timeout_ms: 20000 }}",
        text(&script)
    );
    let config = common::write_config(dir.path(), &keys, &tool_base, &upstream, "");
    let gw = Gateway::spawn(dir.path(), &config, keys);
    mcp_numbers_are_held_to_rule_5(&gw, dir.path(), &[""]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_answer_over_http_with_a_number_jcs_cannot_write_as_sent_is_refused_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let numbers = format!("http://{}/mcp", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/mcp",
        axum::routing::post(numbers_mcp_http)
            .get(|| async { axum::http::StatusCode::METHOD_NOT_ALLOWED }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let upstream = format!("  numbers: {{ mcp: {{ url: \"{numbers}\" }}, timeout_ms: 20000 }}");
    let config = common::write_config(dir.path(), &keys, &tool_base, &upstream, "");
    let gw = Gateway::spawn(dir.path(), &config, keys);
    // Answers in a JSON body, then in an SSE event.
    mcp_numbers_are_held_to_rule_5(&gw, dir.path(), &["", "_sse"]).await;
}

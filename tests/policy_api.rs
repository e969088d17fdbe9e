//! Black-box tests of security contexts (SPEC section 6): hot reload through the real binary, the operator
//! API with its auth, rate limits and budgets over HTTP, and the offline CLI.

mod common;

use std::time::{Duration, Instant};

use common::{code, run_cli, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// Polls until `check` holds (the SPEC allows 2 s for a reload; this waits up to 5 s).
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn reload_tightens_refuses_a_broken_file_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-reload").await;
    let id = std::sync::atomic::AtomicU64::new(0);
    let write_code = || async {
        let n = id.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (_, body) = gw
            .call(&key, &token, tool_call(n, "tool.off", json!({"n": n})))
            .await;
        body["error"]["code"].as_u64().unwrap_or(0)
    };
    assert_eq!(write_code().await, 0);
    let policy = dir.path().join("policies/test.yaml");
    let original = std::fs::read_to_string(&policy).unwrap();

    // Tighten: deny tool.off.
    std::fs::write(
        &policy,
        original.replace(
            r#"deny_list: ["tool.forbidden""#,
            r#"deny_list: ["tool.off", "tool.forbidden""#,
        ),
    )
    .unwrap();
    assert!(
        eventually(|| async { write_code().await == 2001 }).await,
        "a tightened policy applies within 2 s"
    );

    // Break: an invalid file is refused and the last good (tight) version stays in force.
    std::fs::write(
        &policy,
        "name: test\ncapabilities:\n  - tool_patern: \"*\"\n",
    )
    .unwrap();
    let refused = eventually(|| async {
        let (_, page) = gw
            .admin(Method::GET, "/v1/audit?type=SecurityContextRejected", None)
            .await;
        !page["items"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(refused, "the refused reload leaves an audit event");
    assert_eq!(write_code().await, 2001);

    // Restore.
    std::fs::write(&policy, &original).unwrap();
    assert!(eventually(|| async { write_code().await == 0 }).await);
    let (_, changed) = gw
        .admin(Method::GET, "/v1/audit?type=SecurityContextChanged", None)
        .await;
    assert!(changed["items"].as_array().unwrap().len() >= 2);
}

#[tokio::test]
async fn context_api_with_auth_read_only_files_and_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let reader = gw.keys.operator_token("seal.context.read");
    let writer = gw
        .keys
        .operator_token("seal.context.write seal.context.read");

    assert_eq!(
        gw.operator(Method::GET, "/v1/security-contexts", None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        gw.operator(
            Method::GET,
            "/v1/security-contexts",
            Some(&gw.keys.operator_token("seal.audit.read")),
            None
        )
        .await
        .0,
        403
    );
    let (status, list) = gw
        .operator(Method::GET, "/v1/security-contexts", Some(&reader), None)
        .await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["other", "test"]);
    let (status, test) = gw
        .operator(
            Method::GET,
            "/v1/security-contexts/test",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(test["version"].as_str().unwrap().len(), 64);
    assert_eq!(test["capabilities"][0]["tool_pattern"], "tool.off");
    assert_eq!(
        gw.operator(
            Method::GET,
            "/v1/security-contexts/none",
            Some(&reader),
            None
        )
        .await
        .0,
        404
    );

    // File-backed contexts are read-only over the API.
    let spec = json!({"name": "test", "capabilities": [{"tool_pattern": "*"}]});
    assert_eq!(
        gw.operator(
            Method::PUT,
            "/v1/security-contexts/test",
            Some(&writer),
            Some(spec)
        )
        .await
        .0,
        409
    );
    assert_eq!(
        gw.operator(
            Method::DELETE,
            "/v1/security-contexts/test",
            Some(&writer),
            None
        )
        .await
        .0,
        409
    );

    // Store-kept contexts: write needs its scope, bad bodies are 422 naming the field.
    let spec = json!({"capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/srv"]}], "deny_list": ["fs.delete"]});
    assert_eq!(
        gw.operator(
            Method::PUT,
            "/v1/security-contexts/api",
            Some(&reader),
            Some(spec.clone())
        )
        .await
        .0,
        403
    );
    let (status, created) = gw
        .operator(
            Method::PUT,
            "/v1/security-contexts/api",
            Some(&writer),
            Some(spec),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["source"]["kind"], "store");
    // What GET (or PUT) answers can be sent back as it is: `version` and `source` are the gateway's own.
    let (status, again) = gw
        .operator(
            Method::PUT,
            "/v1/security-contexts/api",
            Some(&writer),
            Some(created.clone()),
        )
        .await;
    assert_eq!((status, &again), (200, &created));
    let (status, bad) = gw
        .operator(
            Method::PUT,
            "/v1/security-contexts/api2",
            Some(&writer),
            Some(json!({"capabilities": [{"tool_pattern": "fs.{a,b}"}]})),
        )
        .await;
    assert_eq!((status, code(&bad)), (422, 6005));
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool_pattern: invalid pattern \"fs.{a,b}\""),
        "{bad}"
    );
    let (status, bad) = gw
        .operator(
            Method::PUT,
            "/v1/security-contexts/api2",
            Some(&writer),
            Some(json!({"capabilities": [], "allow_everything": true})),
        )
        .await;
    assert_eq!(status, 422, "{bad}");

    // Evaluate explains a decision without calling anything.
    let path = "/v1/security-contexts/api/evaluate";
    let evaluate = |body: Value| gw.operator(Method::POST, path, Some(&reader), Some(body));
    let (status, allow) =
        evaluate(json!({"tool": "fs.read", "arguments": {"path": "/srv/a"}})).await;
    assert_eq!(status, 200);
    assert_eq!(allow["decision"], "allow");
    let (_, deny) = evaluate(json!({"tool": "fs.read", "arguments": {"path": "/etc/a"}})).await;
    assert_eq!(
        (deny["decision"].as_str(), deny["code"].as_u64()),
        (Some("deny"), Some(2002))
    );
    assert_eq!(
        deny["rule"],
        json!({"kind": "capability", "index": 0, "pattern": "fs.*"})
    );
    // SPEC 6.3 r3, as the gateway decides: `Path` is checked like `path`, and twins are refused.
    let (_, capitals) = evaluate(json!({"tool": "fs.read", "arguments": {"Path": "/etc/a"}})).await;
    assert_eq!(capitals["code"], 2002, "{capitals}");
    let (status, twins) =
        evaluate(json!({"tool": "fs.read", "arguments": {"path": "/srv/a", "PATH": "/etc/a"}}))
            .await;
    assert_eq!((status, code(&twins)), (422, 6005), "{twins}");
    assert!(
        twins["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("arguments: ") && m.contains("ASCII case folding")),
        "{twins}"
    );
    let (_, denied) = evaluate(json!({"tool": "fs.delete"})).await;
    assert_eq!(
        (denied["code"].as_u64(), denied["rule"]["kind"].as_str()),
        (Some(2001), Some("deny_list"))
    );

    // A draft is evaluated instead of the saved context (the dry run of an edit), and nothing is saved.
    let (_, saved) = gw
        .operator(
            Method::GET,
            "/v1/security-contexts/api",
            Some(&reader),
            None,
        )
        .await;
    let draft = json!({"deny_list": ["fs.read"], "capabilities": [{"tool_pattern": "fs.*"}]});
    let (status, drafted) =
        evaluate(json!({"tool": "fs.read", "arguments": {"path": "/srv/a"}, "draft": draft})).await;
    assert_eq!(status, 200, "{drafted}");
    assert_eq!(
        (drafted["code"].as_u64(), drafted["rule"]["kind"].as_str()),
        (Some(2001), Some("deny_list"))
    );
    assert_ne!(drafted["context_version"], saved["version"]);
    let (_, still) = gw
        .operator(
            Method::GET,
            "/v1/security-contexts/api",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(
        still["version"], saved["version"],
        "the draft was not saved"
    );
    for (bad_draft, named) in [
        (
            json!({"capabilities": [{"tool_pattern": "fs.*", "claim": "sometimes"}]}),
            "draft: ",
        ),
        (json!({"name": "other", "capabilities": []}), "draft: name"),
    ] {
        let (status, refused) = evaluate(json!({"tool": "fs.read", "draft": bad_draft})).await;
        assert_eq!((status, code(&refused)), (422, 6005), "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(named)),
            "{refused}"
        );
    }

    // The stored context survives a restart; deleting it works and is then 404.
    let mut gw = gw;
    gw.restart();
    assert_eq!(
        gw.operator(
            Method::GET,
            "/v1/security-contexts/api",
            Some(&reader),
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(
        gw.operator(
            Method::DELETE,
            "/v1/security-contexts/api",
            Some(&writer),
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(
        gw.operator(
            Method::GET,
            "/v1/security-contexts/api",
            Some(&reader),
            None
        )
        .await
        .0,
        404
    );
}

#[tokio::test]
async fn rate_limit_and_budget_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-rate").await;
    for n in 0..2 {
        assert_eq!(
            gw.call(&key, &token, tool_call(n, "limited.op", json!({})))
                .await
                .0,
            200
        );
    }
    let response = gw
        .client
        .post(format!("{}/v1/invoke", gw.base))
        .json(&sealgate::envelope::sign_envelope(
            &key,
            tool_call(9, "limited.op", json!({})),
            &token,
            sealgate::clock::now_secs(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=60).contains(&retry_after),
        "the window frees its first slot within 60 s"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), 2005);

    let (key, token) = gw
        .session_with("exec-budget", json!({"budget": {"max_calls": 2}}))
        .await;
    assert_eq!(
        gw.call(&key, &token, tool_call(1, "tool.off", json!({})))
            .await
            .0,
        200
    );
    assert_eq!(
        gw.call(
            &key,
            &token,
            tool_call(2, "tool.write", json!({"path": "/workspace/b"}))
        )
        .await
        .0,
        200
    );
    let (status, body) = gw
        .call(&key, &token, tool_call(3, "tool.off", json!({})))
        .await;
    assert_eq!((status, code(&body)), (403, 2008));
    let (_, session) = gw
        .admin(Method::GET, "/v1/seal/sessions/exec-budget", None)
        .await;
    assert_eq!(session["status"], "exhausted");
    assert_eq!(session["calls"]["allowed"], 2);
    assert_eq!(tool.count(), 4);
}

#[test]
fn policy_cli_checks_and_explains() {
    let repo_policies = concat!(env!("CARGO_MANIFEST_DIR"), "/policies");
    let (status, out) = run_cli(&["policy", "check", repo_policies]);
    assert_eq!(status, 0, "the shipped examples are valid: {out}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "name: bad\ncapabilities:\n  - tool_pattern: \"fs.*\"\n    path_allowlist: []\n",
    )
    .unwrap();
    let (status, out) = run_cli(&["policy", "check", dir.path().to_str().unwrap()]);
    assert_eq!(status, 1);
    assert!(
        out.contains("bad.yaml") && out.contains("path_allowlist"),
        "{out}"
    );

    // `policy explain` against the shipped `agent-runtime` context: (exit status, output).
    let explain = |tool: &str, args: &str| {
        run_cli(&[
            "policy",
            "explain",
            "--context",
            "agent-runtime",
            "--tool",
            tool,
            "--args",
            args,
            "--policies",
            repo_policies,
        ])
    };
    // SPEC 6.4 r4: a refusal exits 1, with its code and name.
    let (status, out) = explain("fs.read_file", r#"{"path": "/workspace/../etc/passwd"}"#);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("2002") && out.contains("capability") && out.contains("fs.*"),
        "{out}"
    );
    let (status, out) = explain("fs.delete", "{}");
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("2001 POLICY_VIOLATION_TOOL_DENIED") && out.contains("deny_list"),
        "{out}"
    );
    let (status, out) = explain("cmd.run", r#"{"command": "git status"}"#);
    assert_eq!(status, 0, "{out}");
    assert!(out.starts_with("allow  rule:"), "{out}");
    // Arguments are read as the gateway reads a payload: a duplicate key is refused, not resolved.
    let (status, out) = explain(
        "fs.read_file",
        r#"{"path": "/etc/passwd", "path": "/workspace/a"}"#,
    );
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("duplicate key"), "{out}");
    // SPEC 6.3 r3, as the gateway decides: `Path` is checked like `path`, and twins are refused.
    let (status, out) = explain("fs.read_file", r#"{"Path": "/etc/passwd"}"#);
    assert_eq!(status, 1, "{out}");
    assert!(out.starts_with("deny  code: 2002"), "{out}");
    let (status, out) = explain(
        "fs.read_file",
        r#"{"path": "/workspace/a", "PATH": "/etc/passwd"}"#,
    );
    assert_eq!(status, 2, "{out}");
    assert!(
        out.starts_with("--args: the names") && out.contains("ASCII case folding"),
        "{out}"
    );

    // A policy file that is a link to nothing is a broken file, not an absent one.
    let linked = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/nonexistent/gone.yaml", linked.path().join("gone.yaml")).unwrap();
    let (status, out) = run_cli(&["policy", "check", linked.path().to_str().unwrap()]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("gone.yaml"), "{out}");
}

/// SPEC 6.4 r4: `policy explain` exits 0 allowed, 1 refused, 2 bad usage or invalid policies, 3 allowed
/// after a person's approval (and says so in its first line).
#[test]
fn policy_explain_exit_codes_tell_the_answers_apart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pay.yaml"),
        "name: pay\ndeny_list: [\"*.delete\"]\ncapabilities:\n  - tool_pattern: \"fs.read*\"\n  - tool_pattern: \"pay.*\"\n    approval: { required: true }\n",
    )
    .unwrap();
    let policies = dir.path().to_str().unwrap().to_owned();
    let explain = |context: &str, tool: &str| {
        run_cli(&[
            "policy",
            "explain",
            "--context",
            context,
            "--tool",
            tool,
            "--policies",
            &policies,
        ])
    };
    let (status, out) = explain("pay", "fs.read_file");
    assert_eq!(status, 0, "{out}");
    assert!(
        out.starts_with("allow  rule: capability #0 fs.read*"),
        "{out}"
    );
    let (status, out) = explain("pay", "pay.send");
    assert_eq!(status, 3, "{out}");
    assert!(
        out.starts_with("allow, approval required  rule: capability #1 pay.*"),
        "{out}"
    );
    let (status, out) = explain("pay", "db.delete");
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with("deny  code: 2001 POLICY_VIOLATION_TOOL_DENIED"),
        "{out}"
    );
    let (status, out) = explain("pay", "fs.write");
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with("deny  code: 2006 POLICY_VIOLATION_NO_MATCHING_CAPABILITY"),
        "{out}"
    );
    // Bad usage: an unknown context, a bad tool name, a missing flag, invalid policies.
    let (status, out) = explain("nope", "fs.read");
    assert_eq!(status, 2, "{out}");
    let (status, out) = explain("pay", "fs..read");
    assert_eq!(status, 2, "{out}");
    let (status, out) = run_cli(&["policy", "explain", "--tool", "fs.read"]);
    assert_eq!(status, 2, "{out}");
    std::fs::write(
        dir.path().join("bad.yaml"),
        "name: bad\ncapabilities:\n  - tool_pattern: \"fs.rea?\"\n",
    )
    .unwrap();
    let (status, out) = explain("pay", "fs.read_file");
    assert_eq!(status, 2, "{out}");
    assert!(
        out.contains("bad.yaml:3") && out.contains("\"fs.rea?\""),
        "{out}"
    );
}

/// A reader that stops early (`sealgate policy explain … | head -1`) gets no panic: the answer is
/// written into a pipe whose reading end is already closed.
#[test]
fn policy_explain_into_a_closed_pipe_exits_cleanly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args([
            "policy",
            "explain",
            "--context",
            "agent-runtime",
            "--tool",
            "fs.read_file",
        ])
        .args(["--args", r#"{"path": "/etc/passwd"}"#, "--policies"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/policies"))
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The call is refused, so the exit code is explain's 1 (SPEC 6.4 r4), not a panic's 101.
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_counts_of_zero_are_refused_before_anything_runs() {
    let (status, out) = run_cli(&[
        "bench",
        "rate",
        "--dir",
        "/nonexistent",
        "--gateway",
        "http://127.0.0.1:1",
        "--context",
        "bench-off",
        "--sessions",
        "0",
        "--rate",
        "1",
        "--secs",
        "1",
    ]);
    assert_eq!(status, 2, "{out}");
    assert!(
        out.contains("--sessions") && out.contains("at least 1"),
        "{out}"
    );
}

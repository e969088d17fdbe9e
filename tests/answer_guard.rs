//! The answer guard (SPEC 18) through the real binary: the gateway's own upstream credential, the
//! well-known secret formats, `redact` / `refuse` / `off`, hidden characters, the stored SKIP answer and
//! the receipt over what the agent received, what the guard cannot see, and linear time.

mod common;

use std::path::Path;

use common::{code, run_cli, tool_call, Gateway, Keys};
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Capabilities with their own `answer_guard`; `tool.*` takes the gateway's.
const GUARDED_POLICY: &str = r#"
name: guarded
capabilities:
  - tool_pattern: "tool.refuse"
    claim: auto
    answer_guard: { secrets: refuse, invisible: refuse }
  - tool_pattern: "tool.off"
    claim: off
    answer_guard: { secrets: off, invisible: off }
  - tool_pattern: "tool.near"
    claim: off
    max_response_size: 1048576
    answer_guard: { secret_patterns: { runs: "(a+)+$", ticket: "TKT-[0-9]{6}" } }
  - tool_pattern: "tool.*"
    claim: auto
"#;

/// The gateway-wide guard: the defaults and one operator pattern.
const GATEWAY_GUARD: &str =
    "answer_guard: { secret_patterns: { internal_ref: \"INT-[0-9]{4}\" } }\n";

const GITHUB: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLWJ5dGVz";

async fn start(dir: &Path, extra: &str) -> Gateway {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/guarded.yaml"), GUARDED_POLICY).unwrap();
    let (gw, _tool) = Gateway::start(dir, &format!("{GATEWAY_GUARD}{extra}")).await;
    gw
}

/// Asks the test tool to answer with `result`.
async fn reply(
    gw: &Gateway,
    (key, token): &(SigningKey, String),
    id: u64,
    tool: &str,
    result: Value,
) -> (u16, Value) {
    gw.call(key, token, tool_call(id, tool, json!({ "reply": result })))
        .await
}

fn texts(items: &[&str]) -> Value {
    let content: Vec<Value> = items
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    json!({ "content": content })
}

fn text(body: &Value, index: usize) -> &str {
    body["payload"]["result"]["content"][index]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text {index}: {body}"))
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn sha256_jcs(value: &Value) -> String {
    hex::encode(Sha256::digest(serde_jcs::to_vec(value).unwrap()))
}

#[tokio::test]
async fn the_gateways_own_credential_is_redacted_and_recorded_without_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-cred", "guarded").await;
    let (status, body) = reply(
        &gw,
        &session,
        1,
        "tool.echo",
        texts(&["I was called with Bearer tool-secret, token tool-secret."]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        text(&body, 0),
        "I was called with [REDACTED], token [REDACTED]."
    );
    let events = gw.events("exec-cred").await;
    let guarded = of_type(&events, "AnswerGuarded");
    assert_eq!(guarded.len(), 1, "{events:#?}");
    assert_eq!(guarded[0]["detail"], "credential=2 redacted");
    assert!(guarded[0].get("code").is_none());
    assert_eq!(of_type(&events, "ToolCallCompleted").len(), 1);
    let all = serde_json::to_string(&events).unwrap();
    assert!(!all.contains("tool-secret"), "no event holds the value");
    let metrics = gw.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("sealgate_answer_guard_total{")
                && line.contains("kind=\"credential\"")
                && line.contains("action=\"redacted\"")
                && line.ends_with(" 2")),
        "{metrics}"
    );
}

#[tokio::test]
async fn well_known_formats_and_operator_patterns_are_redacted_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-formats", "guarded").await;
    let pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";
    let cases = [
        (
            format!("key:\n{pem}\nend"),
            "key:\n[REDACTED:pem_private_key]\nend",
        ),
        (
            "id AKIAIOSFODNN7EXAMPLE.".to_owned(),
            "id [REDACTED:aws_access_key_id].",
        ),
        (format!("gh {GITHUB}"), "gh [REDACTED:github_token]"),
        (
            "gl glpat-abcdefghij0123456789".to_owned(),
            "gl [REDACTED:gitlab_token]",
        ),
        (
            "slack xoxb-1234567890-abcdefghijkl".to_owned(),
            "slack [REDACTED:slack_token]",
        ),
        (
            "g AIzaSyA1234567890abcdefghijklmnopqrstuv".to_owned(),
            "g [REDACTED:google_api_key]",
        ),
        (
            format!("Authorization: Bearer {JWT}"),
            "Authorization: Bearer [REDACTED:jwt]",
        ),
        ("ref INT-2024".to_owned(), "ref [REDACTED:internal_ref]"),
        // Shaped like a JWT, but its first part is no JSON header with `alg`: left alone.
        (
            "eyJmb28iOiJiYXIifQ.eyJzdWIiOiJ4In0.c2ln".to_owned(),
            "eyJmb28iOiJiYXIifQ.eyJzdWIiOiJ4In0.c2ln",
        ),
    ];
    let given: Vec<&str> = cases.iter().map(|(given, _)| given.as_str()).collect();
    let mut result = texts(&given);
    result["structuredContent"] = json!({GITHUB: {"nested": [JWT, 7, true]}});
    let (status, body) = reply(&gw, &session, 1, "tool.formats", result).await;
    assert_eq!(status, 200, "{body}");
    for (index, (_, expected)) in cases.iter().enumerate() {
        assert_eq!(text(&body, index), *expected);
    }
    // Values are rewritten, keys and the structure never.
    assert_eq!(
        body["payload"]["result"]["structuredContent"],
        json!({GITHUB: {"nested": ["[REDACTED:jwt]", 7, true]}})
    );
    let events = gw.events("exec-formats").await;
    assert_eq!(
        of_type(&events, "AnswerGuarded")[0]["detail"],
        "aws_access_key_id=1 redacted, github_token=1 redacted, gitlab_token=1 redacted, \
         google_api_key=1 redacted, internal_ref=1 redacted, jwt=2 redacted, pem_private_key=1 redacted, \
         slack_token=1 redacted"
    );
}

#[tokio::test]
async fn refuse_withholds_the_answer_with_2011_and_its_skip_refuses_again() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = {
        std::fs::create_dir_all(dir.path().join("policies")).unwrap();
        std::fs::write(dir.path().join("policies/guarded.yaml"), GUARDED_POLICY).unwrap();
        Gateway::start(dir.path(), GATEWAY_GUARD).await
    };
    let session = gw.session_in("exec-refuse", "guarded").await;
    let secret = texts(&[&format!("here: {JWT}")]);
    let (status, body) = reply(&gw, &session, 1, "tool.refuse", secret.clone()).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(code(&body), 2011, "{body}");
    assert_eq!(body["error"]["details"]["kinds"], json!(["jwt"]), "{body}");
    assert!(!body.to_string().contains(JWT), "{body}");
    assert_eq!(tool.count(), 1);
    // The call ran: its claim is settled, and the retry is answered from it, refused again.
    let (status, again) = reply(&gw, &session, 2, "tool.refuse", secret).await;
    assert_eq!(status, 502, "{again}");
    assert_eq!(code(&again), 2011, "{again}");
    assert_eq!(again["error"]["receipt"]["claim"], "SKIP", "{again}");
    assert_eq!(tool.count(), 1, "a SKIP does not run the tool");
    // Hidden characters under `invisible: refuse`.
    let (status, body) = reply(&gw, &session, 3, "tool.refuse", texts(&["a\u{200d}b"])).await;
    assert_eq!((status, code(&body)), (502, 2011), "{body}");
    assert_eq!(body["error"]["details"]["kinds"], json!(["invisible"]));

    let events = gw.events("exec-refuse").await;
    let guarded = of_type(&events, "AnswerGuarded");
    assert_eq!(
        guarded.len(),
        2,
        "one per withheld answer, none for the SKIP"
    );
    assert_eq!(guarded[0]["code"], 2011);
    assert_eq!(guarded[0]["detail"], "jwt=1 refused");
    assert_eq!(guarded[1]["detail"], "invisible=1 refused");
    let failed = of_type(&events, "ToolCallFailed");
    assert_eq!(failed.len(), 3, "{events:#?}");
    assert!(failed.iter().all(|e| e["code"] == 2011));
    assert!(of_type(&events, "ToolCallCompleted").is_empty());
}

#[tokio::test]
async fn off_leaves_secrets_and_hidden_characters_but_never_the_gateways_credential() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-off", "guarded").await;
    let given = format!("{GITHUB} a\u{200d}b Bearer tool-secret");
    let (status, body) = reply(&gw, &session, 1, "tool.off", texts(&[&given])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text(&body, 0), format!("{GITHUB} a\u{200d}b [REDACTED]"));
}

#[tokio::test]
async fn a_skip_returns_the_guarded_answer_and_the_receipt_binds_what_the_agent_got() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-skip", "guarded").await;
    let result = texts(&[&format!("{GITHUB} and tool-secret\u{2060}")]);
    let (status, first) = reply(&gw, &session, 1, "tool.stored", result.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["receipt"]["claim"], "PROCEED");
    assert_eq!(text(&first, 0), "[REDACTED:github_token] and [REDACTED]");
    let (status, second) = reply(&gw, &session, 2, "tool.stored", result).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["receipt"]["claim"], "SKIP");
    assert_eq!(second["payload"]["result"], first["payload"]["result"]);
    for body in [&first, &second] {
        assert_eq!(
            body["receipt"]["answer_sha256"],
            sha256_jcs(&body["payload"]),
            "{body}"
        );
    }
    // The stored answer (what an operator sees of the claim) is the guarded one too.
    let request_id = first["receipt"]["request_id"].as_str().unwrap();
    let (status, claim) = gw
        .admin(
            reqwest::Method::GET,
            &format!("/v1/claims/{request_id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{claim}");
    assert!(!claim.to_string().contains(GITHUB), "{claim}");
    assert!(!claim.to_string().contains("tool-secret"), "{claim}");
}

#[tokio::test]
async fn unicode_tricks_are_stripped_and_nfc_and_nfd_pass_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-unicode", "guarded").await;
    let given = [
        // Tag characters spelling "IGNORE" after a visible word.
        "hello\u{e0001}\u{e0049}\u{e0047}\u{e004e}\u{e004f}\u{e0052}\u{e0045}\u{e007f}",
        "zero\u{200d}width\u{200b}joiner\u{feff}",
        "bidi \u{202e}txet desrever\u{202c} and \u{2067}isolate\u{2069}",
        "caf\u{e9}",
        "cafe\u{301}",
        "\u{1f468}\u{200d}\u{1f469}",
    ];
    let (status, body) = reply(&gw, &session, 1, "tool.unicode", texts(&given)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text(&body, 0), "hello");
    assert_eq!(text(&body, 1), "zerowidthjoiner");
    assert_eq!(text(&body, 2), "bidi txet desrever and isolate");
    // Composed and decomposed forms are not Cf: the guard does not normalise.
    assert_eq!(text(&body, 3), "caf\u{e9}");
    assert_eq!(text(&body, 4), "cafe\u{301}");
    // An emoji ZWJ sequence loses its joiner: shown as its parts.
    assert_eq!(text(&body, 5), "\u{1f468}\u{1f469}");
    let events = gw.events("exec-unicode").await;
    assert_eq!(
        of_type(&events, "AnswerGuarded")[0]["detail"],
        "invisible=16 stripped"
    );
}

#[tokio::test]
async fn a_secret_split_across_two_content_items_is_not_caught() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "").await;
    let session = gw.session_in("exec-split", "guarded").await;
    let (head, tail) = GITHUB.split_at(20);
    let (status, body) = reply(&gw, &session, 1, "tool.split", texts(&[head, tail])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(format!("{}{}", text(&body, 0), text(&body, 1)), GITHUB);
    let events = gw.events("exec-split").await;
    assert!(of_type(&events, "AnswerGuarded").is_empty());
}

/// A stdio server's credentials are the `env` values its `secret_env` names: the reference server's
/// `get-env` tool answers with its whole environment, and only those values are redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_servers_secret_env_is_redacted_and_its_other_settings_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let script = common::mcp::server_script("server-everything");
    let upstreams = format!(
        "  every: {{ mcp: {{ command: node, args: [{script:?}, stdio], env: {{ STDIO_TOKEN: \"stdio-secret-value\", STDIO_MODE: \"plain-setting\" }}, secret_env: [STDIO_TOKEN] }}, timeout_ms: 20000 }}\n"
    );
    std::fs::create_dir_all(dir.path().join("policies")).unwrap();
    std::fs::write(
        dir.path().join("policies/every.yaml"),
        "name: every\ncapabilities:\n  - tool_pattern: \"every.*\"\n    claim: off\n",
    )
    .unwrap();
    let (gw, _tool) = Gateway::start_with(dir.path(), &upstreams, "").await;
    let (key, token) = gw.session_in("exec-stdio", "every").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "every.get-env", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let env: Value = serde_json::from_str(text(&body, 0)).unwrap();
    assert_eq!(env["STDIO_TOKEN"], "[REDACTED]", "{env}");
    assert_eq!(env["STDIO_MODE"], "plain-setting", "{env}");
}

/// Linear time: an answer at `max_response_size` made of near-matches of every format, and text that
/// an operator pattern written to backtrack would take exponential time on, finishes (no timing asserted).
#[tokio::test]
async fn an_answer_at_max_response_size_full_of_near_matches_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), "limits: { max_body_bytes: 4194304 }\n").await;
    let session = gw.session_in("exec-near", "guarded").await;
    let chunk =
        "ghp_short eyJhbGciOi.x AKIA1234 -----BEGIN PUBLIC KEY----- xoxb-1 AIzaSy glpat-x TKT-12 ";
    let near = chunk.repeat(600 * 1024 / chunk.len());
    let backtrack = format!("{}!", "a".repeat(400 * 1024));
    let result = texts(&[&near, &backtrack]);
    let size = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "result": &result}))
        .unwrap()
        .len();
    assert!(size > 1_000_000 && size < 1_048_576, "{size}");
    let (status, body) = reply(&gw, &session, 1, "tool.near", result).await;
    assert_eq!(status, 200, "{}", code(&body));
    assert_eq!(text(&body, 0), near);
    assert_eq!(text(&body, 1), backtrack);
    // The same pattern does match where it should.
    let (status, body) = reply(
        &gw,
        &session,
        2,
        "tool.near",
        texts(&["x aaaa", "TKT-123456"]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text(&body, 0), "x [REDACTED:runs]");
    assert_eq!(text(&body, 1), "[REDACTED:ticket]");
}

#[test]
fn patterns_the_linear_engine_rejects_stop_start_up_and_policy_load_with_their_key() {
    for (name, pattern, says) in [
        ("lookahead", "(?=x)", "look-around"),
        ("backref", r"(a)\\1", "backreferences"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let keys = Keys::new();
        let extra = format!("answer_guard: {{ secret_patterns: {{ {name}: \"{pattern}\" }} }}\n");
        let config = common::write_config(dir.path(), &keys, "http://127.0.0.1:1", "", &extra);
        common::assert_refused_at_start_up(
            &config,
            &format!("answer_guard.secret_patterns.{name}"),
            "tool-secret",
        );
        let output = common::run_refused(
            &["serve", "--config", config.to_str().unwrap()],
            &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")],
        );
        assert!(output.contains(says), "{output}");

        let policies = dir.path().join("check");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(
            policies.join("bad.yaml"),
            format!(
                "name: bad\ncapabilities:\n  - tool_pattern: \"tool.*\"\n    answer_guard: {{ secret_patterns: {{ {name}: \"{pattern}\" }} }}\n"
            ),
        )
        .unwrap();
        let (status, out) = run_cli(&["policy", "check", policies.to_str().unwrap()]);
        assert_ne!(status, 0, "{out}");
        assert!(
            out.contains(&format!("answer_guard.secret_patterns.{name}")) && out.contains(says),
            "{out}"
        );
    }
}

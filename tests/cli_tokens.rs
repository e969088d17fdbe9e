//! The key and token commands through the real binary: `sealgate token operator|agent` mint tokens the
//! running gateway accepts (and refuses with the SPEC codes when they do not fit), and the keys of
//! `sealgate keygen` round-trip through OpenSSL and Python `cryptography` (scripts/test.sh installs both).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{code, tool_call, Gateway};
use serde_json::{json, Value};

/// The real `sealgate` with `args`; stdout and stderr apart (a token goes to stdout, notes to stderr).
fn sealgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(args)
        .output()
        .expect("run sealgate")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone())
        .expect("utf-8")
        .trim()
        .to_owned()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs an external tool (openssl, python3) that the test needs; its stdout.
fn external(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed (scripts/test.sh installs it): {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

fn jwt_claims(token: &str) -> Value {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "not a compact JWS: {token}");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("base64url")).expect("JSON")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Writes the harness's operator and agent-issuer private keys where the CLI can read them.
fn key_files(gw: &Gateway) -> (String, String) {
    let operator = gw.dir.join("operator.key");
    let agents = gw.dir.join("agents.key");
    std::fs::write(&operator, &gw.keys.operator_private).unwrap();
    std::fs::write(&agents, &gw.keys.agent_private).unwrap();
    (path_str(&operator).to_owned(), path_str(&agents).to_owned())
}

fn session_body(id: &str, public_key: &str) -> Value {
    json!({"session_id": id, "public_key": public_key, "security_context": "test",
           "agent_id": "agent-7", "expires_at": sealgate::clock::now_secs() + 600})
}

fn agent_token(agents_key: &str, session: &str, context: &str) -> String {
    stdout_of(&sealgate(&[
        "token",
        "agent",
        "--key",
        agents_key,
        "--agent",
        "agent-7",
        "--context",
        context,
        "--session",
        session,
        "--iss",
        "orchestrator",
        "--aud",
        "sealgate-agents",
        "--ttl",
        "5m",
    ]))
}

// The CLI blocks its thread while the gateway calls the in-process tool: two workers keep the tool served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minted_tokens_register_a_session_and_make_a_call_through_the_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (operator_key, agents_key) = key_files(&gw);

    let operator_token = stdout_of(&sealgate(&[
        "token",
        "operator",
        "--key",
        &operator_key,
        "--scope",
        "seal.session.create seal.session.read",
        "--ttl",
        "10m",
    ]));
    // keygen's own JSON is the session key file, for registration and for `invoke --key @FILE`.
    let keygen_json = stdout_of(&sealgate(&["keygen"]));
    let keygen_path = gw.dir.join("exec.json");
    std::fs::write(&keygen_path, &keygen_json).unwrap();
    let public_key = serde_json::from_str::<Value>(&keygen_json).unwrap()["public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = gw
        .register(Some(&operator_token), session_body("cli-1", &public_key))
        .await;
    assert_eq!(status, 201, "{body}");

    let token = agent_token(&agents_key, "cli-1", "test");
    let key_arg = format!("@{}", path_str(&keygen_path));
    let invoke = |token: &str, id: u64| {
        let payload = tool_call(id, "tool.write", json!({"path": "/workspace/a"})).to_string();
        sealgate(&[
            "invoke",
            "--key",
            &key_arg,
            "--token",
            token,
            "--payload",
            &payload,
            "--url",
            &gw.base,
        ])
    };
    let answer: Value = serde_json::from_str(&stdout_of(&invoke(&token, 1))).unwrap();
    assert_eq!(answer["status"], "success", "{answer}");
    assert_eq!(
        answer["payload"]["result"]["echo"]["path"], "/workspace/a",
        "{answer}"
    );
    assert_eq!(tool.count(), 1);

    // A token minted for another context is the CLI's output too, and the gateway holds it to its claims.
    let wrong_context = agent_token(&agents_key, "cli-1", "other");
    let refused = invoke(&wrong_context, 2);
    assert!(!refused.status.success());
    let body: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(code(&body), 3001, "{body}");
    assert_eq!(tool.count(), 1);

    // A token without the scope a request needs: 403 with 6002, and no session.
    let read_only = stdout_of(&sealgate(&[
        "token",
        "operator",
        "--key",
        &operator_key,
        "--scope",
        "seal.session.read",
    ]));
    let (status, body) = gw
        .register(Some(&read_only), session_body("cli-2", &public_key))
        .await;
    assert_eq!((status, code(&body)), (403, 6002), "{body}");
    let (status, _) = gw
        .operator(
            reqwest::Method::GET,
            "/v1/seal/sessions/cli-2",
            Some(&operator_token),
            None,
        )
        .await;
    assert_eq!(status, 404);
    // One minted for another audience is no operator token at all: 401 with 6001.
    let wrong_audience = stdout_of(&sealgate(&[
        "token",
        "operator",
        "--key",
        &operator_key,
        "--scope",
        "seal.admin",
        "--aud",
        "sealgate-agents",
    ]));
    let (status, body) = gw
        .register(Some(&wrong_audience), session_body("cli-3", &public_key))
        .await;
    assert_eq!((status, code(&body)), (401, 6001), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openssl_key_signs_envelopes_with_sealgate_sign() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (_, agents_key) = key_files(&gw);
    let private = gw.dir.join("openssl.key");
    external(
        "openssl",
        &[
            "genpkey",
            "-algorithm",
            "ed25519",
            "-out",
            path_str(&private),
        ],
    );
    let public_pem = external("openssl", &["pkey", "-in", path_str(&private), "-pubout"]);
    let (status, body) = gw
        .admin(
            reqwest::Method::POST,
            "/v1/seal/sessions",
            Some(session_body("ossl", &public_pem)),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    let token = agent_token(&agents_key, "ossl", "test");
    let payload = tool_call(1, "tool.write", json!({"path": "/workspace/b"})).to_string();
    let key_arg = format!("@{}", path_str(&private));
    let envelope: Value = serde_json::from_str(&stdout_of(&sealgate(&[
        "sign",
        "--key",
        &key_arg,
        "--token",
        &token,
        "--payload",
        &payload,
    ])))
    .unwrap();
    let (status, answer) = gw.post(&envelope).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(tool.count(), 1);
}

const PYTHON_SIGN: &str = r#"
import sys
from cryptography.hazmat.primitives.serialization import load_pem_private_key
key = load_pem_private_key(open(sys.argv[1], "rb").read(), password=None)
print(key.sign(sys.argv[2].encode()).hex())
"#;

#[test]
fn keygen_keys_round_trip_through_openssl_and_python_cryptography() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("keys");
    let written: Value = serde_json::from_str(&stdout_of(&sealgate(&[
        "keygen",
        "--out",
        path_str(&out),
        "--name",
        "exec",
    ])))
    .unwrap();
    let private = out.join("exec.key");
    let public = out.join("exec.pub.pem");
    assert_eq!(written["private_key_file"], path_str(&private));
    assert_eq!(written["public_key_file"], path_str(&public));
    let mode = std::fs::metadata(&private).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "private key mode {mode:o}");
    let public_pem = std::fs::read_to_string(&public).unwrap();
    assert!(!written.to_string().contains("PRIVATE"), "{written}");

    // OpenSSL 3.0 derives the same public key from the private file.
    let derived = external("openssl", &["pkey", "-in", path_str(&private), "-pubout"]);
    assert_eq!(derived, public_pem);

    // Python `cryptography` loads the private key; its signature verifies under sealgate's public key.
    let message = "sealgate round trip";
    let signature_hex = external("python3", &["-c", PYTHON_SIGN, path_str(&private), message]);
    let signature: [u8; 64] = hex::decode(signature_hex.trim())
        .unwrap()
        .try_into()
        .unwrap();
    let session_key = sealgate::envelope::SessionKey::parse(&public_pem).unwrap();
    assert_eq!(
        session_key.to_base64(),
        written["public_key"].as_str().unwrap()
    );
    session_key
        .verify(
            message.as_bytes(),
            &ed25519_dalek::Signature::from_bytes(&signature),
        )
        .expect("python's signature verifies");

    // The JSON form's PEM is the same v1 encoding: OpenSSL and Python read it too.
    let printed: Value = serde_json::from_str(&stdout_of(&sealgate(&["keygen"]))).unwrap();
    let json_private = dir.path().join("printed.key");
    std::fs::write(&json_private, printed["private_key_pem"].as_str().unwrap()).unwrap();
    let derived = external(
        "openssl",
        &["pkey", "-in", path_str(&json_private), "-pubout"],
    );
    assert_eq!(derived, printed["public_key_pem"].as_str().unwrap());
    external(
        "python3",
        &["-c", PYTHON_SIGN, path_str(&json_private), message],
    );

    // An existing pair is never overwritten, and a name with a path in it is refused.
    let again = sealgate(&["keygen", "--out", path_str(&out), "--name", "exec"]);
    assert!(!again.status.success());
    assert!(
        stderr_of(&again).contains("already exists"),
        "{}",
        stderr_of(&again)
    );
    assert_eq!(std::fs::read_to_string(&public).unwrap(), public_pem);
    assert_eq!(
        external("openssl", &["pkey", "-in", path_str(&private), "-pubout"]),
        public_pem
    );
    let escaping = sealgate(&["keygen", "--out", path_str(&out), "--name", "../evil"]);
    assert!(
        stderr_of(&escaping).contains("plain file name"),
        "{}",
        stderr_of(&escaping)
    );
    assert!(!dir.path().join("evil.key").exists());
}

#[test]
fn token_commands_explain_their_claims_and_refuse_bad_input_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.json");
    std::fs::write(&key, stdout_of(&sealgate(&["keygen"]))).unwrap();
    let key = path_str(&key);

    let explained = sealgate(&[
        "token",
        "operator",
        "--key",
        key,
        "--scope",
        "seal.session.create  seal.audit.read",
        "--sub",
        "alice",
        "--ttl",
        "2h",
        "--iss",
        "idp",
        "--explain",
    ]);
    let token = stdout_of(&explained);
    assert_eq!(token.lines().count(), 1, "stdout holds only the token");
    let claims = jwt_claims(&token);
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["aud"], "sealgate-operators");
    assert_eq!(claims["iss"], "idp");
    assert_eq!(claims["scope"], "seal.session.create seal.audit.read");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        7200
    );
    let notes = stderr_of(&explained);
    for name in ["sub", "aud", "scope", "iat", "exp", "jti", "iss"] {
        assert!(
            notes
                .lines()
                .any(|line| line.trim_start().starts_with(name)),
            "{name} not explained:\n{notes}"
        );
    }
    assert!(notes.contains("6002"), "{notes}");

    let agent = sealgate(&[
        "token",
        "agent",
        "--key",
        key,
        "--sub",
        "a-1",
        "--scp",
        "docs",
        "--exec-id",
        "run-1",
        "--wid",
        "pod-1",
        "--explain",
    ]);
    let claims = jwt_claims(&stdout_of(&agent));
    for (name, value) in [
        ("sub", "a-1"),
        ("scp", "docs"),
        ("exec_id", "run-1"),
        ("wid", "pod-1"),
    ] {
        assert_eq!(claims[name], value, "{claims}");
    }
    assert!(claims.get("aud").is_none() && claims["jti"].is_string());
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );
    assert!(stderr_of(&agent).contains("3001"), "{}", stderr_of(&agent));

    let missing_key = dir.path().join("missing.key");
    for (args, expected) in [
        (
            vec![
                "token",
                "operator",
                "--key",
                key,
                "--scope",
                "seal.session.create seal.sesion.read",
            ],
            "unknown scope `seal.sesion.read`",
        ),
        (
            vec!["token", "operator", "--key", key, "--scope", " "],
            "at least one scope",
        ),
        (
            vec![
                "token",
                "operator",
                "--key",
                key,
                "--scope",
                "seal.admin",
                "--ttl",
                "90d",
            ],
            "30 days",
        ),
        (
            vec![
                "token",
                "operator",
                "--key",
                key,
                "--scope",
                "seal.admin",
                "--ttl",
                "1w",
            ],
            "not a duration",
        ),
        (
            vec![
                "token",
                "operator",
                "--key",
                path_str(&missing_key),
                "--scope",
                "seal.admin",
            ],
            "cannot read",
        ),
        (
            vec![
                "token",
                "agent",
                "--key",
                key,
                "--agent",
                "a",
                "--context",
                "",
                "--session",
                "s",
            ],
            "empty `scp`",
        ),
    ] {
        let output = sealgate(&args);
        assert!(!output.status.success(), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?} printed a token");
        assert!(
            stderr_of(&output).contains(expected),
            "{args:?}: {}",
            stderr_of(&output)
        );
    }
}

//! What an operator meets before the first call, through the real binary: a bare `sealgate serve`,
//! readiness that means ready, a configured policy folder that must exist, `serve --check`, stdio commands and `cwd` resolved against the
//! configuration's folder, and configuration errors that name the key and the line.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{code, run_cli_with_env, start_tool, tool_call, until, write_config, Gateway, Keys};
use serde_json::{json, Value};

const CREDENTIAL: (&str, &str) = ("TEST_TOOL_CREDENTIAL", "Bearer tool-secret");

async fn readyz(gw: &Gateway) -> (u16, Value) {
    let response = gw
        .client
        .get(format!("{}/readyz", gw.base))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The test configuration in `dir`, with no policy file; returns its path.
async fn config_without_policies(dir: &Path, keys: &Keys) -> std::path::PathBuf {
    let (_tool, tool_base) = start_tool().await;
    let config = write_config(dir, keys, &tool_base, "", "");
    for file in ["test.yaml", "other.yaml"] {
        std::fs::remove_file(dir.join("policies").join(file)).unwrap();
    }
    config
}

#[tokio::test]
async fn readyz_is_503_until_a_security_context_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Arc::new(Keys::new());
    let config = config_without_policies(dir.path(), &keys).await;
    let gw = Gateway::spawn(dir.path(), &config, keys);

    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "error", "the SPEC error shape: {body}");
    assert_eq!(code(&body), 6003);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no security context"), "{message}");

    // Hot reload: a context added to the folder makes the gateway ready.
    std::fs::write(dir.path().join("policies/test.yaml"), common::TEST_POLICY).unwrap();
    until(Duration::from_secs(10), "/readyz 200", || async {
        readyz(&gw).await.0 == 200
    })
    .await;
    assert_eq!(
        readyz(&gw).await.1,
        json!({"status": "ready", "contexts": 1})
    );
}

#[tokio::test]
async fn a_misspelt_policies_dir_is_refused_at_start_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let (_tool, tool_base) = start_tool().await;
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("policies_dir: policies", "policies_dir: polices"),
    )
    .unwrap();

    let (status, output) = run_cli_with_env(
        &["serve", "--config", config.to_str().unwrap()],
        &[CREDENTIAL],
    );
    assert_ne!(status, 0, "{output}");
    let misspelt = dir.path().join("polices");
    assert!(
        output.contains(&format!(
            "policies_dir: {} does not exist",
            misspelt.display()
        )),
        "{output}"
    );
    assert!(!misspelt.exists(), "the folder must not be created");
    assert!(!output.contains("sealgate ready"), "{output}");
}

#[tokio::test]
async fn bare_serve_starts_in_an_empty_folder_and_makes_its_policy_folder() {
    // SPEC 11: every key has a default, so `sealgate serve` alone starts on the embedded store.
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sealgate"));
    command
        .arg("serve")
        .current_dir(dir.path())
        .env("SEALGATE_LISTEN", "127.0.0.1:0")
        .env("SEALGATE_LOG__LEVEL", "warn")
        .stderr(std::process::Stdio::inherit());
    let common::Launched {
        mut child, base, ..
    } = common::launch_command(command);
    let health = reqwest::get(format!("{base}/healthz"))
        .await
        .map(|r| r.status());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(health.unwrap(), 200);
    assert!(
        dir.path().join("policies").is_dir(),
        "the default policy folder is made"
    );
    assert!(
        dir.path().join("data").is_dir(),
        "the embedded store is in ./data"
    );
}

#[tokio::test]
async fn serve_check_lists_every_problem_and_passes_a_good_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let (_tool, tool_base) = start_tool().await;
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    let config_arg = config.to_str().unwrap();

    let (status, output) =
        run_cli_with_env(&["serve", "--check", "--config", config_arg], &[CREDENTIAL]);
    assert_eq!(status, 0, "{output}");
    assert!(
        output.contains("2 security context(s), 8 upstream(s), 0 warning(s)"),
        "{output}"
    );
    assert!(!output.contains("error:"), "{output}");

    // Seven broken sections at once: each is listed, by key.
    std::fs::write(
        dir.path().join("policies/bad-capabilities.yaml"),
        "name: broken\ncapabilities: 7\n",
    )
    .unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "policies_dir: policies\n\
         operator_auth: { keys: [ { alg: EdDSA, public_key_pem_file: keys/missing.pem } ] }\n\
         agent_tokens: { issuer_key: keys/issuer.pem }\n\
         upstreams:\n  \
           web: { mcp: { url: \"htp:/nowhere\" } }\n  \
           ghost: { mcp: { command: sealgate-no-such-tool } }\n\
         audit: { file: missing/audit.jsonl }\n\
         listen: \"localhost\"\n",
    )
    .unwrap();
    let (status, output) = run_cli_with_env(
        &["serve", "--check", "--config", broken.to_str().unwrap()],
        &[],
    );
    assert_eq!(status, 1, "{output}");
    let errors: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    for key in [
        "operator_auth.keys[0]",
        "agent_tokens.issuer_key",
        "upstream `web`: mcp.url",
        "upstreams.ghost.mcp.command: `sealgate-no-such-tool` is not found on PATH",
        "audit.file",
        "policies_dir",
        "listen",
    ] {
        assert!(
            errors.iter().any(|line| line.contains(key)),
            "{key} not named in:\n{output}"
        );
    }
    assert_eq!(errors.len(), 7, "{output}");
    // `serve` names a key the way `serve --check` does, once.
    let elsewhere = tempfile::tempdir().unwrap();
    let unreadable_key = elsewhere.path().join("unreadable-key.yaml");
    std::fs::write(
        &unreadable_key,
        "agent_tokens: { issuer_key: keys/issuer.pem }\n",
    )
    .unwrap();
    let refused = common::run_refused(
        &["serve", "--config", unreadable_key.to_str().unwrap()],
        &[],
    );
    assert!(
        refused.contains("sealgate: agent_tokens.issuer_key: ")
            && refused.matches("agent_tokens").count() == 1,
        "{refused}"
    );
    assert!(
        output.contains("bad-capabilities.yaml:2: capabilities"),
        "the policy file, line and field are named:\n{output}"
    );
    assert!(!output.contains("ok:"), "{output}");
    assert!(
        !dir.path().join("data").exists(),
        "--check serves nothing and opens no store"
    );

    // Valid but unusable: warnings, exit 0.
    let bare = dir.path().join("bare.yaml");
    std::fs::write(&bare, "policies_dir: empty\n").unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let (status, output) = run_cli_with_env(
        &["serve", "--check", "--config", bare.to_str().unwrap()],
        &[],
    );
    assert_eq!(status, 0, "{output}");
    for key in [
        "operator_auth.keys",
        "agent_tokens.keys",
        "upstreams",
        "policies_dir",
    ] {
        assert!(
            output
                .lines()
                .any(|l| l.starts_with(&format!("warning: {key}:"))),
            "no warning about {key}:\n{output}"
        );
    }
    assert!(
        output.contains("0 security context(s), 0 upstream(s), 4 warning(s)"),
        "{output}"
    );
}

#[test]
fn serve_check_refuses_an_audit_file_that_is_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    std::fs::create_dir(dir.path().join("trail")).unwrap();
    let config = dir.path().join("sealgate.yaml");
    std::fs::write(&config, "policies_dir: empty\naudit: { file: trail }\n").unwrap();
    let (status, output) = run_cli_with_env(
        &["serve", "--check", "--config", config.to_str().unwrap()],
        &[],
    );
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains("audit.file") && output.contains("not a regular file"),
        "{output}"
    );
}

#[test]
fn a_misspelt_variable_stops_serve_and_check_by_name_and_listed_ones_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let config = dir.path().join("sealgate.yaml");
    std::fs::write(&config, "policies_dir: empty\nlisten: \"127.0.0.1:0\"\n").unwrap();
    let config = config.to_str().unwrap();
    // A section instead of a key, and a misspelt key: each named, its value never quoted.
    for (variable, value) in [
        ("SEALGATE_AGENT_TOKENS", r#"{"secret": "TopSecret"}"#),
        ("SEALGATE_AUDIT__FLIE", "TopSecret"),
    ] {
        let (status, checked) = run_cli_with_env(
            &["serve", "--check", "--config", config],
            &[(variable, value)],
        );
        assert_eq!(status, 1, "{variable}: {checked}");
        let served = common::run_refused(&["serve", "--config", config], &[(variable, value)]);
        for output in [checked, served] {
            assert!(
                output.contains(&format!(
                    "environment variable {variable} names no configuration key"
                )),
                "{output}"
            );
            assert!(!output.contains("TopSecret"), "{output}");
        }
    }
    // The variables docs/operations.md lists as not configuration (`sealgate connect`'s, the tests').
    let (status, output) = run_cli_with_env(
        &["serve", "--check", "--config", config],
        &[
            ("SEALGATE_GATEWAY", "http://127.0.0.1:8089"),
            ("SEALGATE_KEY_FILE", "agent.key"),
            ("SEALGATE_TOKEN_FILE", "agent.jwt"),
            ("SEALGATE_TEST_ANYTHING", "1"),
        ],
    );
    assert_eq!(status, 0, "{output}");
}

#[tokio::test]
async fn null_in_a_variable_turns_an_optional_key_off_and_names_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    // The test configuration writes audit.jsonl; the variable says there is no audit file.
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    for null in ["null", "~", ""] {
        let gw = Gateway::spawn_with(Vec::new(), dir.path(), &config, keys.clone(), |command| {
            command.env("SEALGATE_AUDIT__FILE", null);
        });
        let (key, token) = gw.session(&format!("exec-null-{}", null.len())).await;
        let (status, body) = gw
            .call(&key, &token, tool_call(1, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
        for name in ["null", "~", "audit.jsonl"] {
            assert!(
                !dir.path().join(name).exists(),
                "{null:?} made a file {name}"
            );
        }
    }
}

#[tokio::test]
async fn serve_check_connects_to_a_postgres_store_as_start_up_does() {
    let db = sealgate::store::testing::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let (_tool, tool_base) = start_tool().await;
    let server = db.url.rsplit_once('/').unwrap().0;
    let check = |store: &str| {
        let config = write_config(
            dir.path(),
            &keys,
            &tool_base,
            "",
            &format!("store: {store:?}\n"),
        );
        let config = config.to_str().unwrap().to_owned();
        let checked = run_cli_with_env(&["serve", "--check", "--config", &config], &[CREDENTIAL]);
        let served = common::run_refused(&["serve", "--config", &config], &[CREDENTIAL]);
        (checked, served)
    };
    // A database that does not exist: --check says so, as start-up would.
    let missing = format!("{server}/{}_absent", db.name);
    let ((status, output), start_up) = check(&missing);
    assert_eq!(status, 1, "{output}");
    for printed in [&output, &start_up] {
        assert!(
            printed.contains(&format!("database \"{}_absent\" does not exist", db.name)),
            "{printed}"
        );
    }
    // A password in the URL is never printed, whatever fails.
    let with_password = missing.replacen("://postgres@", "://postgres:TopSecret@", 1);
    let ((status, output), _) = check(&with_password);
    assert_eq!(status, 1, "{output}");
    assert!(!output.contains("TopSecret"), "{output}");
    // A schema newer than this build knows: refused by --check, with nothing changed in it.
    db.execute(
        "CREATE TABLE schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO schema_version (version) VALUES (999)",
    )
    .await;
    let ((status, output), start_up) = check(&db.url);
    assert_eq!(status, 1, "{output}");
    for printed in [&output, &start_up] {
        assert!(
            printed.contains("schema is at version 999, newer than"),
            "{printed}"
        );
    }
}

/// A stdio MCP server in a few lines of sh: it answers `pwd` with its working directory.
const PWD_SERVER: &str = r#"#!/bin/sh
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
  [ -z "$id" ] && continue
  case "$line" in
    *'"method":"initialize"'*)
      version=$(printf '%s' "$line" | sed -n 's/.*"protocolVersion":"\([^"]*\)".*/\1/p')
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"%s","capabilities":{"tools":{}},"serverInfo":{"name":"pwd","version":"1"}}}\n' "$id" "$version" ;;
    *'"method":"tools/call"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}\n' "$id" "$(pwd -P)" ;;
    *)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[]}}\n' "$id" ;;
  esac
done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_stdio_command_and_cwd_resolve_against_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let script = tools.join("pwd-mcp.sh");
    std::fs::write(&script, PWD_SERVER).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The gateway runs in the test's working directory, not in `dir`: only resolution finds the script.
    let upstream =
        r#"  pwd: { mcp: { command: "./tools/pwd-mcp.sh", cwd: work }, timeout_ms: 5000 }"#;
    let (gw, _tool) = Gateway::start_with(dir.path(), upstream, "").await;
    let (key, token) = gw.session_in("exec-pwd", "other").await;

    let (status, body) = gw
        .call(&key, &token, tool_call(1, "pwd.pwd", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let seen = body["payload"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    let expected = dir.path().join("work").canonicalize().unwrap();
    assert_eq!(Path::new(seen), expected);

    let (status, output) = run_cli_with_env(
        &[
            "serve",
            "--check",
            "--config",
            gw.config_path.to_str().unwrap(),
        ],
        &[CREDENTIAL],
    );
    assert_eq!(status, 0, "--check finds the script too: {output}");
}

#[tokio::test]
async fn a_type_error_names_the_key_and_the_line_or_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sealgate.yaml");
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(
        &config,
        "listen: \"127.0.0.1:0\"\npolicies_dir: policies\nlimits:\n  max_clock_skew_secs: 5\n  max_body_bytes: 1MB\n",
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    for args in [
        vec!["serve", "--config", config_arg],
        vec!["serve", "--check", "--config", config_arg],
    ] {
        let (status, output) = run_cli_with_env(&args, &[]);
        assert_ne!(status, 0, "{output}");
        let expected = format!(
            "{}:5: limits.max_body_bytes: invalid type: string \"1MB\", expected usize",
            config.display()
        );
        assert!(output.contains(&expected), "{expected} not in:\n{output}");
    }

    // The same error from an override names the variable instead of a line of the file.
    std::fs::write(&config, "policies_dir: policies\n").unwrap();
    let (status, output) = run_cli_with_env(
        &["serve", "--check", "--config", config_arg],
        &[("SEALGATE_LIMITS__MAX_BODY_BYTES", "1MB")],
    );
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains(
            "environment variable SEALGATE_LIMITS__MAX_BODY_BYTES: limits.max_body_bytes: invalid type: string \"1MB\""
        ),
        "{output}"
    );
}

//! `sealgate demo` through the real binary: it shows each request it sends, abridged, and removes its
//! folder (which holds a private key) on exit unless `--keep`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Runs the demo with its temporary folder under `tmp`; returns what it printed.
fn demo(tmp: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .arg("demo")
        .args(extra)
        .env("TMPDIR", tmp)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    printed
}

fn left_in(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn the_demo_shows_each_request_and_removes_its_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let printed = demo(tmp.path(), &[]);

    for line in [
        "→ POST /v1/seal/sessions  (Authorization: Bearer ",
        "→ DELETE /v1/seal/sessions/exec-demo-1",
        "→ GET /v1/audit?limit=100",
        "← HTTP 200, claim PROCEED",
        "← HTTP 200, claim SKIP",
        "refused with 2002",
        "refused with 1002",
        "refused with 2010 FLOW_BLOCKED: flow rule 0 blocks external_send once the session holds untrusted_content, private_data",
        "← labels [{\"label\":\"untrusted_content\",\"seq\":",
        "→ GET /v1/keys",
        "`sealgate receipt verify --keys KEYS response.json` → signed by kid ",
        "`sealgate audit verify audit.jsonl --keys KEYS` → chain intact, ",
    ] {
        assert!(printed.contains(line), "no {line:?} in:\n{printed}");
    }
    assert!(!printed.contains("verification FAILED"), "{printed}");
    // Without --serve the gateway ends with the tour, so no link that would be dead when opened.
    assert!(!printed.contains("#token="), "{printed}");
    assert!(
        printed.contains("console: `sealgate demo --serve` keeps the gateway up"),
        "{printed}"
    );
    // Every envelope sent is printed as JSON, in its wire shape, with the token and signature cut short.
    let envelopes: Vec<Value> = printed
        .lines()
        .filter_map(|l| l.trim().strip_prefix("→ POST /v1/invoke "))
        .map(|json| serde_json::from_str(json).expect("an envelope line is JSON"))
        .collect();
    assert_eq!(envelopes.len(), 9, "{printed}");
    for envelope in &envelopes {
        assert_eq!(envelope["protocol"], "seal/v1");
        assert_eq!(envelope["payload"]["method"], "tools/call");
        assert!(envelope["timestamp"].is_i64());
        for long in ["security_token", "signature"] {
            let shown = envelope[long].as_str().unwrap();
            assert!(
                shown.ends_with('…') && shown.chars().count() <= 17,
                "{long} not abridged: {shown}"
            );
        }
    }
    assert_eq!(
        envelopes[3]["payload"]["params"]["arguments"]["path"], "/workspace/secret.txt",
        "the altered envelope is shown as sent"
    );
    // A keyed retry (SPEC 7.1 r3): the write and its retry carry the same key, and the tool ran once.
    let key = &envelopes[0]["payload"]["params"]["_meta"]["idempotency_key"];
    assert!(key.is_string(), "{printed}");
    assert_eq!(
        &envelopes[1]["payload"]["params"]["_meta"]["idempotency_key"],
        key
    );
    assert!(
        printed.contains("the tool really ran 1 time(s)"),
        "{printed}"
    );

    assert!(
        left_in(tmp.path()).is_empty(),
        "the demo left {:?}",
        left_in(tmp.path())
    );
}

#[test]
fn the_demo_keeps_its_folder_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let printed = demo(tmp.path(), &["--keep"]);

    let left = left_in(tmp.path());
    let [kept] = left.as_slice() else {
        panic!("expected one folder, found {left:?}")
    };
    assert!(
        printed.contains(&format!(
            "kept the demo's folder (configuration, issuer key, store, audit file): {}",
            kept.display()
        )),
        "{printed}"
    );
    // It holds the gateway's private issuer key: for its owner only.
    let mode = std::fs::metadata(kept).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(kept.join("issuer.pem").is_file());
    let audit = kept.join("audit.jsonl");
    let (code, verified) = common::run_cli(&["audit", "verify", audit.to_str().unwrap()]);
    assert_eq!(code, 0, "{verified}");
}

#[test]
fn a_reader_that_stops_early_neither_crashes_the_demo_nor_leaves_its_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `sealgate demo | head -1`: read one line, then close the pipe.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(left_in(tmp.path()).is_empty(), "{:?}", left_in(tmp.path()));
}

#[test]
fn demo_serve_stopped_by_sigterm_or_sigint_removes_its_folder() {
    for signal in ["TERM", "INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(["demo", "--serve"])
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let serving = std::io::BufRead::lines(stdout)
            .map_while(Result::ok)
            .any(|line| line.starts_with("the gateway keeps serving the console"));
        assert!(serving, "the demo did not reach --serve");
        assert_eq!(
            left_in(tmp.path()).len(),
            1,
            "the folder exists while it serves"
        );
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = child.wait().unwrap();
        assert!(status.success(), "SIG{signal}: {status:?}");
        assert!(
            left_in(tmp.path()).is_empty(),
            "SIG{signal} left {:?} (with its issuer key)",
            left_in(tmp.path())
        );
    }
}

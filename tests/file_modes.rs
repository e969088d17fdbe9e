//! Private state on disk (SPEC 11 r3) through the real binary, started under a permissive umask (022, as
//! most shells have): the data folder is 0700 and every file the gateway creates 0600 — the store, the
//! audit file and its rotated files, keys written by `keygen --out`, the demo's files — and a data folder
//! or audit file that an earlier version left open is made private at start-up.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{start_tool, tool_call, write_config, Gateway, Keys};
use nix::sys::stat::Mode;
use serde_json::json;

/// The umask the test's children inherit, unless the gateway sets its own.
fn permissive_umask() {
    nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every folder under `root` (itself included) and every file, with its mode.
fn walk(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = vec![(root.to_path_buf(), mode(root))];
    if root.is_dir() {
        for entry in std::fs::read_dir(root).unwrap() {
            found.extend(walk(&entry.unwrap().path()));
        }
    }
    found
}

/// Folders 0700, files 0600: nothing for group or others.
fn assert_private(root: &Path) {
    for (path, mode) in walk(root) {
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, expected, "{} is {mode:o}", path.display());
    }
}

/// The audit file and its rotated files (`audit.jsonl.FIRST-LAST`).
fn audit_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("audit.jsonl"))
        })
        .collect()
}

/// The live audit file. A write that takes it past the rotation size renames it away and the next write
/// starts a new one, so when the last call's batch did, one more call (far below the size) makes it.
async fn live_audit_file(
    gw: &Gateway,
    key: &ed25519_dalek::SigningKey,
    token: &str,
    next_id: &mut u64,
) -> PathBuf {
    let live = gw.dir.join("audit.jsonl");
    for _ in 0..3 {
        if live.exists() {
            return live;
        }
        let (status, body) = gw
            .call(key, token, tool_call(*next_id, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
        *next_id += 1;
    }
    panic!("no live audit file after three more calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_the_gateway_creates_is_private_whatever_its_umask() {
    permissive_umask();
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    // Small files, so that the audit file rotates during the calls.
    let mut gw = Gateway::spawn_with(Vec::new(), dir.path(), &config, keys, |command| {
        command.env("SEALGATE_AUDIT__ROTATE_BYTES", "2000");
    });
    let (key, token) = gw.session("exec-modes").await;
    for id in 1..=6 {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let audit = audit_files(dir.path());
    assert!(audit.len() >= 2, "the audit file rotated: {audit:?}");
    for file in &audit {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    // On PostgreSQL nothing is kept in the data folder; where there is one, it is private throughout.
    let data = dir.path().join("data");
    if data.exists() {
        assert_private(&data);
    }

    // Left open by an earlier version (or by hand): made private at the next start.
    let mut next_id = 7;
    let live = live_audit_file(&gw, &key, &token, &mut next_id).await;
    gw.kill();
    let opened = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    opened(&live, 0o644);
    std::fs::create_dir_all(&data).unwrap();
    opened(&data, 0o755);
    gw.restart();
    live_audit_file(&gw, &key, &token, &mut next_id).await;
    // The file left open is private now, whether it is still the live one or was rotated away.
    for file in audit_files(dir.path()) {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    if std::env::var("SEALGATE_TEST_STORE").as_deref() != Ok("postgres") {
        assert_eq!(mode(&data), 0o700);
    }
}

#[test]
fn keys_written_by_keygen_and_the_demos_kept_files_are_private() {
    permissive_umask();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("keys");
    let (status, printed) = common::run_cli(&["keygen", "--out", out.to_str().unwrap()]);
    assert_eq!(status, 0, "{printed}");
    assert_private(&out);

    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (status, printed) =
        common::run_cli_with_env(&["demo", "--keep"], &[("TMPDIR", tmp.to_str().unwrap())]);
    assert_eq!(status, 0, "{printed}");
    let kept: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    // Configuration, issuer key, policies, store, audit file: all the operator's alone.
    assert_private(&kept[0]);
}

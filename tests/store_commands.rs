//! `sealgate store backup`, `store check` and `store import-sled` (SPEC 12 r3) through the real binary, as
//! docs/backup.md and docs/upgrading.md tell operators to run them. The embedded store only: PostgreSQL's
//! backups are its own tools.

mod common;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{
    archives, audit_verify, keyed_call, run_cli_with_env, run_refused, start_tool, tool_call,
    until, write_config, Gateway, Keys,
};
use serde_json::{json, Value};

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `sealgate store COMMAND --config CONFIG [ARG]`: the exit code and everything it printed. It reads the
/// whole configuration as `serve` does, so it gets the environment that `serve` gets.
fn store(command: &str, config: &Path, arg: Option<&Path>) -> (i32, String) {
    let mut args = vec!["store", command, "--config", text(config)];
    args.extend(arg.map(text));
    run_cli_with_env(&args, &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")])
}

/// The keyed write whose answer the store keeps: a retry with the same key is a SKIP.
fn report_write(id: u64) -> Value {
    keyed_call(
        id,
        "tool.write",
        json!({"path": "/workspace/report.txt"}),
        "report-1",
    )
}

/// Another keyed write, made after the backup.
fn invoice_write(id: u64) -> Value {
    keyed_call(
        id,
        "tool.write",
        json!({"path": "/workspace/invoice.txt"}),
        "invoice-1",
    )
}

/// The audit events that a store file holds, oldest first.
fn stored_events(database: &Path) -> Vec<Value> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut select = conn
        .prepare("SELECT event FROM audit_events ORDER BY seq")
        .unwrap();
    let texts = select.query_map([], |row| Ok(row_text(row))).unwrap();
    texts
        .map(|text| serde_json::from_str(&text.unwrap()).unwrap())
        .collect()
}

/// An event row's JSON text. The store packs events as standard zstd frames with the dictionary in the
/// source tree (docs/durability.md); a row an older build wrote, or a test edited, is plain text.
fn row_text(row: &rusqlite::Row<'_>) -> String {
    match row.get_ref(0).unwrap() {
        rusqlite::types::ValueRef::Text(text) => String::from_utf8(text.to_vec()).unwrap(),
        rusqlite::types::ValueRef::Blob(frame) => {
            let dictionary = include_bytes!("../src/store/sqlite/records.zdict");
            let mut unpack = zstd::bulk::Decompressor::with_dictionary(dictionary).unwrap();
            String::from_utf8(unpack.decompress(frame, 1 << 20).unwrap()).unwrap()
        }
        other => panic!("an event row holds {other:?}"),
    }
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Restores as docs/backup.md says: the configuration and policies as they were, and a new data folder
/// (0700) holding the backup as `sealgate.db` beside the signing key kept from the old one.
fn restore(backup: &Path, from: &Gateway, to: &Path) -> PathBuf {
    let policies = to.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for entry in std::fs::read_dir(from.dir.join("policies")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), policies.join(entry.file_name())).unwrap();
    }
    let config = to.join("sealgate.yaml");
    std::fs::copy(&from.config_path, &config).unwrap();
    let data = to.join("data");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&data)
        .unwrap();
    std::fs::copy(backup, data.join("sealgate.db")).unwrap();
    std::fs::copy(from.dir.join("data/signing.key"), data.join("signing.key")).unwrap();
    config
}

#[tokio::test]
async fn a_backup_taken_while_serving_restores_the_claims_the_chain_and_the_signing_key() {
    let dir = tempfile::tempdir().unwrap();
    let (live, restored) = (dir.path().join("live"), dir.path().join("restored"));
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(&live, &keys, &tool_base, "", "");
    // A checkpoint every two events, so that the backup holds one signed with the live gateway's key.
    let gw = Gateway::spawn_with(Vec::new(), &live, &config, keys.clone(), |command| {
        command.env("SEALGATE_AUDIT__CHECKPOINT_EVERY", "2");
    });
    let (key, token) = gw.session("exec-backup").await;
    let (status, first) = gw.call(&key, &token, report_write(1)).await;
    assert_eq!(first["receipt"]["claim"], "PROCEED", "{status} {first}");
    until(
        Duration::from_secs(10),
        "a checkpoint in the chain",
        || async { gw.export().await.contains("\"AuditCheckpoint\"") },
    )
    .await;

    let backup = dir.path().join("sealgate-backup.db");
    let (status, out) = store("backup", &config, Some(&backup));
    assert_eq!(status, 0, "{out}");
    assert!(
        out.starts_with(&format!("ok: {} written", backup.display())),
        "{out}"
    );
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the copy holds everything the store does");
    let backed_up = stored_events(&backup);
    // A call after the backup: the restored store will not know it.
    let (status, later) = gw.call(&key, &token, invoice_write(3)).await;
    assert_eq!(later["receipt"]["claim"], "PROCEED", "{status} {later}");
    let live_audit_file = gw.audit_file().await;

    // The machine is lost. Restored beside the live audit file, which holds events that the backup does
    // not, the gateway refuses to start rather than fork the chain; with that file moved aside, it starts.
    let restored_config = restore(&backup, &gw, &restored);
    drop(gw);
    let audit_file = restored.join("audit.jsonl");
    std::fs::write(&audit_file, &live_audit_file).unwrap();
    let refused = run_refused(
        &["serve", "--config", text(&restored_config)],
        &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")],
    );
    let expected = format!(
        "ends at seq {} but the store's chain ends at seq {}",
        json_lines(&live_audit_file).len(),
        backed_up.len()
    );
    assert!(refused.contains(&expected), "{refused}");
    std::fs::rename(&audit_file, restored.join("audit.jsonl.before-restore")).unwrap();
    let (status, out) = store("check", &restored_config, None);
    assert_eq!(status, 0, "{out}");
    let events = backed_up.len();
    assert!(
        out.contains(&format!("{events} events, seq 1..{events}")),
        "{out}"
    );

    let gw = Gateway::spawn(&restored, &restored_config, keys);
    let (status, again) = gw.call(&key, &token, report_write(2)).await;
    assert_eq!(again["receipt"]["claim"], "SKIP", "{status} {again}");
    assert_eq!(again["payload"]["result"], first["payload"]["result"]);
    assert_eq!(
        tool.count(),
        2,
        "the restored claim kept the tool from running again"
    );
    assert_eq!(
        again["receipt"]["sig"]["kid"], first["receipt"]["sig"]["kid"],
        "the restored gateway signs with the key it signed with before"
    );
    let (status, lost) = gw.call(&key, &token, invoice_write(4)).await;
    assert_eq!(
        lost["receipt"]["claim"], "PROCEED",
        "a claim taken after the backup is lost with the rest: {status} {lost}"
    );
    assert_eq!(tool.count(), 3);

    let export = dir.path().join("export.jsonl");
    let chain = gw.save_export(&export).await;
    assert_eq!(
        chain[..backed_up.len()],
        backed_up[..],
        "the restored chain begins with every event the backup held"
    );
    let (status, out) = audit_verify(&[&export], Some(&gw.keys_url()));
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("checkpoints verified"), "{out}");
    // The new audit file begins after the restored chain; the export holds all of it.
    let audit_file = json_lines(&gw.audit_file().await);
    assert_eq!(audit_file[0], chain[backed_up.len()]);
    let (status, out) = store("check", &restored_config, None);
    assert_eq!(status, 0, "{out}");
    let events = chain.len();
    assert!(
        out.starts_with(&format!(
            "ok: integrity check passed; {events} events, seq 1..{events}, chain intact"
        )),
        "{out}"
    );
}

#[tokio::test]
async fn a_backup_never_replaces_a_file_and_names_what_it_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    gw.session("exec-refused").await;
    let existing = dir.path().join("existing.db");
    std::fs::write(&existing, "an earlier backup").unwrap();
    let (status, out) = store("backup", &gw.config_path, Some(&existing));
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with(&format!(
            "cannot create {}: File exists",
            existing.display()
        )),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&existing).unwrap(),
        "an earlier backup"
    );

    // A name that is a symlink, even to nothing yet, is never followed (SPEC 20 rule 14).
    let elsewhere = dir.path().join("elsewhere.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let (status, out) = store("backup", &gw.config_path, Some(&link));
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with(&format!("cannot create {}: File exists", link.display())),
        "{out}"
    );
    assert!(!elsewhere.exists(), "nothing is written through the link");
    let staging_left = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(".sealgate-backup-")
        });
    assert!(!staging_left, "the staging folder goes with the command");

    let nowhere = dir.path().join("no-such-folder/backup.db");
    let (status, out) = store("backup", &gw.config_path, Some(&nowhere));
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with(&format!(
            "cannot create {}: No such file or directory",
            nowhere.display()
        )),
        "{out}"
    );

    // A configuration whose data folder holds no store: nothing is made there.
    let empty = dir.path().join("empty");
    let config = write_config(&empty, &gw.keys, "http://127.0.0.1:1", "", "");
    let (status, out) = store("backup", &config, Some(&dir.path().join("b.db")));
    assert_eq!(status, 1, "{out}");
    let database = empty.join("data/sealgate.db");
    assert!(
        out.starts_with(&format!("no embedded store at {}", database.display())),
        "{out}"
    );
    assert!(!database.exists());
}

/// Edits the stored event `seq` (its `at`), as a hand with the `sqlite3` shell could.
fn edit_event(database: &Path, seq: i64) {
    let conn = rusqlite::Connection::open(database).unwrap();
    let stored = conn
        .query_row(
            "SELECT event FROM audit_events WHERE seq = ?1",
            [seq],
            |row| Ok(row_text(row)),
        )
        .unwrap();
    let mut event: Value = serde_json::from_str(&stored).unwrap();
    event["at"] = json!("2000-01-01T00:00:00.000Z");
    conn.execute(
        "UPDATE audit_events SET event = ?1 WHERE seq = ?2",
        rusqlite::params![event.to_string(), seq],
    )
    .unwrap();
}

#[tokio::test]
async fn store_check_names_the_event_that_was_edited_or_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-damage").await;
    let (_, answer) = gw.call(&key, &token, report_write(1)).await;
    assert_eq!(answer["receipt"]["claim"], "PROCEED", "{answer}");
    let events = gw.export().await.lines().count();
    assert!(events >= 3, "{events} events");
    let (status, out) = store("check", &gw.config_path, None);
    assert_eq!(status, 0, "{out}");
    assert!(
        out.contains(&format!("{events} events, seq 1..{events}, chain intact")),
        "{out}"
    );
    gw.kill();

    let database = gw.dir.join("data/sealgate.db");
    edit_event(&database, 2);
    let (status, out) = store("check", &gw.config_path, None);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("the audit chain is broken: audit chain broken at line 2, seq 2"),
        "{out}"
    );

    let conn = rusqlite::Connection::open(&database).unwrap();
    conn.execute("DELETE FROM audit_events WHERE seq = 2", [])
        .unwrap();
    drop(conn);
    let (status, out) = store("check", &gw.config_path, None);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("seq 3 follows seq 1 (expected 2)"), "{out}");
}

/// What a rollback meets (docs/upgrading.md): a build refuses a store whose schema is newer than it knows.
#[tokio::test]
async fn a_store_migrated_by_a_newer_build_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, _tool) = Gateway::start(dir.path(), "").await;
    gw.session("exec-newer").await;
    gw.kill();
    let conn = rusqlite::Connection::open(gw.dir.join("data/sealgate.db")).unwrap();
    let known: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert!(known >= 1, "the schema version is kept as user_version");
    conn.execute_batch(&format!("PRAGMA user_version = {}", known + 1))
        .unwrap();
    drop(conn);
    let refused = run_refused(
        &["serve", "--config", text(&gw.config_path)],
        &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")],
    );
    let expected = format!(
        "the store's schema is at version {}, newer than the {known} this build knows",
        known + 1
    );
    assert!(refused.contains(&expected), "{refused}");
}

/// SPEC 20 rule 2: a second `serve` on a data folder that a running gateway holds stops at once, naming the
/// folder and the holder, and leaves the first one serving; the read-only commands still work beside it.
#[tokio::test]
async fn a_second_gateway_on_the_same_data_folder_stops_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-one-process").await;
    let (_, answer) = gw.call(&key, &token, report_write(1)).await;
    assert_eq!(answer["receipt"]["claim"], "PROCEED", "{answer}");

    let refused = run_refused(
        &["serve", "--config", text(&gw.config_path)],
        &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")],
    );
    let data = gw.dir.join("data");
    let expected = format!(
        "the embedded store in {} is in use by process {}",
        data.display(),
        gw.child.id()
    );
    assert!(refused.contains(&expected), "{refused}");

    // The first gateway serves on, and its chain was not forked.
    let (_, answer) = gw.call(&key, &token, report_write(2)).await;
    assert_eq!(answer["receipt"]["claim"], "SKIP", "{answer}");
    let (status, out) = store("check", &gw.config_path, None);
    assert_eq!(status, 0, "{out}");
    let backup = dir.path().join("while-held.db");
    let (status, out) = store("backup", &gw.config_path, Some(&backup));
    assert_eq!(status, 0, "{out}");

    // The kernel lets go of the lock with its holder, however it ends (restart kills it with SIGKILL).
    gw.restart();
    let (_, answer) = gw.call(&key, &token, report_write(3)).await;
    assert_eq!(answer["receipt"]["claim"], "SKIP", "{answer}");
}

/// A sled data folder of the previous release, made by its `make.sh` (see its README.md).
const SLED_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sled-0.1.0");

fn fixture(name: &str) -> PathBuf {
    Path::new(SLED_FIXTURE).join(name)
}

/// The fixture's test keys: the session was registered, and its call signed, with these.
fn fixture_keys() -> Keys {
    let read = |name: &str| std::fs::read_to_string(fixture(&format!("keys/{name}"))).unwrap();
    Keys {
        operator_private: read("operator.key"),
        operator_public: read("operator.pub.pem"),
        agent_private: read("agents.key"),
        agent_public: read("agents.pub.pem"),
    }
}

/// Copies a folder and everything in it (sled opens its store for writing: never the repository's copy).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// `GET /v1/seal/sessions/ID`: what the gateway knows of the session.
async fn session_view(gw: &Gateway, id: &str) -> Value {
    let (status, view) = gw
        .admin(
            reqwest::Method::GET,
            &format!("/v1/seal/sessions/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{view}");
    view
}

#[tokio::test]
async fn a_sled_store_of_the_previous_release_imports_with_its_chain_and_its_stored_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sled = dir.path().join("data.sled");
    copy_tree(&fixture("data"), &sled);
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(fixture_keys());
    let config = write_config(dir.path(), &keys, &tool_base, "", "");
    // The audit file stays where it was: it holds the chain that the import copies.
    std::fs::copy(fixture("audit.jsonl"), dir.path().join("audit.jsonl")).unwrap();
    let old_chain = json_lines(&std::fs::read_to_string(fixture("audit.jsonl")).unwrap());
    let proceed: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("proceed.json")).unwrap()).unwrap();
    assert_eq!(proceed["receipt"]["claim"], "PROCEED", "{proceed}");

    let not_sled = dir.path().join("not-sled");
    std::fs::create_dir(&not_sled).unwrap();
    let (status, out) = store("import-sled", &config, Some(&not_sled));
    assert_eq!(status, 1, "{out}");
    let expected = format!(
        "{} is not a sled data folder (no conf and db files)",
        not_sled.display()
    );
    assert!(out.starts_with(&expected), "{out}");

    let (status, out) = store("import-sled", &config, Some(&sled));
    assert_eq!(status, 0, "{out}");
    let events = old_chain.len();
    let expected = format!(
        "ok: imported 1 sessions, 1 claims, 0 contexts, 0 approval requests, 1 budget counts and \
         {events} audit events into {}; the chain verifies (seq 1..{events}, last hash {})",
        dir.path().join("data/sealgate.db").display(),
        old_chain[events - 1]["hash"].as_str().unwrap()
    );
    assert_eq!(out.trim_end(), expected);

    let gw = Gateway::spawn(dir.path(), &config, keys.clone());
    let export = dir.path().join("export.jsonl");
    let chain = gw.save_export(&export).await;
    assert_eq!(
        chain[..events],
        old_chain[..],
        "the old chain, event for event, with its hashes"
    );
    let (status, out) = audit_verify(&[&export], None);
    assert_eq!(status, 0, "{out}");
    let session = session_view(&gw, "exec-sled").await;
    assert_eq!(
        session["calls"]["allowed"], 1,
        "the budget count came along: {session}"
    );

    let session_key =
        sealgate::envelope::read_signing_key_file(&fixture("keys/session.key")).unwrap();
    let token = keys.agent_token("exec-sled");
    let (status, again) = gw.call(&session_key, &token, report_write(3)).await;
    assert_eq!(again["receipt"]["claim"], "SKIP", "{status} {again}");
    assert_eq!(again["payload"]["result"], proceed["payload"]["result"]);
    assert_eq!(
        again["receipt"]["request_id"],
        proceed["receipt"]["request_id"]
    );
    assert_eq!(tool.count(), 0, "the stored answer, not the tool, answered");
    // The SKIP was the budget's second call of two: the next one is refused.
    assert_eq!(session_view(&gw, "exec-sled").await["status"], "exhausted");
    let (status, refused) = gw.call(&session_key, &token, invoice_write(4)).await;
    assert_eq!((status, common::code(&refused)), (403, 2008), "{refused}");
    // The audit file went on from the imported chain.
    let audit_file = gw.audit_file().await;
    let (status, out) = audit_verify(&[&dir.path().join("audit.jsonl")], None);
    assert_eq!(status, 0, "{out}");
    assert!(json_lines(&audit_file).len() > events, "{audit_file}");

    // A data folder that holds a store already is never imported into.
    let (status, out) = store("import-sled", &config, Some(&sled));
    assert_eq!(status, 1, "{out}");
    let database = dir.path().join("data/sealgate.db");
    assert!(
        out.starts_with(&format!(
            "{} exists already: import into a data_dir that holds no store",
            database.display()
        )),
        "{out}"
    );
}

#[tokio::test]
async fn archives_written_before_a_restore_stay_beside_the_ones_written_after() {
    // Archives kept outside the data folder, so that a restore leaves them where they are; 1 s of skew
    // lets retention archive what is 3 s old.
    let dir = tempfile::tempdir().unwrap();
    let (live, restored) = (dir.path().join("live"), dir.path().join("restored"));
    let archive = dir.path().join("archive");
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let extra = format!(
        "retention: {{ audit_days: 0.00001, archive_dir: {archive:?} }}\n\
         limits: {{ max_clock_skew_secs: 1 }}\n"
    );
    let config = write_config(&live, &keys, &tool_base, "", &extra);
    let gw = Gateway::spawn(&live, &config, keys.clone());
    let (key, token) = gw.session("exec-archives").await;
    let off = |id| tool_call(id, "tool.off", json!({}));
    assert_eq!(gw.call(&key, &token, off(1)).await.0, 200);
    let backup = dir.path().join("sealgate-backup.db");
    let (status, out) = store("backup", &config, Some(&backup));
    assert_eq!(status, 0, "{out}");
    let backed_up = stored_events(&backup);
    assert_eq!(
        backed_up[0]["seq"], 1,
        "the backup was taken before any archive"
    );
    let backup_last = backed_up.len() as u64;

    // The live gateway goes on, and archives events that the backup does not hold.
    assert_eq!(gw.call(&key, &token, off(2)).await.0, 200);
    assert_eq!(gw.call(&key, &token, off(3)).await.0, 200);
    until(
        Duration::from_secs(30),
        "an archive of events after the backup",
        || async {
            archives(&archive)
                .iter()
                .any(|(_, last, _)| *last > backup_last)
        },
    )
    .await;
    let before: Vec<(PathBuf, Vec<u8>)> = archives(&archive)
        .into_iter()
        .map(|(_, _, path)| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();

    // Restored from the backup, the gateway archives its own, other events under the same seqs.
    let restored_config = restore(&backup, &gw, &restored);
    drop(gw);
    let gw = Gateway::spawn(&restored, &restored_config, keys);
    assert_eq!(gw.call(&key, &token, off(4)).await.0, 200);
    until(
        Duration::from_secs(30),
        "the restored gateway to archive its events after the backup",
        || async {
            archives(&archive).iter().any(|(_, last, path)| {
                *last > backup_last && !before.iter().any(|(old, _)| old == path)
            })
        },
    )
    .await;
    for (path, bytes) in &before {
        let kept = std::fs::read(path).unwrap_or_default();
        assert!(kept == *bytes, "{path:?} was deleted or rewritten");
    }
    // The archives of the restored chain, followed by its store, verify as one chain. Retention goes on
    // meanwhile: an archive written after the export holds events the export has too, so it is left out.
    let export = dir.path().join("export.jsonl");
    gw.save_export(&export).await;
    let exported_from = json_lines(&std::fs::read_to_string(&export).unwrap())[0]["seq"]
        .as_u64()
        .unwrap();
    let mut chain: Vec<PathBuf> = archives(&archive)
        .into_iter()
        .filter(|(_, last, path)| {
            *last < exported_from && !before.iter().any(|(old, _)| old == path)
        })
        .map(|(_, _, path)| path)
        .collect();
    chain.push(export);
    let files: Vec<&Path> = chain.iter().map(PathBuf::as_path).collect();
    let (status, out) = audit_verify(&files, None);
    assert_eq!(status, 0, "{out}");
}

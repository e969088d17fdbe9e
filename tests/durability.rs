//! Durable means fsync'd (SPEC 12): the real binary runs under strace, which records every fsync and
//! fdatasync with the thread, the file it targets and when it started and ended. For each acknowledged
//! write the test checks that the store's writer synced the write-ahead log exactly once between the
//! request and its response — and, for a claimed call, once between the request and the forward (the
//! claim) and once between the forward and the response (the answer): one sync per phase, never zero.
//! A log that restarts after a checkpoint also syncs its new header before the commit; that sync is
//! told apart (strace records the header's write too) and is not counted as the phase's.

mod common;

use std::path::Path;

use common::{now_us, Gateway, Keys};
use reqwest::Method;
use serde_json::json;

/// One traced sync: the thread, the file, when it ran (Unix microseconds), and whether it synced the
/// header of a restarted write-ahead log rather than a commit.
#[derive(Debug)]
struct Sync {
    tid: String,
    path: String,
    start_us: u64,
    end_us: u64,
    header: bool,
}

/// Parses `strace -f -ttt -T -y -s 0` lines such as
/// `123 1796102408.079442 fdatasync(3</data/db>) = 0 <0.000337>`. A call interrupted by another thread's
/// line is split in two, joined here by pid: the `unfinished` line holds its start, the `resumed` line its
/// end (a line's time is when strace printed it, so a resumed line's time is already the call's end).
/// SQLite writes a log's 32-byte header at offset 0 when the log restarts after a checkpoint, and syncs it
/// before the commit's frames: that sync is marked `header`.
fn parse_trace(text: &str) -> Vec<Sync> {
    let mut unfinished: std::collections::HashMap<&str, (u64, String, bool)> = Default::default();
    let mut header_written: std::collections::HashMap<&str, String> = Default::default();
    let mut syncs = Vec::new();
    for line in text.lines() {
        // strace pads the pid column, so fields are split on runs of spaces.
        let Some((pid, tail)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Some((at, rest)) = tail.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(at) = at.parse::<f64>() else { continue };
        let at_us = (at * 1e6) as u64;
        let path = rest
            .split_once('<')
            .and_then(|(_, tail)| tail.split_once('>'))
            .map(|(path, _)| path.to_string());
        let succeeded = rest.contains(") = 0 <");
        if rest.starts_with("pwrite64(") {
            if rest.contains("\"\"..., 32, 0") {
                header_written.insert(pid, path.unwrap_or_default());
            }
        } else if rest.starts_with("fdatasync(") || rest.starts_with("fsync(") {
            let Some(path) = path else { continue };
            let header = header_written.remove(pid).is_some_and(|wal| wal == path);
            if rest.ends_with("<unfinished ...>") {
                unfinished.insert(pid, (at_us, path, header));
            } else if succeeded {
                let duration_us = rest
                    .rsplit_once('<')
                    .and_then(|(_, tail)| tail.trim_end_matches('>').parse::<f64>().ok())
                    .map_or(0, |secs| (secs * 1e6) as u64);
                syncs.push(Sync {
                    tid: pid.to_string(),
                    path,
                    start_us: at_us,
                    end_us: at_us + duration_us,
                    header,
                });
            }
        } else if rest.starts_with("<... fdatasync resumed>")
            || rest.starts_with("<... fsync resumed>")
        {
            if let Some((start_us, path, header)) = unfinished.remove(pid) {
                if succeeded {
                    syncs.push(Sync {
                        tid: pid.to_string(),
                        path,
                        start_us,
                        end_us: at_us,
                        header,
                    });
                }
            }
        }
    }
    syncs
}

/// How many commit syncs of `file` by thread `tid` ran wholly between the two instants.
fn syncs_between(syncs: &[Sync], tid: &str, file: &Path, from_us: u64, to_us: u64) -> usize {
    let file = file.to_string_lossy();
    syncs
        .iter()
        .filter(|s| s.tid == tid && s.path == file && !s.header)
        .filter(|s| s.start_us >= from_us && s.end_us <= to_us)
        .count()
}

/// The id of the gateway's thread named `name`; the gateway runs as strace's child.
fn thread_named(strace_pid: u32, name: &str) -> String {
    let children =
        std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children"))
            .unwrap_or_default();
    let gateway = children
        .split_whitespace()
        .next()
        .expect("the gateway under strace");
    let tasks = std::fs::read_dir(format!("/proc/{gateway}/task")).unwrap();
    tasks
        .filter_map(|task| {
            let tid = task.ok()?.file_name().to_string_lossy().into_owned();
            let comm = std::fs::read_to_string(format!("/proc/{gateway}/task/{tid}/comm")).ok()?;
            (comm.trim() == name).then_some(tid)
        })
        .next()
        .unwrap_or_else(|| panic!("no thread {name} in the gateway"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_is_synced_before_its_response() {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let (tool, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(Keys::new());
    let config = common::write_config(&dir_path, &keys, &tool_base, "", "");
    let trace = dir_path.join("trace.txt");
    let wrapper = [
        "strace",
        "-f",
        "-ttt",
        "-T",
        "-y",
        "-e",
        "trace=fdatasync,fsync,pwrite64",
        "-s",
        "0",
        "-o",
        trace.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut gw = Gateway::spawn_under(wrapper, &dir_path, &config, keys);
    // SQLite in WAL mode: a commit is durable once the write-ahead log is synced.
    let store_log = dir_path.join("data/sealgate.db-wal");
    let writer = thread_named(gw.child.id(), "sg-store-writer");

    // A session registration, answered 201.
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let t0 = now_us();
    let (status, _) = gw
        .admin(
            Method::POST,
            "/v1/seal/sessions",
            Some(json!({"session_id": "exec-sync", "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                        "security_context": "test", "expires_at": sealgate::clock::now_secs() + 600})),
        )
        .await;
    let registered = (t0, now_us());
    assert_eq!(status, 201);
    let token = gw.keys.agent_token("exec-sync");

    // A claimed call (claim PENDING before the forward, COMMITTED before the reply).
    let t0 = now_us();
    let (status, body) = gw
        .call(
            &key,
            &token,
            common::tool_call(1, "tool.write", json!({"path": "/workspace/a"})),
        )
        .await;
    let claimed = (t0, now_us());
    assert_eq!(
        (status, body["receipt"]["claim"].as_str()),
        (200, Some("PROCEED")),
        "{body}"
    );
    let forwarded_at = tool.received_at_us.lock().unwrap()[0];

    // A call without a claim: one sync, before the reply.
    let t0 = now_us();
    let (status, body) = gw
        .call(&key, &token, common::tool_call(2, "tool.off", json!({})))
        .await;
    let unclaimed = (t0, now_us());
    assert_eq!(
        (status, body["receipt"]["claim"].as_str()),
        (200, Some("NONE")),
        "{body}"
    );

    // A refusal: its event, and the replay record, are durable before the answer.
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        common::tool_call(3, "tool.off", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    gw.post(&envelope).await;
    let t0 = now_us();
    let (status, body) = gw.post(&envelope).await;
    let replayed = (t0, now_us());
    assert_eq!((status, common::code(&body)), (401, 1008));

    // A revocation.
    let t0 = now_us();
    let (status, _) = gw
        .admin(Method::DELETE, "/v1/seal/sessions/exec-sync", None)
        .await;
    let revoked = (t0, now_us());
    assert_eq!(status, 200);

    // Stop the gateway and strace, so that the trace is complete.
    gw.kill();
    let syncs = parse_trace(&std::fs::read_to_string(&trace).unwrap());
    let count = |(from, to): (u64, u64)| syncs_between(&syncs, &writer, &store_log, from, to);
    for (what, window) in [
        ("session registration", registered),
        ("claimed call", claimed),
        ("unclaimed call", unclaimed),
        ("replay refusal", replayed),
        ("revocation", revoked),
    ] {
        assert!(
            count(window) >= 1,
            "{what}: no sync of the store between request and response {window:?} on the writer {writer}: {syncs:?}"
        );
    }
    for (what, window) in [
        ("unclaimed call", unclaimed),
        ("the claim, before the forward", (claimed.0, forwarded_at)),
        ("the answer, after the forward", (forwarded_at, claimed.1)),
    ] {
        assert_eq!(
            count(window),
            1,
            "{what}: one sync per phase {window:?} on the writer {writer}: {syncs:?}"
        );
    }
}

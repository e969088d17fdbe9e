//! Crash test (issue: durable claims): the real binary under concurrent retrying load against a counting
//! tool, killed with SIGKILL at random moments and restarted on the same data. Afterwards: no logical
//! action ran twice, every answer given as PROCEED or SKIP is still COMMITTED with the same content, every
//! action the tool ran is COMMITTED or PENDING (never lost), every PENDING is listed by the API, and the
//! audit file is one chain that holds the event of every answer given.
//!
//! The second run makes every fdatasync wait 30 ms first (strace's syscall injection), so that most kills
//! land between a batch's writes and its sync.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use common::Gateway;
use reqwest::Method;
use serde_json::{json, Value};

const KILLS: usize = 10;
const WORKERS: usize = 6;

/// Tiny deterministic generator for the kill moments (no extra dependency, reproducible runs).
struct Lcg(u64);

impl Lcg {
    fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        low + (self.0 >> 33) % (high - low)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_never_runs_an_action_twice_nor_loses_an_answer() {
    crash_under(Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_a_batch_write_and_its_sync_loses_nothing_acknowledged() {
    let slow_syncs = [
        "strace",
        "-f",
        "-o",
        "/dev/null",
        "-e",
        "trace=fsync,fdatasync",
        "-e",
        "inject=fsync,fdatasync:delay_enter=30000",
    ];
    crash_under(slow_syncs.map(String::from).to_vec()).await;
}

async fn crash_under(wrapper: Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(common::Keys::new());
    let config = common::write_config(dir.path(), &keys, &tool_base, "", "");
    let mut gw = Gateway::spawn_under(wrapper, dir.path(), &config, keys);
    let (key, token) = gw.session("exec-crash").await;
    let key = Arc::new(key);
    let base = Arc::new(RwLock::new(gw.base.clone()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let next_op = Arc::new(AtomicU64::new(0));
    let next_id = Arc::new(AtomicU64::new(0));
    // op → the answer the gateway returned for it (PROCEED or SKIP).
    let answered: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    // The audit event of every answer given.
    let acknowledged_events: Arc<Mutex<Vec<String>>> = Arc::default();

    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (key, token, base, client, stop) = (
            key.clone(),
            token.clone(),
            base.clone(),
            client.clone(),
            stop.clone(),
        );
        let (sent, next_op, next_id, answered, acknowledged_events) = (
            sent.clone(),
            next_op.clone(),
            next_id.clone(),
            answered.clone(),
            acknowledged_events.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let op = format!("op-{}", next_op.fetch_add(1, Ordering::SeqCst));
                // Retry each logical action a few times, as an agent would after errors.
                for _attempt in 0..4 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    let payload = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                        "name": "tool.write", "arguments": {"path": format!("/workspace/{op}"), "op": op},
                        "_meta": {"idempotency_key": op}}});
                    let envelope = sealgate::envelope::sign_envelope(&key, payload, &token, sealgate::clock::now_secs());
                    let url = format!("{}/v1/invoke", base.read().unwrap());
                    sent.fetch_add(1, Ordering::SeqCst);
                    let Ok(response) = client.post(url).json(&envelope).send().await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    let Ok(body) = response.json::<Value>().await else { continue };
                    if body["status"] == "success" {
                        let claim = body["receipt"]["claim"].as_str().unwrap_or_default();
                        assert!(claim == "PROCEED" || claim == "SKIP", "{body}");
                        let result = body["payload"]["result"].clone();
                        let mut answered = answered.lock().unwrap();
                        if let Some(earlier) = answered.get(&op) {
                            assert_eq!(earlier, &result, "a SKIP returned another answer than the PROCEED");
                        }
                        answered.insert(op.clone(), result);
                        let event_id = body["receipt"]["event_id"].as_str().unwrap_or_default();
                        acknowledged_events.lock().unwrap().push(event_id.to_string());
                        break;
                    }
                    if body["error"]["code"] == 4001 {
                        break;
                    }
                }
            }
        }));
    }

    let mut moments = Lcg(0x5ea1_9a7e);
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(moments.next_ms(80, 400))).await;
        // SIGKILL, then start again on the same data dir (blocking: it waits for the ready line).
        tokio::task::block_in_place(|| gw.restart());
        *base.write().unwrap() = gw.base.clone();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }

    // One chain in the store, holding every event whose response was sent; the audit file is a copy
    // that holds it too once it has caught up.
    let export = gw.export().await;
    let file_text = gw.audit_file().await;
    for chain in [&export, &file_text] {
        let report = sealgate::audit::verify_chain(std::io::Cursor::new(chain.as_bytes()));
        assert!(report.is_ok(), "the chain does not verify: {report:?}");
        for event_id in acknowledged_events.lock().unwrap().iter() {
            assert!(
                chain.contains(&format!("\"event_id\":\"{event_id}\"")),
                "event {event_id} was acknowledged but is not in the chain"
            );
        }
    }

    let executions = tool.ops.lock().unwrap().clone();
    let answered = answered.lock().unwrap().clone();
    let duplicates = executions.values().filter(|&&n| n > 1).count();
    let (status, pending_page) = gw
        .admin(Method::GET, "/v1/claims?status=PENDING&limit=1000", None)
        .await;
    assert_eq!(status, 200);
    let listed: Vec<String> = pending_page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["request_id"].as_str().unwrap().to_string())
        .collect();
    println!(
        "crash test: calls sent {}, tool executions {}, duplicates {duplicates}, kills {KILLS}, pendings {}, answered actions {}",
        sent.load(Ordering::SeqCst),
        executions.values().sum::<u64>(),
        listed.len(),
        answered.len()
    );
    assert_eq!(duplicates, 0, "an action ran twice: {executions:?}");
    assert!(
        answered.len() > KILLS,
        "the load made too little progress to mean anything"
    );

    for (op, result) in &answered {
        let request_id = sealgate::claim::request_id_for_key("agent-1", op);
        let (status, claim) = gw
            .admin(Method::GET, &format!("/v1/claims/{request_id}"), None)
            .await;
        assert_eq!(status, 200, "{op}: an acknowledged answer was lost");
        assert_eq!(claim["status"], "COMMITTED", "{op}: {claim}");
        assert_eq!(
            &claim["result"]["result"], result,
            "{op}: stored answer differs from the one returned"
        );
    }
    for op in executions.keys() {
        let request_id = sealgate::claim::request_id_for_key("agent-1", op);
        let (status, claim) = gw
            .admin(Method::GET, &format!("/v1/claims/{request_id}"), None)
            .await;
        assert_eq!(
            status, 200,
            "{op} ran but its claim is gone: a retry could run it again"
        );
        match claim["status"].as_str() {
            Some("COMMITTED") => {}
            Some("PENDING") => {
                assert!(listed.contains(&request_id), "{op}: PENDING but not listed")
            }
            other => panic!("{op}: unexpected claim status {other:?}"),
        }
    }
}

//! The Quickstart page (docs/quickstart.md), followed word for word, so that it cannot rot: from nothing to a
//! signed call over TLS, a call held for approval whose webhook the receiver verifies, traces received, and
//! the audit trail verified.
//!
//! How the page is read: the conventions of tests/common/page.rs. Its `sh setup` blocks are the build and
//! the venv with `standardwebhooks` (pinned as in scripts/test.sh); its fixed ports are `PAGE_PORTS`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::page::{self, json_lines, BUILD};
use serde_json::Value;

const PAGE: &str = include_str!("../docs/quickstart.md");

/// The ports the page names: the gateway, the tool, the webhook receiver, the trace collector.
const PAGE_PORTS: [&str; 4] = ["8089", "8090", "8091", "4318"];

/// The page takes seconds (its longest wait is one trace export interval, 5 s); this bounds a page that
/// hangs in one of its wait loops.
const PAGE_DEADLINE: Duration = Duration::from_secs(180);

/// The seal/v1 answers that `sealgate invoke` printed, in order.
fn answers(printed: &str) -> Vec<Value> {
    json_lines(printed)
        .filter(|value| value["protocol"] == "seal/v1")
        .collect()
}

/// The spans the trace collector printed (`trace ID span NAME`), by trace id.
fn traces(printed: &str) -> BTreeMap<String, Vec<String>> {
    let mut traces: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in printed.lines() {
        let Some(rest) = line.strip_prefix("trace ") else {
            continue;
        };
        let (id, name) = rest.split_once(" span ").expect("trace ID span NAME");
        assert_eq!(id.len(), 32, "a trace id is 16 bytes: {line}");
        traces
            .entry(id.to_owned())
            .or_default()
            .push(name.to_owned());
    }
    traces
}

/// What the files of the user's working folder hold, for a failure message.
fn work_files(dir: &Path) -> String {
    let mut text = String::new();
    let folders = std::fs::read_dir(dir).unwrap().flatten();
    for folder in folders.filter(|entry| entry.path().is_dir()) {
        for name in ["sealgate.log", "tool.log", "webhook.log", "traces.log"] {
            let path: PathBuf = folder.path().join(name);
            if let Ok(content) = std::fs::read_to_string(&path) {
                text.push_str(&format!("--- {}\n{content}", path.display()));
            }
        }
    }
    text
}

#[test]
fn the_quickstart_page_runs_word_for_word() {
    let blocks = page::fenced_blocks(PAGE);
    let venv = page::venv_setup("standardwebhooks", "standardwebhooks==1.1.0");
    let venv: Vec<&str> = venv.iter().map(String::as_str).collect();
    page::check_blocks(&blocks, &[&BUILD, &venv], &["text"]);
    for port in PAGE_PORTS {
        assert!(PAGE.contains(port), "the page no longer uses port {port}");
    }
    let ports = page::free_ports(&PAGE_PORTS);
    let (script, last) = page::page_script("quickstart", &blocks, &ports);
    let dir = tempfile::tempdir().unwrap();
    let path = page::user_path(&common::standardwebhooks_python());
    let (status, printed) = page::run_page(dir.path(), &script, &path, PAGE_DEADLINE);
    assert!(
        status.success() && printed.contains(&last),
        "the page failed ({status}) after the last `quickstart: block N ran`:\n{printed}\n{}",
        work_files(dir.path())
    );

    // Step 9, then step 10 before and after the grant: PROCEED, APPROVAL_REQUIRED, PROCEED.
    let answers = answers(&printed);
    assert_eq!(answers.len(), 3, "{printed}");
    let (quote, held, refund) = (&answers[0], &answers[1], &answers[2]);
    for (answer, tool) in [(quote, "billing.quote"), (refund, "billing.refund")] {
        assert_eq!(answer["status"], "success", "{answer}");
        assert_eq!(answer["receipt"]["claim"], "PROCEED", "{answer}");
        assert_eq!(answer["receipt"]["tool"], tool, "{answer}");
    }
    assert_eq!(held["error"]["code"], 4003, "{held}");
    let approval_id = held["error"]["details"]["approval_id"].as_str().unwrap();

    // The receiver verified the delivery's signature, and the operator granted what it announced.
    let verified =
        format!("webhook verified: billing.refund by agent-7 waits for approval {approval_id}");
    assert!(printed.lines().any(|l| l == verified), "{printed}");
    let granted = json_lines(&printed)
        .any(|record| record["approval_id"] == approval_id && record["status"] == "granted");
    assert!(granted, "{printed}");
    // The tool ran the refund once: after the grant.
    let tool_runs = printed
        .lines()
        .filter(|l| l.starts_with("refund ") && l.ends_with(": done"))
        .count();
    assert_eq!(tool_runs, 1, "{printed}");

    // The held call's trace, as the collector decoded it: the trace id of its error body, each phase it
    // reached, and no forward.
    let traces = traces(&printed);
    let held_trace = held["error"]["trace_id"].as_str().unwrap();
    let spans = traces
        .get(held_trace)
        .unwrap_or_else(|| panic!("{printed}"));
    for name in ["verify", "decide", "claim", "settle", "POST /v1/invoke"] {
        assert!(spans.iter().any(|s| s == name), "{name}: {spans:?}");
    }
    assert!(!spans.iter().any(|s| s == "forward"), "{spans:?}");

    // The audit trail, with the checkpoint of the clean stop.
    assert!(printed.contains("chain intact"), "{printed}");
    assert!(printed.contains("checkpoints verified"), "{printed}");
}

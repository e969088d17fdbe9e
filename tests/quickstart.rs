//! The Quickstart page (docs/quickstart.md), followed word for word, so that it cannot rot: from nothing to a
//! signed call over TLS, a call held for approval whose webhook the receiver verifies, traces received, and
//! the audit trail verified.
//!
//! How the page is read (the conventions the page keeps):
//! - Every fenced block whose info string is exactly `sh` is run. All of them run in page order as ONE
//!   `bash -euo pipefail` script, as a user pastes them into one terminal: variables, the working folder
//!   and the background processes (`&`) carry from block to block. The page writes its files itself, with
//!   heredocs in those blocks; `text` blocks show output and are not run.
//! - A `sh setup` block prepares the machine and is not run; the test does its work instead, and checks
//!   that the block still asks for exactly that work:
//!   - the build (`cargo build --release`, then the release folder first on PATH): the debug binary that
//!     cargo built for this test, `env!("CARGO_BIN_EXE_sealgate")`, has its folder first on PATH;
//!   - the venv with `standardwebhooks` (pinned as in scripts/test.sh): the venv that scripts/test.sh makes
//!     has its `bin` first on PATH, so the page's `python3` is that venv's, as after `activate`.
//! - The one change made to the page's text: each of its fixed ports (`PAGE_PORTS`) becomes a free port.
//! - TMPDIR is the test's temporary folder, so the page's `cd "$(mktemp -d)"` stays inside it.
//!
//! The script runs in a process group of its own, which is killed at the end whatever happened; the test
//! waits for the script's exit (bounded by `PAGE_DEADLINE`), never for a fixed time.

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const PAGE: &str = include_str!("../docs/quickstart.md");
const TEST_SCRIPT: &str = include_str!("../scripts/test.sh");

/// The ports the page names: the gateway, the tool, the webhook receiver, the trace collector.
const PAGE_PORTS: [&str; 4] = ["8089", "8090", "8091", "4318"];

/// The page takes seconds (its longest wait is one trace export interval, 5 s); this bounds a page that
/// hangs in one of its wait loops.
const PAGE_DEADLINE: Duration = Duration::from_secs(180);

/// The work of the page's `sh setup` blocks, as the test does it.
const BUILD: [&str; 2] = [
    "cargo build --release",
    "export PATH=\"$PWD/target/release:$PATH\"",
];
const VENV: [&str; 3] = [
    "python3 -m venv .venv",
    ". .venv/bin/activate",
    "pip install standardwebhooks==1.1.0",
];

/// One fenced block of the page: its info string and its text.
struct Block {
    info: String,
    text: String,
}

fn fenced_blocks(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for line in page.lines() {
        match (open.as_mut(), line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_owned(),
                    text: String::new(),
                })
            }
            (Some(_), Some("")) => blocks.extend(open.take()),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fenced block of the page is not closed");
    blocks
}

/// The lines of a block, without blank ones.
fn lines(block: &Block) -> Vec<&str> {
    block
        .text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Free loopback ports, one per page port, all different (each is held until all are chosen).
fn free_ports() -> BTreeMap<&'static str, String> {
    let listeners: Vec<_> = PAGE_PORTS
        .iter()
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    PAGE_PORTS
        .iter()
        .zip(&listeners)
        .map(|(page, l)| (*page, l.local_addr().unwrap().port().to_string()))
        .collect()
}

/// Replaces every number of the text that is a page port by its free port, in one pass (so a free port
/// that happens to equal another page port is never replaced again).
fn with_ports(text: &str, ports: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..start]);
        let digits = &rest[start..];
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        let number = &digits[..end];
        out.push_str(ports.get(number).map_or(number, String::as_str));
        rest = &digits[end..];
    }
    out.push_str(rest);
    out
}

/// The page's `sh` blocks as one script; after each block it prints `quickstart: block N ran`.
fn page_script(blocks: &[Block], ports: &BTreeMap<&str, String>) -> (String, usize) {
    let runnable: Vec<&Block> = blocks.iter().filter(|b| b.info == "sh").collect();
    let mut script = String::new();
    for (n, block) in runnable.iter().enumerate() {
        script.push_str(&with_ports(&block.text, ports));
        script.push_str(&format!("echo 'quickstart: block {} ran'\n", n + 1));
    }
    (script, runnable.len())
}

/// Checks that the `sh setup` blocks are the build and the venv, which the test replaces.
fn check_setup_blocks(blocks: &[Block]) {
    let setup: Vec<Vec<&str>> = blocks
        .iter()
        .filter(|b| b.info == "sh setup")
        .map(lines)
        .collect();
    assert_eq!(
        setup,
        vec![BUILD.to_vec(), VENV.to_vec()],
        "the page's setup blocks changed: make this test do their work"
    );
    assert!(
        TEST_SCRIPT.contains("python_tools standardwebhooks standardwebhooks==1.1.0"),
        "the page pins another standardwebhooks than scripts/test.sh installs for this test"
    );
    for block in blocks {
        assert!(
            matches!(block.info.as_str(), "sh" | "sh setup" | "text"),
            "block `{}` follows no convention of this test",
            block.info
        );
    }
}

/// Kills the script's process group (its background jobs included) when dropped.
struct ProcessGroup(u32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

/// The PATH a user has after the setup blocks.
fn user_path() -> String {
    let binary_dir = Path::new(env!("CARGO_BIN_EXE_sealgate")).parent().unwrap();
    let python = common::standardwebhooks_python();
    let venv_dir = python.parent().unwrap();
    let mut dirs = vec![binary_dir.to_path_buf(), venv_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap().into_string().unwrap()
}

/// Runs the script in `dir` like a fresh terminal (no SEALGATE_* or OTEL_* settings of this process);
/// returns how it exited and everything it printed.
fn run_page(dir: &Path, script: &str) -> (ExitStatus, String) {
    std::fs::write(dir.join("quickstart.sh"), script).unwrap();
    let output = dir.join("terminal.txt");
    let terminal = std::fs::File::create(&output).unwrap();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "quickstart.sh"])
        .current_dir(dir)
        .env("PATH", user_path())
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(terminal.try_clone().unwrap())
        .stderr(terminal)
        .process_group(0);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("SEALGATE_") || name.starts_with("OTEL_") {
            command.env_remove(name.as_ref());
        }
    }
    let mut child = command.spawn().expect("bash runs");
    let _group = ProcessGroup(child.id());
    // The background jobs keep the output file open, so the test waits for bash itself.
    let (done, exited) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait().unwrap()));
    let status = exited.recv_timeout(PAGE_DEADLINE);
    let printed = std::fs::read_to_string(&output).unwrap();
    let status = status
        .unwrap_or_else(|_| panic!("the page still runs after {PAGE_DEADLINE:?}:\n{printed}"));
    (status, printed)
}

/// The lines printed that are JSON documents (the answers of `sealgate invoke` and of curl).
fn json_lines(printed: &str) -> impl Iterator<Item = Value> + '_ {
    printed
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
}

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
    let blocks = fenced_blocks(PAGE);
    check_setup_blocks(&blocks);
    let ports = free_ports();
    for port in PAGE_PORTS {
        assert!(PAGE.contains(port), "the page no longer uses port {port}");
    }
    let (script, count) = page_script(&blocks, &ports);
    let dir = tempfile::tempdir().unwrap();
    let (status, printed) = run_page(dir.path(), &script);
    let last = format!("quickstart: block {count} ran");
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

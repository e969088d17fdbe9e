//! A page of the manual, followed word for word (tests/quickstart.rs, the connect page in
//! tests/connect.rs), so that it cannot rot.
//!
//! How a page is read (the conventions its pages keep):
//! - Every fenced block whose info string is exactly `sh` is run. All of them run in page order as ONE
//!   `bash -euo pipefail` script, as a user pastes them into one terminal: variables, the working folder
//!   and the background processes (`&`) carry from block to block. The page writes its files itself, with
//!   heredocs in those blocks; blocks of other kinds (`text`, `json`, `sh example` for a command that the
//!   page shows but cannot run, …) are shown and not run.
//! - A `sh setup` block prepares the machine and is not run; the test does its work instead (the build:
//!   the debug binary that cargo built for the test has its folder first on PATH; a venv: the one that
//!   scripts/test.sh makes has its `bin` next), and checks that the block still asks for exactly that work.
//! - The one change made to the page's text: each of its fixed ports becomes a free port.
//! - TMPDIR is the test's temporary folder, so the page's `cd "$(mktemp -d)"` stays inside it.
//!
//! The script runs in a process group of its own, which is killed at the end whatever happened; the test
//! waits for the script's exit (bounded by a deadline), never for a fixed time.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// The work of a `sh setup` block that builds sealgate and puts it on PATH.
pub const BUILD: [&str; 2] = [
    "cargo build --release",
    "export PATH=\"$PWD/target/release:$PATH\"",
];

/// One fenced block of the page: its info string and its text.
pub struct Block {
    pub info: String,
    pub text: String,
}

pub fn fenced_blocks(page: &str) -> Vec<Block> {
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
pub fn lines(block: &Block) -> Vec<&str> {
    block
        .text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Checks that the page's `sh setup` blocks ask for exactly `setup` (the work the test does instead),
/// and that every other block is `sh` or one of the kinds in `shown`.
pub fn check_blocks(blocks: &[Block], setup: &[&[&str]], shown: &[&str]) {
    let asked: Vec<Vec<&str>> = blocks
        .iter()
        .filter(|b| b.info == "sh setup")
        .map(lines)
        .collect();
    let done: Vec<Vec<&str>> = setup.iter().map(|work| work.to_vec()).collect();
    assert_eq!(
        asked, done,
        "the page's setup blocks changed: make this test do their work"
    );
    for block in blocks {
        assert!(
            matches!(block.info.as_str(), "sh" | "sh setup")
                || shown.contains(&block.info.as_str()),
            "block `{}` follows no convention of this test",
            block.info
        );
    }
}

/// The work of a `sh setup` block that makes a venv with `requirement` and activates it; checks that
/// scripts/test.sh pins the same for the venv `target/venvs/VENV` that the test uses instead.
pub fn venv_setup(venv: &str, requirement: &str) -> [String; 3] {
    let script = include_str!("../../scripts/test.sh");
    assert!(
        script.contains(&format!("python_tools {venv} {requirement}")),
        "the page pins another {requirement} than scripts/test.sh installs for this test"
    );
    [
        "python3 -m venv .venv".to_owned(),
        ". .venv/bin/activate".to_owned(),
        format!("pip install {requirement}"),
    ]
}

/// Free loopback ports, one per page port, all different (each is held until all are chosen).
pub fn free_ports(page_ports: &[&'static str]) -> BTreeMap<&'static str, String> {
    let listeners: Vec<_> = page_ports
        .iter()
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    page_ports
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

/// The page's `sh` blocks as one script; after each block it prints `NAME: block N ran`. Also returns
/// that line of the last block.
pub fn page_script(
    name: &str,
    blocks: &[Block],
    ports: &BTreeMap<&str, String>,
) -> (String, String) {
    let runnable: Vec<&Block> = blocks.iter().filter(|b| b.info == "sh").collect();
    let mut script = String::new();
    for (n, block) in runnable.iter().enumerate() {
        script.push_str(&with_ports(&block.text, ports));
        script.push_str(&format!("echo '{name}: block {} ran'\n", n + 1));
    }
    let last = format!("{name}: block {} ran", runnable.len());
    (script, last)
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

/// The PATH a user has after the setup blocks: the test's sealgate first, then the venv of `python`.
pub fn user_path(python: &Path) -> String {
    let binary_dir = Path::new(env!("CARGO_BIN_EXE_sealgate")).parent().unwrap();
    let venv_dir = python.parent().unwrap();
    let mut dirs = vec![binary_dir.to_path_buf(), venv_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap().into_string().unwrap()
}

/// Runs the script in `dir` like a fresh terminal (no SEALGATE_* or OTEL_* settings of this process),
/// for at most `deadline`; returns how it exited and everything it printed.
pub fn run_page(dir: &Path, script: &str, path: &str, deadline: Duration) -> (ExitStatus, String) {
    std::fs::write(dir.join("page.sh"), script).unwrap();
    let output = dir.join("terminal.txt");
    let terminal = std::fs::File::create(&output).unwrap();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "page.sh"])
        .current_dir(dir)
        .env("PATH", path)
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
    let status = exited.recv_timeout(deadline);
    let printed = std::fs::read_to_string(&output).unwrap();
    let status =
        status.unwrap_or_else(|_| panic!("the page still runs after {deadline:?}:\n{printed}"));
    (status, printed)
}

/// The lines printed that are JSON documents (the answers of `sealgate invoke` and of curl).
pub fn json_lines(printed: &str) -> impl Iterator<Item = Value> + '_ {
    printed
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
}

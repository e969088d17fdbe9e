//! The `mcp` upstream kind against real MCP servers: the reference filesystem server over stdio and
//! the reference "everything" server over Streamable HTTP. Both come from the npm packages pinned
//! in tests/mcp-servers/package.json (`npm ci --prefix tests/mcp-servers`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use common::mcp::{free_port, server_script, start_everything};
use sealgate::upstream::{UpstreamConfig, UpstreamError, Upstreams};
use serde_json::{json, Map, Value};

/// Logs of the gateway side, shown for a failing test when RUST_LOG is set.
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn upstreams(entries: Value) -> Upstreams {
    init_logs();
    let cfg: BTreeMap<String, UpstreamConfig> = serde_json::from_value(entries).unwrap();
    Upstreams::new(&cfg).unwrap()
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The text of the first content block of a tool result.
fn first_text(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("")
}

/// Live processes whose command line holds `needle` as one argument (zombies have none).
fn pids_with_argument(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == needle.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// Whether any thread of the process still runs. A process's files (its pipes) are closed only
/// when its last thread has exited, so the main thread's state alone says too little.
fn is_running(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        !matches!(state, Some('Z') | Some('X') | None)
    })
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_server_over_stdio() {
    let script = server_script("server-filesystem");
    let dir = tempfile::tempdir().unwrap();
    // The server compares real paths, and the temp dir may sit behind a symlink.
    let root: PathBuf = dir.path().canonicalize().unwrap();
    let root_arg = root.to_string_lossy().into_owned();
    let upstreams = upstreams(json!({
        "fs": {"mcp": {"command": "node", "args": [script, root_arg]}, "timeout_ms": 20000}
    }));
    let file = root.join("note.txt");

    let response = upstreams
        .call(
            "fs.write_file",
            &json!(1),
            &args(json!({"path": file, "content": "written through sealgate"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(response["jsonrpc"], json!("2.0"));
    assert_eq!(response["id"], json!(1));
    assert_ne!(response["result"]["isError"], json!(true), "{response}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "written through sealgate"
    );

    let response = upstreams
        .call(
            "fs.read_text_file",
            &json!("read-1"),
            &args(json!({"path": file})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(response["id"], json!("read-1"));
    assert!(
        first_text(&response).contains("written through sealgate"),
        "{response}"
    );

    // A tool-level failure is an answer (committed like any other), not an upstream error.
    let response = upstreams
        .call(
            "fs.read_text_file",
            &json!(2),
            &args(json!({"path": "/etc/hostname"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(response["result"]["isError"], json!(true), "{response}");

    // The cap applies to the decoded result.
    let err = upstreams
        .call(
            "fs.read_text_file",
            &json!(3),
            &args(json!({"path": file})),
            None,
            Some(10),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, UpstreamError::TooLarge { limit: 10 }),
        "{err:?}"
    );

    let tools = upstreams.list_tools().await.tools;
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"fs.read_file"), "{names:?}");
    assert!(names.contains(&"fs.write_file"), "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("fs.")), "{names:?}");

    // Kill the child behind the gateway's back: the next call starts a new one.
    let first = pids_with_argument(&root_arg);
    assert_eq!(
        first.len(),
        1,
        "expected one filesystem server, found {first:?}"
    );
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_until("the killed server is gone", Duration::from_secs(10), || {
        !is_running(first[0])
    })
    .await;
    let response = upstreams
        .call(
            "fs.read_text_file",
            &json!(4),
            &args(json!({"path": file})),
            None,
            None,
        )
        .await
        .unwrap();
    assert!(
        first_text(&response).contains("written through sealgate"),
        "{response}"
    );
    let second = pids_with_argument(&root_arg);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);

    // Shutdown ends the child, and later calls are refused without starting a new one.
    upstreams.shutdown().await;
    wait_until(
        "the server is stopped by shutdown",
        Duration::from_secs(10),
        || !is_running(second[0]),
    )
    .await;
    let err = upstreams
        .call(
            "fs.read_text_file",
            &json!(5),
            &args(json!({"path": file})),
            None,
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable(_)), "{err:?}");
    assert!(pids_with_argument(&root_arg).is_empty());
}

#[tokio::test]
async fn a_stdio_tool_that_cannot_start_is_unavailable() {
    let upstreams = upstreams(json!({
        "ghost": {"mcp": {"command": "/nonexistent/sealgate-test-tool"}, "timeout_ms": 2000}
    }));
    let err = upstreams
        .call("ghost.x", &json!(1), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable(_)), "{err:?}");
    // Straight after a failed start the next attempt waits (backoff) and is refused at once.
    let started = Instant::now();
    let err = upstreams
        .call("ghost.x", &json!(2), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Unavailable(why) if why.contains("next attempt")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(400));
    assert!(upstreams.list_tools().await.tools.is_empty());
}

async fn stop(mut server: tokio::process::Child) {
    server.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_server_over_streamable_http() {
    let script = server_script("server-everything");
    let port = free_port();
    let server = start_everything(&script, port).await;
    let upstreams = upstreams(json!({
        "every": {"mcp": {"url": format!("http://127.0.0.1:{port}/mcp")}, "timeout_ms": 2500}
    }));

    let response = upstreams
        .call(
            "every.echo",
            &json!("e1"),
            &args(json!({"message": "hello"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(response["id"], json!("e1"));
    assert_eq!(first_text(&response), "Echo: hello");

    // An invalid call is answered by the server; it is the tool's answer, not a gateway failure.
    let response = upstreams
        .call(
            "every.echo",
            &json!("e2"),
            &args(json!({"message": 5})),
            None,
            None,
        )
        .await
        .unwrap();
    assert!(
        response["result"]["isError"] == json!(true) || response["error"]["code"].is_i64(),
        "{response}"
    );

    let names: Vec<String> = upstreams
        .list_tools()
        .await
        .tools
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    assert!(names.iter().any(|n| n == "every.echo"), "{names:?}");

    // A tool that runs longer than timeout_ms: Timeout, quickly, and the session survives it.
    let started = Instant::now();
    let err = upstreams
        .call(
            "every.trigger-long-running-operation",
            &json!("t"),
            &args(json!({"duration": 10, "steps": 5})),
            None,
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Timeout(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let response = upstreams
        .call(
            "every.echo",
            &json!("e3"),
            &args(json!({"message": "still here"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(first_text(&response), "Echo: still here");

    // The server restarts on the same port and forgets the session: the gateway re-initialises.
    stop(server).await;
    let server = start_everything(&script, port).await;
    let response = upstreams
        .call(
            "every.echo",
            &json!("e4"),
            &args(json!({"message": "after restart"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(response["id"], json!("e4"));
    assert_eq!(first_text(&response), "Echo: after restart");

    // Nobody listens any more: nothing can be sent.
    stop(server).await;
    let err = upstreams
        .call(
            "every.echo",
            &json!("e5"),
            &args(json!({"message": "anyone?"})),
            None,
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable(_)), "{err:?}");
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_tool_sees_only_its_configured_environment_and_dies_with_the_gateway() {
    let script = server_script("server-everything");
    // Cargo sets CARGO_MANIFEST_DIR for the test process; it stands for the gateway's own
    // variables (credentials of other upstreams) that a tool must not inherit.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    // The server ignores arguments after the transport name; this one lets the test find it.
    let marker = format!("sealgate-env-test-{}", std::process::id());
    let upstreams = upstreams(json!({
        "every": {"mcp": {"command": "node", "args": [script, "stdio", marker],
                          "env": {"SEALGATE_TOOL_SETTING": "configured"}},
                  "timeout_ms": 20000}
    }));
    let response = upstreams
        .call("every.get-env", &json!(1), &Map::new(), None, None)
        .await
        .unwrap();
    let env: Value = serde_json::from_str(first_text(&response)).unwrap();
    assert_eq!(env["SEALGATE_TOOL_SETTING"], json!("configured"));
    assert!(
        env["PATH"].is_string(),
        "PATH is passed on so that tools can run programs"
    );
    assert!(env.get("CARGO_MANIFEST_DIR").is_none(), "{env}");

    // Dropping the upstreams (without shutdown) ends the child too.
    let pids = pids_with_argument(&marker);
    assert_eq!(pids.len(), 1, "{pids:?}");
    drop(upstreams);
    wait_until(
        "the dropped gateway's tool is gone",
        Duration::from_secs(10),
        || !is_running(pids[0]),
    )
    .await;
}

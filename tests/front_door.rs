//! The HTTP front door through the real binary (SPEC 3 r3, 11 r3): a call whose client hangs up still runs
//! to its end, and clients that trickle bodies or never read their answers cannot stop the agent path.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{code, tool_call, until, Gateway};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `host:port` of a gateway's base URL.
fn address(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

/// The raw HTTP/1.1 request of a signed call, as a client would write it on its own socket.
fn invoke_request(envelope: &Value) -> Vec<u8> {
    let body = serde_json::to_vec(envelope).unwrap();
    let mut request = format!(
        "POST /v1/invoke HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend(body);
    request
}

fn has_event(events: &[Value], kind: &str) -> bool {
    events.iter().any(|e| e["type"] == kind)
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_cancel_its_approved_claimed_call() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = json!({"capabilities": [
        {"tool_pattern": "second.*", "claim": "explicit", "approval": {"required": true}},
    ]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/hangup", Some(spec))
        .await;
    assert!(status == 200 || status == 201, "{body}");
    let (key, token) = gw.session_in("exec-hangup", "hangup").await;
    let keyed = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "second.pay", "arguments": {"cents": 5},
                          "_meta": {"idempotency_key": "pay-once"}}})
    };
    let (status, asked) = gw.call(&key, &token, keyed(1)).await;
    assert_eq!((status, code(&asked)), (403, 4003), "{asked}");
    let approval = asked["error"]["details"]["approval_id"].as_str().unwrap();
    let (status, granted) = gw
        .admin(
            Method::POST,
            &format!("/v1/approvals/{approval}/grant"),
            Some(json!({"reason": "ok"})),
        )
        .await;
    assert_eq!(status, 200, "{granted}");

    // The granted call is sent on a socket of its own, which closes while the tool holds the call.
    let envelope =
        sealgate::envelope::sign_envelope(&key, keyed(2), &token, sealgate::clock::now_secs());
    let mut client = std::net::TcpStream::connect(address(&gw)).unwrap();
    client.write_all(&invoke_request(&envelope)).unwrap();
    tool.until_held().await;
    drop(client);

    until(
        Duration::from_secs(10),
        "the abandoned call's ToolCallCompleted and ApprovalUsed",
        || async {
            let events = gw.audit_events("session_id=exec-hangup&limit=1000").await;
            has_event(&events, "ToolCallCompleted") && has_event(&events, "ApprovalUsed")
        },
    )
    .await;
    // Its claim was settled: a keyed retry gets the stored answer and the tool does not run again.
    let (status, again) = gw.call(&key, &token, keyed(3)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["receipt"]["claim"], "SKIP", "{again}");
    assert_eq!(tool.held.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The gateway's open descriptors (Linux `/proc`).
fn descriptors(gw: &Gateway) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", gw.child.id()))
        .unwrap()
        .count()
}

/// The gateway's soft open-file limit (Linux `/proc`).
fn soft_open_file_limit(gw: &Gateway) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", gw.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// A client that sent a request head and a little of its body, and then nothing.
async fn slow_body(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /v1/invoke HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"protocol\"")
        .await
        .unwrap();
    stream
}

/// A client that asks for many large answers at once and never reads them. Its small window and
/// segments keep the kernel from buffering megabytes of answers on loopback, so the gateway's writes stall.
fn non_reader(addr: &str) -> std::net::TcpStream {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.set_tcp_mss(536).unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stream = std::net::TcpStream::from(socket);
    // A static 27 kB file: large answers that cost the gateway next to nothing to make.
    let requests = "GET /console/pages.js HTTP/1.1\r\nHost: x\r\n\r\n".repeat(20);
    stream.write_all(requests.as_bytes()).unwrap();
    stream
}

#[tokio::test]
async fn slow_and_non_reading_clients_do_not_stop_the_agent_path() {
    let dir = tempfile::tempdir().unwrap();
    let (tool_state, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    let config = common::write_config(
        dir.path(),
        &keys,
        &tool_base,
        "",
        "limits: { max_connections: 900, max_concurrent_calls: 20, write_timeout_secs: 3, \
         body_read_timeout_secs: 30 }\nconsole: { enabled: true }\n",
    );
    // A soft limit of 256 descriptors, which start-up raises to the hard limit, 1024.
    let gw = Gateway::spawn_with(Vec::new(), dir.path(), &config, keys, |command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe and the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                use nix::sys::resource::{setrlimit, Resource};
                setrlimit(Resource::RLIMIT_NOFILE, 256, 1024).map_err(std::io::Error::from)
            });
        }
    });
    assert_eq!(soft_open_file_limit(&gw), 1024);
    let (key, token) = gw.session("exec-flood").await;
    let before = descriptors(&gw);

    let addr = address(&gw);
    let mut slow = Vec::new();
    for _ in 0..300 {
        slow.push(slow_body(&addr).await);
    }
    until(
        Duration::from_secs(30),
        "300 trickling bodies accepted",
        || async { descriptors(&gw) >= before + 300 },
    )
    .await;
    // One descriptor per connection (a second one per connection would run out of the soft limit).
    let open = descriptors(&gw);
    assert!(
        open <= before + 300 + 10,
        "{open} descriptors for 300 connections (from {before})"
    );
    let mut unread = Vec::new();
    for _ in 0..300 {
        unread.push(non_reader(&addr));
    }

    // Answered within a second, while 300 bodies trickle (more than max_concurrent_calls) and 300
    // clients leave their answers unread.
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let health = quick.get(format!("{}/healthz", gw.base)).send().await;
    assert_eq!(health.unwrap().status(), 200);
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "tool.off", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    let call = quick
        .post(format!("{}/v1/invoke", gw.base))
        .json(&envelope)
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 200, "{}", call.text().await.unwrap());
    assert_eq!(tool_state.count(), 1);
    // The clients that read nothing are cut off after write_timeout_secs; the trickling bodies remain.
    until(
        Duration::from_secs(30),
        "the non-reading clients closed",
        || async { descriptors(&gw) <= before + 300 + 10 },
    )
    .await;
    drop((slow, unread));
}

#[tokio::test]
async fn beyond_max_connections_a_new_connection_is_closed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "limits: { max_connections: 8 }\n").await;
    let addr = address(&gw);
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Accepted after the eight before it, and closed without a byte: not a 408 after the head timeout.
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let mut answer = Vec::new();
    extra.read_to_end(&mut answer).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&answer), "");
    // A connection that closes gives its place back.
    held.pop();
    until(
        Duration::from_secs(10),
        "/healthz once a place is free",
        || async {
            let health = gw.client.get(format!("{}/healthz", gw.base)).send().await;
            health.is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
}

#[tokio::test]
async fn a_kept_alive_connection_idles_past_the_head_timeout_and_closes_without_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(
        dir.path(),
        "limits: { header_read_timeout_secs: 1, idle_timeout_secs: 2 }\n",
    )
    .await;
    let mut stream = TcpStream::connect(address(&gw)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The answer, then nothing until the gateway closes the idle connection: the head timer (1 s)
    // would have answered 408 first.
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
}

/// A client that pipelines many unauthenticated requests on one connection and never reads an answer.
/// Its small window keeps the kernel from buffering the answers, so the gateway's writes stall.
fn pipelining_non_reader(addr: &str, requests: &'static str) -> tokio::task::JoinHandle<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    socket.connect(&addr.into()).unwrap();
    socket.set_nonblocking(true).unwrap();
    let mut stream = TcpStream::from_std(std::net::TcpStream::from(socket)).unwrap();
    tokio::spawn(async move {
        // Sends until the gateway stops reading; then holds the connection without reading.
        let _ = stream.write_all(requests.repeat(2000).as_bytes()).await;
        std::future::pending::<()>().await;
    })
}

/// SPEC 11 r3: answers a client does not take close its connection within `write_timeout_secs`, even when
/// they all fit in the kernel's send buffer and no write of the gateway ever stalls. Here they hold every
/// descriptor the gateway may open, and `/healthz` is answered again once the timeout has passed.
#[tokio::test]
async fn pipelined_answers_never_read_release_their_descriptors_within_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool_state, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    let config = common::write_config(
        dir.path(),
        &keys,
        &tool_base,
        "",
        "limits: { write_timeout_secs: 2 }\n",
    );
    // 200 descriptors and no more: fewer than the connections below.
    let gw = Gateway::spawn_with(Vec::new(), dir.path(), &config, keys, |command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe and the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                use nix::sys::resource::{setrlimit, Resource};
                setrlimit(Resource::RLIMIT_NOFILE, 200, 200).map_err(std::io::Error::from)
            });
        }
    });
    let before = descriptors(&gw);
    let addr = address(&gw);
    let clients: Vec<_> = (0..250)
        .map(|_| pipelining_non_reader(&addr, "GET /v1/audit HTTP/1.1\r\nHost: x\r\n\r\n"))
        .collect();
    until(
        Duration::from_secs(10),
        "the descriptors taken by the pipelining clients",
        || async { descriptors(&gw) >= 190 },
    )
    .await;

    // Accepted in turn as descriptors free up, each closed after write_timeout_secs (2 s): a few rounds.
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    until(Duration::from_secs(15), "/healthz answered", || async {
        let health = quick.get(format!("{}/healthz", gw.base)).send().await;
        health.is_ok_and(|r| r.status() == 200)
    })
    .await;
    until(
        Duration::from_secs(15),
        "the non-reading connections closed",
        || async { descriptors(&gw) <= before + 5 },
    )
    .await;
    for client in clients {
        client.abort();
    }
}

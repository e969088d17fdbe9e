//! The reference MCP servers pinned in tests/mcp-servers (`npm ci --prefix tests/mcp-servers`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const SERVERS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/mcp-servers/node_modules/@modelcontextprotocol"
);

/// The entry script of a pinned MCP server package; fails the test (never skips it) when missing.
pub fn server_script(package: &str) -> String {
    let path = Path::new(SERVERS).join(package).join("dist/index.js");
    assert!(
        path.is_file(),
        "the MCP test server {package} is not installed ({} is missing): run `npm ci --prefix tests/mcp-servers`",
        path.display()
    );
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|out| out.status.success()),
        "`node` is needed to run the MCP test servers and was not found on PATH"
    );
    path.to_string_lossy().into_owned()
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts the everything server in Streamable HTTP mode and waits until it accepts connections.
pub async fn start_everything(script: &str, port: u16) -> tokio::process::Child {
    let child = tokio::process::Command::new("node")
        .arg(script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the everything server did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child
}

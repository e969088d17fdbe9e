//! Shared black-box harness: starts the real `sealgate` binary on port 0 with a temporary configuration,
//! a counting JSON-RPC tool on loopback, and the keys that orchestrators, operators and agents hold.
#![allow(dead_code)]

pub mod dockerfile;
pub mod mcp;
pub mod mcp_hosts;
pub mod oidc;
pub mod page;
pub mod redirect;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use axum::routing::post;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

pub const TEST_POLICY: &str = r#"
name: test
description: The black-box tests' context.
deny_list: ["tool.forbidden", "secrets.*"]
capabilities:
  - tool_pattern: "tool.off"
    claim: off
  - tool_pattern: "tool.explicit"
    claim: explicit
  - tool_pattern: "tool.*"
    path_allowlist: ["/workspace"]
    claim: auto
  - tool_pattern: "limited.*"
    rate_limit: { calls: 2, per_seconds: 60 }
    claim: off
  - tool_pattern: "big.*"
    max_response_size: 64
    claim: auto
  - tool_pattern: "slow.*"
    claim: auto
  - tool_pattern: "second.*"
    claim: off
  - tool_pattern: "bad.*"
    claim: auto
  - tool_pattern: "down.*"
    claim: auto
  - tool_pattern: "noroute.*"
  - tool_pattern: "pay.*"
    claim: off
    approval: { required: true }
"#;

pub const OTHER_POLICY: &str = r#"
name: other
capabilities:
  - tool_pattern: "*"
"#;

/// The counting tool: every upstream of the test config points at one of its routes.
#[derive(Default)]
pub struct Tool {
    pub executions: AtomicU64,
    pub last_request: std::sync::Mutex<Option<Value>>,
    pub last_auth: std::sync::Mutex<Option<String>>,
    /// Executions per `op` argument, for exactly-once checks.
    pub ops: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// When each call reached the tool (Unix microseconds), to order it against the gateway's syncs.
    pub received_at_us: std::sync::Mutex<Vec<u64>>,
    /// Calls that reached `/second` (each is held there for a second): a test waits for this, not a sleep.
    pub held: AtomicU64,
}

/// Wall-clock Unix microseconds: the clock that strace's `-ttt` timestamps use.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Tool {
    /// Waits until a call is held at `/second`, so that it is surely in flight.
    pub async fn until_held(&self) {
        until(
            Duration::from_secs(10),
            "a call held at /second",
            || async { self.held.load(Ordering::SeqCst) > 0 },
        )
        .await;
    }

    pub fn count(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

async fn tool_rpc(
    axum::extract::State(tool): axum::extract::State<Arc<Tool>>,
    headers: axum::http::HeaderMap,
    axum::Json(request): axum::Json<Value>,
) -> axum::Json<Value> {
    tool.received_at_us.lock().unwrap().push(now_us());
    tool.executions.fetch_add(1, Ordering::SeqCst);
    *tool.last_auth.lock().unwrap() = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    *tool.last_request.lock().unwrap() = Some(request.clone());
    if let Some(op) = request["params"]["arguments"]["op"].as_str() {
        *tool.ops.lock().unwrap().entry(op.to_string()).or_default() += 1;
    }
    let id = request["id"].clone();
    // The answer the test asks for, as the whole `result` (tests/answer_guard.rs).
    if let Some(reply) = request["params"]["arguments"].get("reply") {
        return axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": reply}));
    }
    if request["params"]["name"] == "fail" {
        return axum::Json(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "tool failed"}}),
        );
    }
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": format!("ran {}", request["params"]["name"].as_str().unwrap_or(""))}],
        "echo": request["params"]["arguments"].clone(),
        "execution": tool.executions.load(Ordering::SeqCst),
    }}))
}

async fn tool_slow(
    axum::extract::State(tool): axum::extract::State<Arc<Tool>>,
) -> axum::Json<Value> {
    tool.executions.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    axum::Json(json!({"jsonrpc": "2.0", "id": 1, "result": {}}))
}

/// Answers after one second: long enough to be in flight when the gateway is told to stop.
async fn tool_second(
    axum::extract::State(tool): axum::extract::State<Arc<Tool>>,
    axum::Json(request): axum::Json<Value>,
) -> axum::Json<Value> {
    tool.held.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    axum::Json(
        json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": "late"}]}}),
    )
}

async fn tool_bad(axum::extract::State(tool): axum::extract::State<Arc<Tool>>) -> &'static str {
    tool.executions.fetch_add(1, Ordering::SeqCst);
    "this is not JSON-RPC"
}

async fn tool_big(
    axum::extract::State(tool): axum::extract::State<Arc<Tool>>,
    axum::Json(request): axum::Json<Value>,
) -> axum::Json<Value> {
    tool.executions.fetch_add(1, Ordering::SeqCst);
    axum::Json(
        json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": "x".repeat(4096)}]}}),
    )
}

/// Starts the counting tool on a free loopback port.
pub async fn start_tool() -> (Arc<Tool>, String) {
    let tool = Arc::new(Tool::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/rpc", post(tool_rpc))
        .route("/slow", post(tool_slow))
        .route("/bad", post(tool_bad))
        .route("/second", post(tool_second))
        .route("/big", post(tool_big))
        .with_state(tool.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (tool, format!("http://{addr}"))
}

pub struct Keys {
    pub operator_private: String,
    pub operator_public: String,
    pub agent_private: String,
    pub agent_public: String,
}

impl Keys {
    pub fn new() -> Keys {
        let (operator_private, operator_public) = sealgate::token::ed25519_keypair_pem().unwrap();
        let (agent_private, agent_public) = sealgate::token::ed25519_keypair_pem().unwrap();
        Keys {
            operator_private,
            operator_public,
            agent_private,
            agent_public,
        }
    }

    pub fn operator_token(&self, scope: &str) -> String {
        self.operator_token_as("test-operator", scope)
    }

    /// An operator token for the subject `sub`.
    pub fn operator_token_as(&self, sub: &str, scope: &str) -> String {
        let now = sealgate::clock::now_secs();
        sealgate::token::sign_eddsa_for_tests_and_cli(
            &self.operator_private,
            &json!({"sub": sub, "aud": "sealgate-operators", "scope": scope,
                    "iat": now, "exp": now + 600, "jti": uuid::Uuid::new_v4().to_string()}),
            None,
        )
        .unwrap()
    }

    pub fn agent_claims(&self, session: &str, scp: &str) -> Value {
        let now = sealgate::clock::now_secs();
        json!({"sub": "agent-1", "scp": scp, "exec_id": session, "jti": uuid::Uuid::new_v4().to_string(),
               "iat": now, "exp": now + 600, "iss": "orchestrator", "aud": "sealgate-agents"})
    }

    pub fn agent_token_from(&self, claims: &Value) -> String {
        sealgate::token::sign_eddsa_for_tests_and_cli(&self.agent_private, claims, None).unwrap()
    }

    pub fn agent_token(&self, session: &str) -> String {
        self.agent_token_from(&self.agent_claims(session, "test"))
    }
}

/// The running binary; killed when dropped.
pub struct Gateway {
    pub child: Child,
    /// Its standard error, when the start piped it (captured from the start: see [`Launched`]).
    pub stderr: Option<Lines>,
    /// The executable: this test build's, or the release build's ([`release_binary`]).
    pub binary: PathBuf,
    /// A command the binary runs under (strace), kept for restarts; empty for none.
    pub wrapper: Vec<String>,
    pub base: String,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub keys: Arc<Keys>,
    pub client: reqwest::Client,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes the test configuration; `extra_upstreams` are YAML lines added under `upstreams:`.
pub fn write_config(
    dir: &Path,
    keys: &Keys,
    tool_base: &str,
    extra_upstreams: &str,
    extra: &str,
) -> PathBuf {
    let agent_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.agent_public
    );
    let operator_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.operator_public
    );
    write_config_with_keys(
        dir,
        &agent_keys,
        &operator_keys,
        tool_base,
        extra_upstreams,
        extra,
    )
}

/// Like [`write_config`], with the `keys:` of `agent_tokens` and of `operator_auth` given as YAML.
pub fn write_config_with_keys(
    dir: &Path,
    agent_keys: &str,
    operator_keys: &str,
    tool_base: &str,
    extra_upstreams: &str,
    extra: &str,
) -> PathBuf {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/test.yaml"), TEST_POLICY).unwrap();
    std::fs::write(dir.join("policies/other.yaml"), OTHER_POLICY).unwrap();
    let store = store_line(extra);
    let postgres = !store.is_empty() || extra.contains("store: \"postgres");
    // On PostgreSQL a replica signs with a key it is given (SPEC 14); on the embedded store it makes one.
    let store = if postgres && !extra.contains("signing:") {
        format!(
            "{store}signing: {{ key_file: {:?} }}\n",
            signing_key_file(dir)
        )
    } else {
        store
    };
    let config = format!(
        r#"listen: "127.0.0.1:0"
{store}data_dir: data
policies_dir: policies
agent_tokens:
  issuer: orchestrator
  audience: sealgate-agents
  keys: {agent_keys}
operator_auth:
  keys: {operator_keys}
upstreams:
  tool: {{ http: {{ url: "{tool_base}/rpc" }}, timeout_ms: 2000, headers: {{ Authorization: "env:TEST_TOOL_CREDENTIAL" }} }}
  limited: {{ http: {{ url: "{tool_base}/rpc" }} }}
  slow: {{ http: {{ url: "{tool_base}/slow" }}, timeout_ms: 300 }}
  bad: {{ http: {{ url: "{tool_base}/bad" }} }}
  second: {{ http: {{ url: "{tool_base}/second" }}, timeout_ms: 5000 }}
  big: {{ http: {{ url: "{tool_base}/big" }} }}
  down: {{ http: {{ url: "http://127.0.0.1:1/rpc" }}, timeout_ms: 1000 }}
  pay: {{ http: {{ url: "{tool_base}/rpc" }} }}
{extra_upstreams}
audit: {{ file: audit.jsonl }}
{extra}"#
    );
    let path = dir.join("sealgate.yaml");
    std::fs::write(&path, config).unwrap();
    path
}

/// A fresh Ed25519 signing key in `dir/signing.key` (PKCS#8 PEM, mode 0600), as a replica is given one.
pub fn signing_key_file(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join("signing.key");
    if !path.exists() {
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let pem = sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        file.write_all(pem.as_bytes()).unwrap();
    }
    path
}

/// The public half of `dir/signing.key` (made when missing), as `dir/signing.pub.pem` (SPKI PEM).
pub fn signing_public_key_file(dir: &Path) -> PathBuf {
    let key = sealgate::envelope::read_signing_key_file(&signing_key_file(dir)).unwrap();
    let path = dir.join("signing.pub.pem");
    let pem = sealgate::envelope::public_key_pem(&key.verifying_key()).unwrap();
    std::fs::write(&path, pem).unwrap();
    path
}

/// The `signing:` line of replica `index` of `count`, each in `dir/r{i}`: its own key, and the other
/// replicas' public keys, which `/v1/keys` lists only because the configuration names them (SPEC 20
/// rule 6).
pub fn replica_signing(dir: &Path, count: usize, index: usize) -> String {
    let folder = |i: usize| {
        let folder = dir.join(format!("r{i}"));
        std::fs::create_dir_all(&folder).unwrap();
        folder
    };
    let others: Vec<PathBuf> = (0..count)
        .filter(|&i| i != index)
        .map(|i| signing_public_key_file(&folder(i)))
        .collect();
    format!(
        "signing: {{ key_file: {:?}, replica_public_keys: {others:?} }}\n",
        signing_key_file(&folder(index))
    )
}

/// `SEALGATE_TEST_STORE=postgres` runs the black-box suite on PostgreSQL (issue 11): a configuration that
/// names no store gets a fresh database of its own on the server of `SEALGATE_TEST_POSTGRES`. The database
/// outlives the test process (a gateway may be restarted on it); `scripts/test.sh` drops it after the run.
fn store_line(extra: &str) -> String {
    match std::env::var("SEALGATE_TEST_STORE").as_deref() {
        Err(_) | Ok("embedded") => return String::new(),
        Ok("postgres") => {}
        Ok(other) => panic!("SEALGATE_TEST_STORE is {other:?}; expected embedded or postgres"),
    }
    if extra.contains("store:") {
        return String::new();
    }
    let database = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(sealgate::store::testing::TestDatabase::create())
    })
    .join()
    .unwrap();
    let line = format!("store: {:?}\n", database.url);
    std::mem::forget(database);
    line
}

/// The release build of this checkout, built once per test process (into the crate's own target folder,
/// where `tests/dockerfile.rs` builds it too), for the tests that must run what users run.
pub fn release_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
            let output = Command::new(env!("CARGO"))
                .args(["build", "--release", "--locked", "--bin", "sealgate"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("CARGO_TARGET_DIR", target_dir)
                .output()
                .expect("cargo runs");
            assert!(
                output.status.success(),
                "the release build fails:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            target_dir.join("release/sealgate")
        })
        .clone()
}

/// Starts `sealgate serve` (`binary`, under `wrapper` when there is one) on `config_path`, the command
/// adjusted by `adjust` first (its environment, where stderr goes), and waits for its ready line.
pub fn launch_binary(
    binary: &Path,
    wrapper: &[String],
    config_path: &Path,
    adjust: impl FnOnce(&mut Command),
) -> Launched {
    launch_command(serve_command(binary, wrapper, config_path, adjust))
}

/// The `serve` command of [`launch_binary`], not started yet.
pub fn serve_command(
    binary: &Path,
    wrapper: &[String],
    config_path: &Path,
    adjust: impl FnOnce(&mut Command),
) -> Command {
    let mut command = match wrapper.split_first() {
        None => Command::new(binary),
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
    };
    command
        .args(["serve", "--config"])
        .arg(config_path)
        .env("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")
        .env("SEALGATE_LOG__LEVEL", "warn")
        .stderr(Stdio::inherit());
    adjust(&mut command);
    command
}

/// A started `sealgate serve`: the process, its base URL, and its standard error when the command piped it.
pub struct Launched {
    pub child: Child,
    pub base: String,
    /// Read from the moment the process starts: a start that logs more than a pipe holds (at `trace`) would
    /// otherwise block on its own standard error before its ready line.
    pub stderr: Option<Lines>,
}

/// How long a start may take before its ready line: far beyond any start seen, so reaching it means the
/// process is stuck, and the test fails with where its threads were instead of waiting for ever.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Starts a prepared `sealgate serve` command and waits for its ready line.
pub fn launch_command(command: Command) -> Launched {
    try_launch_command(command).unwrap_or_else(|failure| panic!("{failure}"))
}

/// Like [`launch_command`], with a start that ends before the ready line, or that prints none within
/// [`READY_WITHIN`], as an error.
pub fn try_launch_command(mut command: Command) -> Result<Launched, String> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sealgate");
    let stderr = child.stderr.take().map(Lines::capture);
    let ready = ready_line(child.stdout.take().unwrap());
    match ready.recv_timeout(READY_WITHIN) {
        Ok(Ok(base)) => Ok(Launched {
            child,
            base,
            stderr,
        }),
        Ok(Err(printed)) => {
            let status = child.wait();
            Err(format!(
                "sealgate exited before it was ready ({status:?}); its standard output: {printed:#?}"
            ))
        }
        Err(_) => {
            let threads = thread_stacks(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let logged = stderr.map(|lines| lines.lines()).unwrap_or_default();
            Err(format!(
                "sealgate printed no ready line within {READY_WITHIN:?}; its threads:\n{threads}\nits standard error: {logged:#?}"
            ))
        }
    }
}

/// Reads `stdout` on a thread of its own: sends the ready line's base URL, or every line printed when the
/// stream ends without one, and keeps draining so that the child never blocks on a full pipe.
fn ready_line(stdout: std::process::ChildStdout) -> mpsc::Receiver<Result<String, Vec<String>>> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let mut printed = Vec::new();
        for line in lines.by_ref() {
            if let Some(url) = ready_url(&line) {
                let _ = sender.send(Ok(url));
                lines.for_each(drop);
                return;
            }
            printed.push(line);
        }
        let _ = sender.send(Err(printed));
    });
    receiver
}

/// Every thread's stack of a stuck process, by gdb (on the machine image); what went wrong otherwise.
fn thread_stacks(pid: u32) -> String {
    match Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(e) => format!("(gdb could not run: {e})"),
    }
}

/// The base URL of a ready line: `sealgate ready on URL`, or with `log.format: json`
/// `{"message": "sealgate ready", "listen": URL, …}`.
pub fn ready_url(line: &str) -> Option<String> {
    if let Some(url) = line.strip_prefix("sealgate ready on ") {
        return Some(url.trim().to_string());
    }
    let object: Value = serde_json::from_str(line).ok()?;
    (object["message"] == "sealgate ready").then(|| object["listen"].as_str().map(str::to_owned))?
}

impl Gateway {
    pub fn spawn(dir: &Path, config_path: &Path, keys: Arc<Keys>) -> Gateway {
        Gateway::spawn_under(Vec::new(), dir, config_path, keys)
    }

    pub fn spawn_under(
        wrapper: Vec<String>,
        dir: &Path,
        config_path: &Path,
        keys: Arc<Keys>,
    ) -> Gateway {
        Gateway::spawn_with(wrapper, dir, config_path, keys, |_| {})
    }

    /// Like [`Gateway::spawn_under`], with the command adjusted first (see [`launch_binary`]); a restart
    /// does not repeat the adjustment.
    pub fn spawn_with(
        wrapper: Vec<String>,
        dir: &Path,
        config_path: &Path,
        keys: Arc<Keys>,
        adjust: impl FnOnce(&mut Command),
    ) -> Gateway {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_sealgate"));
        Gateway::spawn_binary(binary, wrapper, dir, config_path, keys, adjust)
    }

    /// Like [`Gateway::spawn_with`], for another executable of sealgate (the release build).
    pub fn spawn_binary(
        binary: PathBuf,
        wrapper: Vec<String>,
        dir: &Path,
        config_path: &Path,
        keys: Arc<Keys>,
        adjust: impl FnOnce(&mut Command),
    ) -> Gateway {
        let Launched {
            child,
            base,
            stderr,
        } = launch_binary(&binary, &wrapper, config_path, adjust);
        Gateway {
            child,
            stderr,
            binary,
            wrapper,
            base,
            dir: dir.to_path_buf(),
            config_path: config_path.to_path_buf(),
            keys,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        }
    }

    pub async fn start(dir: &Path, extra_config: &str) -> (Gateway, Arc<Tool>) {
        Gateway::start_with(dir, "", extra_config).await
    }

    /// Like [`Gateway::start`], on the release build ([`release_binary`]).
    pub async fn start_release(dir: &Path, extra_config: &str) -> (Gateway, Arc<Tool>) {
        let (tool, tool_base) = start_tool().await;
        let keys = Arc::new(Keys::new());
        let config = write_config(dir, &keys, &tool_base, "", extra_config);
        let gateway =
            Gateway::spawn_binary(release_binary(), Vec::new(), dir, &config, keys, |_| {});
        (gateway, tool)
    }

    /// Like [`Gateway::start_release`] with `extra_upstreams`, listening on a loopback port chosen before
    /// it starts, which `extra_config` gets: for a configuration that names the gateway's own URL
    /// (`mcp_server.resource`, which MCP hosts compare with the URL they connect to). The one exception
    /// to port 0: the port is found free and let go just before the start, so another process may take
    /// it in between; a start that fails is tried once more on a new port.
    pub async fn start_release_on_known_port(
        dir: &Path,
        extra_upstreams: &str,
        extra_config: impl Fn(u16) -> String,
    ) -> (Gateway, Arc<Tool>) {
        let (tool, tool_base) = start_tool().await;
        let keys = Arc::new(Keys::new());
        let binary = release_binary();
        let mut failures = Vec::new();
        for _ in 0..2 {
            let port = mcp::free_port();
            let config = write_config(dir, &keys, &tool_base, extra_upstreams, &extra_config(port));
            let text = std::fs::read_to_string(&config).unwrap().replacen(
                "listen: \"127.0.0.1:0\"",
                &format!("listen: \"127.0.0.1:{port}\""),
                1,
            );
            std::fs::write(&config, text).unwrap();
            match try_launch_command(serve_command(&binary, &[], &config, |_| {})) {
                Ok(Launched {
                    child,
                    base,
                    stderr,
                }) => {
                    assert_eq!(base, format!("http://127.0.0.1:{port}"));
                    let gateway = Gateway {
                        child,
                        stderr,
                        binary,
                        wrapper: Vec::new(),
                        base,
                        dir: dir.to_path_buf(),
                        config_path: config,
                        keys,
                        client: reqwest::Client::builder()
                            .timeout(Duration::from_secs(20))
                            .build()
                            .unwrap(),
                    };
                    return (gateway, tool);
                }
                Err(failure) => failures.push(failure),
            }
        }
        panic!("the gateway did not start on a chosen port: {failures:#?}");
    }

    pub async fn start_with(
        dir: &Path,
        extra_upstreams: &str,
        extra_config: &str,
    ) -> (Gateway, Arc<Tool>) {
        let (tool, tool_base) = start_tool().await;
        let keys = Arc::new(Keys::new());
        let config = write_config(dir, &keys, &tool_base, extra_upstreams, extra_config);
        (Gateway::spawn(dir, &config, keys), tool)
    }

    /// Like [`Gateway::start_with`] (`extra_upstreams` gets the test tool's base URL), with the command
    /// adjusted by `adjust` (see [`launch_binary`]) and its standard error piped to the test (so not a
    /// terminal) and captured.
    pub async fn start_capturing(
        dir: &Path,
        extra_upstreams: impl FnOnce(&str) -> String,
        extra_config: &str,
        adjust: impl FnOnce(&mut Command),
    ) -> (Gateway, Lines) {
        let (_tool, tool_base) = start_tool().await;
        let keys = Arc::new(Keys::new());
        let upstreams = extra_upstreams(&tool_base);
        let config = write_config(dir, &keys, &tool_base, &upstreams, extra_config);
        let gateway = Gateway::spawn_with(Vec::new(), dir, &config, keys, |command| {
            adjust(command);
            command.stderr(Stdio::piped());
        });
        let stderr = gateway.stderr();
        (gateway, stderr)
    }

    /// SIGKILL to the gateway. Under a wrapper (strace) the gateway itself is killed, and the tracer is
    /// left to see it through its exit (a killed tracer would only detach from a still running gateway).
    pub fn kill(&mut self) {
        let pid = self.child.id();
        if !self.wrapper.is_empty() {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children.split_whitespace() {
                let _ = Command::new("kill").args(["-9", child]).status();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the process with SIGKILL and starts it again on the same data.
    pub fn restart(&mut self) {
        self.kill();
        let launched = launch_binary(&self.binary, &self.wrapper, &self.config_path, |_| {});
        self.child = launched.child;
        self.base = launched.base;
        self.stderr = launched.stderr;
    }

    /// What the gateway writes on its standard error, as it comes; for a start that piped it.
    pub fn stderr(&self) -> Lines {
        self.stderr.clone().expect("the gateway's stderr is piped")
    }

    pub async fn operator(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The audit events that `query` selects (`GET /v1/audit?QUERY` as an admin), newest first.
    pub async fn audit_events(&self, query: &str) -> Vec<Value> {
        let (status, page) = self
            .admin(reqwest::Method::GET, &format!("/v1/audit?{query}"), None)
            .await;
        assert_eq!(status, 200, "{page}");
        page["items"].as_array().unwrap().clone()
    }

    /// `POST /v1/seal/sessions` with the given operator token (or none).
    pub async fn register(&self, token: Option<&str>, body: Value) -> (u16, Value) {
        self.operator(
            reqwest::Method::POST,
            "/v1/seal/sessions",
            token,
            Some(body),
        )
        .await
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let token = self.keys.operator_token("seal.admin");
        self.operator(method, path, Some(&token), body).await
    }

    /// `GET /metrics` with a `seal.metrics.read` token: the Prometheus text.
    pub async fn metrics(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(self.keys.operator_token("seal.metrics.read"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.text().await.unwrap()
    }

    /// `GET /v1/audit/export` from `from_seq` (the first event when 0), as the JSON lines it streams.
    pub async fn export_from(&self, from_seq: u64) -> String {
        let response = self
            .client
            .get(format!("{}/v1/audit/export?from_seq={from_seq}", self.base))
            .bearer_auth(self.keys.operator_token("seal.audit.read"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.text().await.unwrap()
    }

    /// The whole stored chain, as `GET /v1/audit/export` streams it.
    pub async fn export(&self) -> String {
        self.export_from(0).await
    }

    /// The whole stored chain written to `path` (for `sealgate audit verify`); its events, oldest first.
    pub async fn save_export(&self, path: &Path) -> Vec<Value> {
        let text = self.export().await;
        std::fs::write(path, &text).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// The URL of this gateway's JWK Set (`GET /v1/keys`), for `--keys`.
    pub fn keys_url(&self) -> String {
        format!("{}/v1/keys", self.base)
    }

    /// The text of the audit file (`audit.jsonl` in the gateway's folder) once it holds the event `seq`:
    /// the file is a copy written after each commit, so it may trail the answer by a moment.
    pub async fn audit_file_through(&self, seq: u64) -> String {
        let path = self.dir.join("audit.jsonl");
        let last_seq = || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            text.lines()
                .rev()
                .find_map(|line| serde_json::from_str::<Value>(line).ok()?["seq"].as_u64())
        };
        until(
            Duration::from_secs(10),
            "the audit file to hold the event",
            || async { last_seq().is_some_and(|last| last >= seq) },
        )
        .await;
        std::fs::read_to_string(&path).unwrap()
    }

    /// The text of the audit file once it holds every event the store holds now.
    pub async fn audit_file(&self) -> String {
        let (status, page) = self
            .admin(reqwest::Method::GET, "/v1/audit?limit=1", None)
            .await;
        assert_eq!(status, 200, "{page}");
        let newest = page["items"][0]["seq"].as_u64().unwrap_or(0);
        self.audit_file_through(newest).await
    }

    /// Every audit event of a session, oldest first.
    pub async fn events(&self, session: &str) -> Vec<Value> {
        let path = format!("/v1/audit?session_id={session}&limit=1000");
        let (status, page) = self.admin(reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        let mut items = page["items"].as_array().unwrap().clone();
        items.reverse();
        items
    }

    /// Registers a session on the `test` context; returns the agent's signing key and token.
    pub async fn session(&self, id: &str) -> (SigningKey, String) {
        self.session_with(id, json!({})).await
    }

    /// Registers a session on `context`; returns the agent's signing key and a token for that context.
    pub async fn session_in(&self, id: &str, context: &str) -> (SigningKey, String) {
        let (key, _) = self
            .session_with(id, json!({ "security_context": context }))
            .await;
        let token = self
            .keys
            .agent_token_from(&self.keys.agent_claims(id, context));
        (key, token)
    }

    pub async fn session_with(&self, id: &str, extra: Value) -> (SigningKey, String) {
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let mut body = json!({"session_id": id, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                              "security_context": "test", "expires_at": sealgate::clock::now_secs() + 600});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = self
            .admin(reqwest::Method::POST, "/v1/seal/sessions", Some(body))
            .await;
        assert_eq!(status, 201, "session registration: {answer}");
        (key, self.keys.agent_token(id))
    }

    pub async fn post_raw(&self, body: Vec<u8>) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}/v1/invoke", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, envelope: &Value) -> (u16, Value) {
        self.post_raw(serde_json::to_vec(envelope).unwrap()).await
    }

    /// Signs `payload` now and posts it.
    pub async fn call(&self, key: &SigningKey, token: &str, payload: Value) -> (u16, Value) {
        let envelope =
            sealgate::envelope::sign_envelope(key, payload, token, sealgate::clock::now_secs());
        self.post(&envelope).await
    }

    /// Signs and posts a `tools/call` of `tool` with `args`, under a JSON-RPC id no other call of this
    /// test binary used (a fresh envelope each time).
    pub async fn call_tool(
        &self,
        key: &SigningKey,
        token: &str,
        tool: &str,
        args: Value,
    ) -> (u16, Value) {
        static ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.call(key, token, tool_call(id, tool, args)).await
    }

    /// Signs a call now and posts it with the given `traceparent` header values; the status, the body
    /// and the `traceparent` of the answer.
    pub async fn call_traced(
        &self,
        key: &SigningKey,
        token: &str,
        payload: Value,
        traceparents: &[&str],
    ) -> (u16, Value, String) {
        let envelope =
            sealgate::envelope::sign_envelope(key, payload, token, sealgate::clock::now_secs());
        let mut request = self
            .client
            .post(format!("{}/v1/invoke", self.base))
            .json(&envelope);
        for value in traceparents {
            request = request.header("traceparent", *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let answered = response
            .headers()
            .get("traceparent")
            .expect("every response has a traceparent")
            .to_str()
            .unwrap()
            .to_owned();
        (status, response.json().await.unwrap(), answered)
    }
}

/// Everything the gateway writes to one of its streams, a line at a time, as it comes.
#[derive(Clone, Default)]
pub struct Lines(Arc<std::sync::Mutex<Vec<String>>>);

impl Lines {
    /// Collects the lines of `stream` on a thread of its own until it closes. A line that is not UTF-8 is
    /// kept with U+FFFD in its place, and reading goes on: a reader that stopped would leave the writer
    /// blocked on a full pipe.
    pub fn capture(stream: impl std::io::Read + Send + 'static) -> Lines {
        let lines = Lines::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while reader
                .read_until(b'\n', &mut line)
                .is_ok_and(|read| read > 0)
            {
                let text = String::from_utf8_lossy(&line);
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let text = text.strip_suffix('\r').unwrap_or(text);
                sink.0.lock().unwrap().push(text.to_owned());
                line.clear();
            }
        });
        lines
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until some line satisfies `found` (the writes race the HTTP answers by a little).
    pub fn wait_for(&self, what: &str, found: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| found(l)) {
                return line;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no log line {what} in {:#?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn tool_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
}

/// A `tools/call` carrying `params._meta.idempotency_key` (SPEC 7.1).
pub fn keyed_call(id: u64, name: &str, arguments: Value, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments, "_meta": {"idempotency_key": key}}})
}

/// The error code of a refusal body (panics with the body when there is none).
pub fn code(body: &Value) -> u64 {
    body["error"]["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("no error code in {body}"))
}

/// Runs the real `sealgate` command with `args`; returns its exit code and everything it printed.
pub fn run_cli(args: &[&str]) -> (i32, String) {
    run_cli_with_env(args, &[])
}

/// Like [`run_cli`], with extra environment variables.
pub fn run_cli_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `sealgate audit verify FILES… [--keys KEYS]`: its exit code and everything it printed.
pub fn audit_verify(files: &[&Path], keys: Option<&str>) -> (i32, String) {
    let mut args = vec!["audit", "verify"];
    args.extend(files.iter().map(|file| file.to_str().unwrap()));
    args.extend(keys.iter().flat_map(|keys| ["--keys", keys]));
    run_cli(&args)
}

/// Runs `serve` and `serve --check` on `config`: both must refuse it, say `expected`, and never print
/// `secret` (a value the configuration holds that no message may quote).
pub fn assert_refused_at_start_up(config: &Path, expected: &str, secret: &str) {
    let config = config.to_str().unwrap();
    for args in [
        &["serve", "--config", config][..],
        &["serve", "--check", "--config", config][..],
    ] {
        let (status, output) =
            run_cli_with_env(args, &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")]);
        assert_ne!(status, 0, "{args:?}: {output}");
        assert!(output.contains(expected), "{args:?}: {output}");
        assert!(!output.contains(secret), "{args:?}: {output}");
    }
}

/// Runs a `sealgate` command that must fail to start (`serve` with a configuration it refuses); returns
/// everything it printed. One still running after 30 s is killed and the test fails: it serves. Its output
/// is read while it runs, so a command that prints much (at `trace`) cannot block on a full pipe.
pub fn run_refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let child = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let (sender, finished) = mpsc::channel();
    std::thread::spawn(move || sender.send(child.wait_with_output()));
    let (out, in_time) = match finished.recv_timeout(Duration::from_secs(30)) {
        Ok(out) => (out, true),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid]).status();
            (finished.recv().unwrap(), false)
        }
    };
    let out = out.unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(in_time, "{args:?} still runs after 30 s:\n{printed}");
    assert!(!out.status.success(), "{args:?} succeeded");
    printed
}

/// `count` gateway processes on one PostgreSQL store: each has a folder of its own (data, audit file,
/// configuration) and `replica_id` r0, r1, …; all share the keys and the counting tool.
pub async fn start_replicas(
    dir: &Path,
    count: usize,
    store_url: &str,
) -> (Vec<Gateway>, Arc<Tool>) {
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let replicas = (0..count)
        .map(|i| {
            let folder = dir.join(format!("r{i}"));
            let signing = replica_signing(dir, count, i);
            let extra = format!("store: {store_url:?}\nreplica_id: r{i}\n{signing}");
            let config = write_config(&folder, &keys, &tool_base, "", &extra);
            Gateway::spawn(&folder, &config, keys.clone())
        })
        .collect();
    (replicas, tool)
}

/// The audit archives that retention wrote to `dir` (`audit-FIRST-LAST-HASH.jsonl`), oldest first, with
/// the `FIRST` and `LAST` seqs that their names give.
pub fn archives(dir: &Path) -> Vec<(u64, u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, u64, PathBuf)> = entries
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let range = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
            let mut parts = range.split('-');
            let (first, last) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
            Some((first, last, path))
        })
        .collect();
    found.sort();
    found
}

/// Calls `call` every 50 ms until it answers true; panics when that takes `within` or longer.
pub async fn until<F, Fut>(within: std::time::Duration, what: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !call().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() < within, "{what}: not within {within:?}");
}

/// The pinned standardwebhooks that scripts/test.sh installs (or `STANDARDWEBHOOKS_PYTHON`, a Python
/// that can import it).
pub fn standardwebhooks_python() -> PathBuf {
    pinned_tool("standardwebhooks", "python", "STANDARDWEBHOOKS_PYTHON")
}

/// `program` of the venv `target/venvs/VENV` that scripts/test.sh makes with its pinned packages, or the
/// path in the variable `override_var`.
pub fn pinned_tool(venv: &str, program: &str, override_var: &str) -> PathBuf {
    let path = std::env::var_os(override_var).map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(format!("target/venvs/{venv}/bin/{program}"))
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, which installs the pinned {venv}",
        path.display()
    );
    path
}

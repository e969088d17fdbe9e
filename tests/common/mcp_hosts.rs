//! Real MCP hosts that reach a remote MCP server with OAuth (tests/mcp-hosts): the official Python SDK
//! (the venv `target/venvs/mcp` that scripts/test.sh makes), the official TypeScript SDK and the MCP
//! Inspector CLI (`npm ci --prefix tests/mcp-hosts`). The person's part of the dance (the provider's
//! login and consent pages) is done here, once per host, by [`Browser`]; everything else is the host's.
//! [`authorize`] is the dance done by this harness itself, for checks that need a token in hand.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::oidc::Browser;

/// How long one host may take for its whole run (its start, the dance, the calls); a host still running
/// then fails the test.
const HOST_DEADLINE: Duration = Duration::from_secs(120);

/// A person of the provider.
#[derive(Clone, Copy)]
pub struct Person<'a> {
    pub login: &'a str,
    pub password: &'a str,
}

/// `tools/list`, as a host action.
pub fn list_tools() -> Value {
    json!({"method": "tools/list"})
}

/// `tools/call NAME ARGUMENTS`, as a host action.
pub fn call_tool(name: &str, arguments: Value) -> Value {
    json!({"method": "tools/call", "name": name, "arguments": arguments})
}

/// Where the provider sends the person back to a host. Nothing listens there: the test's browser stops
/// at the redirect and hands the address to the host, as a host's own loopback listener would get it.
pub fn redirect_uri(host: &str) -> String {
    format!("http://127.0.0.1:8976/{host}/callback")
}

fn hosts_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-hosts");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/sdk").is_dir()
            && dir
                .join("node_modules/@modelcontextprotocol/inspector")
                .is_dir(),
        "the MCP hosts are not installed: run `npm ci --prefix tests/mcp-hosts`"
    );
    dir
}

fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venvs/mcp/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/test.sh, which installs the pinned MCP Python SDK",
        python.display()
    );
    python
}

/// What a host printed: one JSON line per action, and how many times it sent the person to sign in.
#[derive(Debug)]
pub struct HostRun {
    pub results: Vec<Value>,
    pub sign_ins: usize,
}

/// A host process, killed when dropped; its standard error is kept for the failure messages.
struct Host {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Host {
    fn spawn(mut command: Command) -> Host {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the host starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut text = String::new();
            let mut buffer = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                text.push_str(&String::from_utf8_lossy(&buffer[..n]));
                *sink.lock().unwrap() = text.clone();
            }
        });
        Host { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// Runs a host script to its end: each `AUTHORIZE <url>` line is answered by signing `person` in with a
/// fresh browser and writing the redirect address to the host's stdin; every other line is a result.
async fn drive(name: &str, command: Command, person: Person<'_>, redirect: &str) -> HostRun {
    let mut host = Host::spawn(command);
    let mut stdin = host.child.stdin.take().unwrap();
    let mut lines = BufReader::new(host.child.stdout.take().unwrap()).lines();
    let mut run = HostRun {
        results: Vec::new(),
        sign_ins: 0,
    };
    let deadline = tokio::time::Instant::now() + HOST_DEADLINE;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(line) => line.unwrap(),
            Err(_) => panic!(
                "{name} still runs after {HOST_DEADLINE:?}; it printed {:#?}; stderr:\n{}",
                run.results,
                host.stderr()
            ),
        };
        let Some(line) = line else { break };
        if let Some(url) = line.strip_prefix("AUTHORIZE ") {
            run.sign_ins += 1;
            let back = Browser::new()
                .sign_in_until(url, person.login, person.password, redirect)
                .await;
            stdin
                .write_all(format!("{back}\n").as_bytes())
                .await
                .unwrap();
            stdin.flush().await.unwrap();
            continue;
        }
        let value: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!(
                "{name} printed a line that is not JSON ({e}): {line}\nstderr:\n{}",
                host.stderr()
            )
        });
        run.results.push(value);
    }
    let status = tokio::time::timeout_at(deadline, host.child.wait())
        .await
        .unwrap_or_else(|_| panic!("{name} did not exit; stderr:\n{}", host.stderr()))
        .unwrap();
    assert!(
        status.success(),
        "{name} failed ({status}) after {:#?}; stderr:\n{}",
        run.results,
        host.stderr()
    );
    run
}

fn plan(url: &str, host: &str, actions: &[Value]) -> String {
    json!({"url": url, "redirect_uri": redirect_uri(host), "actions": actions}).to_string()
}

/// The MCP Python SDK's host (tests/mcp-hosts/python_host.py) against the MCP server at `url`.
pub async fn run_python(url: &str, person: Person<'_>, actions: &[Value]) -> HostRun {
    let mut command = Command::new(python());
    command
        .arg(hosts_dir().join("python_host.py"))
        .arg(plan(url, "python", actions));
    drive(
        "the Python SDK host",
        command,
        person,
        &redirect_uri("python"),
    )
    .await
}

/// The MCP TypeScript SDK's host (tests/mcp-hosts/typescript_host.mjs) against the MCP server at `url`.
pub async fn run_typescript(url: &str, person: Person<'_>, actions: &[Value]) -> HostRun {
    let mut command = Command::new("node");
    command
        .arg(hosts_dir().join("typescript_host.mjs"))
        .arg(plan(url, "typescript", actions));
    drive(
        "the TypeScript SDK host",
        command,
        person,
        &redirect_uri("typescript"),
    )
    .await
}

/// The MCP Inspector's CLI (`mcp-inspector --cli URL --method …`), once per action, as a person runs it
/// at a terminal: its own OAuth client does the dance (dynamic registration, PKCE, `resource`, a loopback
/// listener for the redirect) and keeps the token in its own store (under a `HOME` of this run), so only
/// the first action signs the person in. Each action's result as the other hosts print it.
///
/// The CLI lets OAuth run only with a person present (a terminal on stdin or stderr) or when told to open
/// a browser itself: it runs under `script` (util-linux) on a pseudo-terminal, with browser opening off
/// (`MCP_AUTO_OPEN_ENABLED=false`), and prints `Please navigate to: URL`; the harness's browser signs the
/// person in and requests the redirect from the CLI's listener, as a desktop browser would. (Inspector
/// 2.x says it wants Node 22.19; its CLI does all of this on the machine's Node 20. Its 1.x CLI had no
/// OAuth at all, only `--header`.)
pub async fn run_inspector(url: &str, person: Person<'_>, actions: &[Value]) -> HostRun {
    let cli =
        hosts_dir().join("node_modules/@modelcontextprotocol/inspector/clients/cli/build/index.js");
    let home = tempfile::tempdir().unwrap();
    // The CLI's listener binds the port itself, and the address must be known to register it: the port is
    // found free first (another process could take it in between; the sign-in would then fail loudly).
    let callback = format!(
        "http://127.0.0.1:{}/oauth/callback",
        super::mcp::free_port()
    );
    let mut run = HostRun {
        results: Vec::new(),
        sign_ins: 0,
    };
    for (i, action) in actions.iter().enumerate() {
        let method = action["method"].as_str().unwrap();
        let output = home.path().join(format!("result-{i}.json"));
        let mut words: Vec<String> = vec!["node".into(), cli.to_string_lossy().into_owned()];
        words.extend(["--cli", url, "--transport", "http", "--method", method].map(String::from));
        words.extend(["--callback-url".into(), callback.clone()]);
        words.extend(["--output".into(), output.to_string_lossy().into_owned()]);
        if method == "tools/call" {
            words.extend([
                "--tool-name".into(),
                action["name"].as_str().unwrap().to_owned(),
            ]);
            words.extend(["--tool-args-json".into(), action["arguments"].to_string()]);
        }
        let mut command = Command::new("script");
        command
            .args(["--quiet", "--return", "--flush", "--command"])
            .arg(shell_words::join(&words))
            .arg("/dev/null")
            .env("HOME", home.path())
            .env("MCP_AUTO_OPEN_ENABLED", "false")
            .env("MCP_INSPECTOR_SECRET_STORE", "file")
            .env("NO_COLOR", "1");
        let mut host = Host::spawn(command);
        // The pseudo-terminal's input: held open until the CLI ends.
        let _stdin = host.child.stdin.take().unwrap();
        let mut lines = BufReader::new(host.child.stdout.take().unwrap()).lines();
        let mut terminal = Vec::new();
        let deadline = tokio::time::Instant::now() + HOST_DEADLINE;
        loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("the Inspector CLI still runs after {HOST_DEADLINE:?}: {terminal:#?}")
                })
                .unwrap();
            let Some(line) = line else { break };
            let line = line.trim_end_matches('\r').to_owned();
            if let Some(address) = line.trim().strip_prefix("Please navigate to: ") {
                run.sign_ins += 1;
                let back = Browser::new()
                    .sign_in_until(address.trim(), person.login, person.password, &callback)
                    .await;
                let answer = reqwest::get(&back).await.unwrap();
                assert_eq!(
                    answer.status().as_u16(),
                    200,
                    "the CLI's listener took {back}"
                );
            }
            terminal.push(line);
        }
        let status = tokio::time::timeout_at(deadline, host.child.wait())
            .await
            .expect("the Inspector CLI ends")
            .unwrap();
        let text = std::fs::read_to_string(&output).unwrap_or_else(|e| {
            panic!("the Inspector CLI ({status}) wrote no result ({e}): {terminal:#?}")
        });
        let result: Value = serde_json::from_str(&text).unwrap();
        // The CLI ends with a failure status (5) for a tool result with isError, and writes it all the same.
        assert!(
            status.success() || result["isError"] == true,
            "the Inspector CLI failed ({status}): {terminal:#?}\n{}",
            host.stderr()
        );
        run.results
            .push(json!({"method": method, "result": result}));
    }
    run
}

/// What [`authorize`] learnt on its way.
#[derive(Debug)]
pub struct Authorized {
    pub access_token: String,
    /// The `WWW-Authenticate` header of the first, tokenless request.
    pub challenge: String,
    /// The protected resource metadata (RFC 9728).
    pub resource_metadata: Value,
    /// The authorization server's metadata, and the address it was found at.
    pub server_metadata: Value,
    pub server_metadata_url: String,
    /// The whole token response.
    pub token_response: Value,
}

/// The OAuth dance of an MCP host, done by this harness: a request
/// without a token, its 401's `resource_metadata`, that document, the authorization server's metadata
/// (RFC 8414 first, OpenID discovery after, as the SDKs try them), the authorization request with PKCE
/// (S256) and `resource` for the pre-registered public client `client_id`, the browser, the token
/// request. Panics at any step that a host would fail at.
pub async fn authorize(
    url: &str,
    client_id: &str,
    redirect: &str,
    person: Person<'_>,
) -> Authorized {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let first = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "sealgate-test-harness", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(first.status().as_u16(), 401, "a request without a token");
    let challenge = first
        .headers()
        .get("www-authenticate")
        .expect("a 401 names its resource metadata")
        .to_str()
        .unwrap()
        .to_owned();
    let metadata_url = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no resource_metadata in {challenge:?}"))
        .to_owned();
    let get_json = |address: String| {
        let http = http.clone();
        async move {
            let response = http.get(&address).send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, resource_metadata) = get_json(metadata_url.clone()).await;
    assert_eq!(status, 200, "{metadata_url}: {resource_metadata}");
    assert_eq!(
        resource_metadata["resource"],
        json!(url),
        "RFC 9728: the resource is the URL the host asked"
    );
    let issuer = resource_metadata["authorization_servers"][0]
        .as_str()
        .expect("an authorization server")
        .trim_end_matches('/')
        .to_owned();
    let mut found = None;
    for well_known in ["oauth-authorization-server", "openid-configuration"] {
        let address = format!("{issuer}/.well-known/{well_known}");
        let (status, metadata) = get_json(address.clone()).await;
        if status == 200 {
            found = Some((address, metadata));
            break;
        }
    }
    let (server_metadata_url, server_metadata) =
        found.unwrap_or_else(|| panic!("{issuer} publishes no authorization server metadata"));
    assert_eq!(server_metadata["issuer"], json!(issuer), "RFC 8414 3.3");
    let scope = resource_metadata["scopes_supported"]
        .as_array()
        .map(|scopes| {
            scopes
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();

    let verifier = URL_SAFE_NO_PAD.encode(random_bytes());
    let challenge_s256 = URL_SAFE_NO_PAD.encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        verifier.as_bytes(),
    ));
    let state = URL_SAFE_NO_PAD.encode(random_bytes());
    let mut authorization =
        url::Url::parse(server_metadata["authorization_endpoint"].as_str().unwrap()).unwrap();
    authorization
        .query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", client_id)
        .append_pair("redirect_uri", redirect)
        .append_pair("scope", &scope)
        .append_pair("state", &state)
        .append_pair("code_challenge", &challenge_s256)
        .append_pair("code_challenge_method", "S256")
        .append_pair("resource", url);
    let back = Browser::new()
        .sign_in_until(
            authorization.as_str(),
            person.login,
            person.password,
            redirect,
        )
        .await;
    let back = url::Url::parse(&back).unwrap();
    let param = |name: &str| {
        back.query_pairs()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    };
    assert_eq!(param("state").as_deref(), Some(state.as_str()), "{back}");
    assert_eq!(
        param("iss").as_deref(),
        Some(issuer.as_str()),
        "RFC 9207: {back}"
    );
    let code = param("code").unwrap_or_else(|| panic!("no code in {back}"));

    let token_endpoint = server_metadata["token_endpoint"].as_str().unwrap();
    let response = http
        .post(token_endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs([
                    ("grant_type", "authorization_code"),
                    ("code", &code),
                    ("redirect_uri", redirect),
                    ("client_id", client_id),
                    ("code_verifier", &verifier),
                    ("resource", url),
                ])
                .finish(),
        )
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let token_response: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "the token request: {token_response}");
    Authorized {
        access_token: token_response["access_token"].as_str().unwrap().to_owned(),
        challenge,
        resource_metadata,
        server_metadata,
        server_metadata_url,
        token_response,
    }
}

fn random_bytes() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).unwrap();
    bytes
}

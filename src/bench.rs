//! `sealgate bench …`: the parts of `scripts/bench.sh` that need the crate's own code or a precise clock.
//! The script measures the release gateway against nginx with an external load generator (wrk); this module
//! gives it the one-thread upstream, keys and configuration, sessions registered over the real API,
//! pre-signed unique envelopes, an open-loop fixed-rate client, fsync timing, the many-sessions soak and an
//! overload whose clients honour `Retry-After`.
//! Every subcommand prints its result as one `key=value …` line on stdout for the script to read.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ed25519_dalek::SigningKey;
use futures_util::{StreamExt as _, TryStreamExt as _};
use serde_json::{json, Value};

use crate::{clock, envelope, token};

/// The contexts that `setup` writes: the same tool without and with a durable claim.
/// `bench-claim` claims every call without asking for keys (`auto`), so that each call pays for a claim.
const CONTEXTS: [(&str, &str); 2] = [
    ("bench-off", "    claim: off\n"),
    ("bench-claim", "    claim: auto\n"),
];
const AGENT_ISSUER: &str = "orchestrator";
const AGENT_AUDIENCE: &str = "sealgate-agents";
/// Tokens and sessions outlive the longest soak (a million calls at today's speed).
const LIFETIME_SECS: i64 = 6 * 3600;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Serve the fast JSON-RPC upstream on one thread at a free loopback port (prints its URL).
    Upstream,
    /// Serve a floor for the gateway at a free loopback port (prints its URL): the gateway's own HTTP server
    /// and client, with one Ed25519 verification and one signature per call and nothing else (no token,
    /// session, policy, store or audit). What this stack costs before the gateway does its work.
    Floor {
        /// The upstream's JSON-RPC URL.
        #[arg(long)]
        upstream: String,
    },
    /// Write keys, the two bench contexts and a gateway configuration (`sealgate.yaml`) into DIR.
    Setup {
        #[arg(long)]
        dir: PathBuf,
        /// The upstream's JSON-RPC URL.
        #[arg(long)]
        upstream: String,
    },
    /// Print an operator token for the standalone claim API (scope seal.claim.resolve).
    OperatorToken {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Open an MCP session at the gateway's MCP endpoint (SPEC 17) as a bench person, and print
    /// `token=TOKEN session=MCP-SESSION-ID`: what `scripts/bench.lua`'s `mcp` mode sends with each call.
    McpSession {
        #[arg(long)]
        dir: PathBuf,
        /// The gateway's base URL.
        #[arg(long)]
        gateway: String,
    },
    /// Register sessions and write COUNT unique pre-signed envelopes, one per line, spread over FILES files
    /// named OUT.0, OUT.1, … (one per load-generator thread).
    Envelopes {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: u64,
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        files: u64,
        #[arg(long)]
        out: PathBuf,
        /// How long the run that sends them lasts: they are dated that far ahead, so that the whole run, and
        /// up to 30 s of signing before it, lie inside the gateway's ±30 s clock window.
        #[arg(long)]
        secs: i64,
    },
    /// Open-loop load at a fixed rate; latency counts from each call's intended send time.
    Rate {
        #[command(flatten)]
        target: Target,
        /// Calls per second.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        rate: u64,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        secs: u64,
        /// Calls in flight at most.
        #[arg(long, default_value_t = 64, value_parser = at_least_one)]
        connections: usize,
    },
    /// Time COUNT fdatasync calls, each after a small append, in DIR.
    Fsync {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 300, value_parser = at_least_one)]
        count: usize,
    },
    /// Time COUNT signed receipts of a typical call (SPEC 14): the CPU that signing adds to each call.
    Sign {
        #[arg(long, default_value_t = 20_000, value_parser = at_least_one)]
        count: usize,
    },
    /// Time the answer guard (SPEC 18) COUNT times on a short answer, and on a 64 KiB one without and
    /// with matches: the CPU it adds to a call that brings one back.
    Guard {
        #[arg(long, default_value_t = 2_000, value_parser = at_least_one)]
        count: usize,
    },
    /// Make CALLS calls spread over all the registered sessions (for the memory and disk readings).
    Soak {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        calls: u64,
        #[arg(long, default_value_t = 32, value_parser = at_least_one)]
        concurrency: usize,
        /// Each call names its action with a random `idempotency_key` (a UUID), as agents that key
        /// their calls do: request ids then share nothing that packs well.
        #[arg(long)]
        keyed: bool,
    },
    /// Closed loop for SECS with CONCURRENCY callers that each honour `Retry-After`: a caller shed with
    /// 503 waits as long as it says before its next call (what SPEC 11 asks of clients, unlike wrk).
    Overload {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        secs: u64,
        #[arg(long, default_value_t = 128, value_parser = at_least_one)]
        concurrency: usize,
    },
}

/// Where calls go and as whom.
#[derive(clap::Args)]
pub struct Target {
    /// The folder that `setup` wrote (keys).
    #[arg(long)]
    dir: PathBuf,
    /// The gateway's base URL.
    #[arg(long)]
    gateway: String,
    /// `bench-off` or `bench-claim`.
    #[arg(long)]
    context: String,
    /// Sessions to register; calls go round-robin over them.
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    sessions: usize,
}

/// A count that must be at least 1: none would divide by zero or wait for ever.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn run(command: BenchCommand) -> Result<(), String> {
    match command {
        BenchCommand::Upstream => tokio::task::spawn_blocking(upstream)
            .await
            .map_err(|e| e.to_string())?,
        BenchCommand::Floor { upstream } => floor(upstream).await,
        BenchCommand::Setup { dir, upstream } => setup(&dir, &upstream),
        BenchCommand::OperatorToken { dir } => {
            println!("{}", operator_token(&dir, token::scopes::CLAIM_RESOLVE)?);
            Ok(())
        }
        BenchCommand::McpSession { dir, gateway } => {
            println!("{}", mcp_session(&dir, &gateway).await?);
            Ok(())
        }
        BenchCommand::Envelopes {
            target,
            count,
            files,
            out,
            secs,
        } => write_envelopes(&target, count, files, &out, secs).await,
        BenchCommand::Rate {
            target,
            rate,
            secs,
            connections,
        } => fixed_rate(&target, rate, secs, connections).await,
        BenchCommand::Fsync { dir, count } => fsync_times(&dir, count),
        BenchCommand::Sign { count } => {
            let (receipt, signature) = crate::evidence::receipt_cost(count)?;
            println!(
                "receipts={count} receipt_ns={} signature_ns={}",
                receipt.as_nanos(),
                signature.as_nanos()
            );
            Ok(())
        }
        BenchCommand::Guard { count } => {
            let cost = guard_cost(count)?;
            println!(
                "answers={count} answer_bytes={} short_ns={} clean_ns={} near_ns={} matched_ns={} matches={}",
                cost.bytes,
                cost.short.as_nanos(),
                cost.clean.as_nanos(),
                cost.near.as_nanos(),
                cost.matched.as_nanos(),
                cost.matches
            );
            Ok(())
        }
        BenchCommand::Soak {
            target,
            calls,
            concurrency,
            keyed,
        } => {
            let stop = Stop::After(calls);
            let callers = Callers {
                concurrency,
                polite: false,
                keyed,
            };
            let (samples, elapsed) = closed_loop(&target, stop, callers).await?;
            println!("{}", summary(&samples, elapsed));
            Ok(())
        }
        BenchCommand::Overload {
            target,
            secs,
            concurrency,
        } => {
            let stop = Stop::At(Instant::now() + Duration::from_secs(secs));
            let callers = Callers {
                concurrency,
                polite: true,
                keyed: false,
            };
            let (samples, elapsed) = closed_loop(&target, stop, callers).await?;
            let admitted = samples.iter().filter(|(status, _)| *status == 200).count();
            let shed = samples.iter().filter(|(status, _)| *status == 503).count();
            println!(
                "admitted={admitted} admitted_rps={:.0} shed={shed} {}",
                admitted as f64 / elapsed.as_secs_f64(),
                summary(&samples, elapsed)
            );
            Ok(())
        }
    }
}

/// One thread, as the issue's reference upstream: a proxy in front of it is measured, not the tool.
fn upstream() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("bench upstream on http://{addr}");
        axum::serve(listener, axum::Router::new().fallback(answer))
            .await
            .map_err(|e| e.to_string())
    })
}

async fn answer(body: Bytes) -> axum::Json<Value> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Behind nginx the upstream gets the whole envelope, whose JSON-RPC id sits in its payload.
    let id = request
        .get("id")
        .or_else(|| request.pointer("/payload/id"))
        .cloned()
        .unwrap_or(Value::Null);
    axum::Json(
        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "ok"}]}}),
    )
}

/// What the floor holds. Its keys are fixed: the envelope's signature does not match the verifying key,
/// and an Ed25519 verification costs the same whether or not it does (all of it runs before the compare).
struct Floor {
    upstream: String,
    client: reqwest::Client,
    verifying: ed25519_dalek::VerifyingKey,
    signing: SigningKey,
}

/// The floor's signing key, fixed: its receipts can be checked by whoever knows these bytes.
const FLOOR_KEY: [u8; 32] = [7; 32];

async fn floor(upstream: String) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("bench floor on http://{addr}");
    axum::serve(listener, floor_app(upstream))
        .await
        .map_err(|e| e.to_string())
}

fn floor_app(upstream: String) -> axum::Router {
    let signing = SigningKey::from_bytes(&FLOOR_KEY);
    let floor = Arc::new(Floor {
        upstream,
        client: reqwest::Client::new(),
        verifying: signing.verifying_key(),
        signing,
    });
    axum::Router::new()
        .route("/v1/invoke", axum::routing::post(floor_call))
        .with_state(floor)
}

/// Parses the envelope, verifies its signature over the body, forwards its payload, signs the answer.
async fn floor_call(
    axum::extract::State(floor): axum::extract::State<Arc<Floor>>,
    body: Bytes,
) -> Result<axum::Json<Value>, axum::http::StatusCode> {
    use axum::http::StatusCode;
    use ed25519_dalek::Signer as _;
    let envelope: Value = serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
    let signature = envelope
        .get("signature")
        .and_then(Value::as_str)
        .and_then(|text| envelope::decode_signature(text).ok())
        .ok_or(StatusCode::BAD_REQUEST)?;
    // Does not match (see `Floor`): only its cost counts.
    let _ = floor.verifying.verify_strict(&body, &signature);
    let answer = floor
        .client
        .post(&floor.upstream)
        .json(&envelope["payload"])
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|_| StatusCode::BAD_GATEWAY)?
        .bytes()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let result: Value = serde_json::from_slice(&answer).map_err(|_| StatusCode::BAD_GATEWAY)?;
    let receipt = floor.signing.sign(&answer);
    Ok(axum::Json(
        json!({"result": result, "signature": hex::encode(receipt.to_bytes())}),
    ))
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn read_file(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn setup(dir: &Path, upstream: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir.join("policies")).map_err(|e| e.to_string())?;
    let (operator_private, operator_public) = token::ed25519_keypair_pem()?;
    let (agent_private, agent_public) = token::ed25519_keypair_pem()?;
    let (person_private, person_public) = token::ed25519_keypair_pem()?;
    write_file(&dir.join("operator.pem"), &operator_private)?;
    write_file(&dir.join("agent.pem"), &agent_private)?;
    // The key of an authorization server of its own, whose access tokens the MCP endpoint accepts.
    write_file(&dir.join("mcp-person.pem"), &person_private)?;
    for (name, claim) in CONTEXTS {
        write_file(
            &dir.join(format!("policies/{name}.yaml")),
            &format!("name: {name}\ncapabilities:\n  - tool_pattern: \"bench.*\"\n{claim}"),
        )?;
    }
    // The PEMs are written as YAML double-quoted strings (Rust's escaping of `\n` is the same).
    let config = format!(
        "listen: \"127.0.0.1:0\"\ndata_dir: data\npolicies_dir: policies\n\
         agent_tokens:\n  issuer: {AGENT_ISSUER}\n  audience: {AGENT_AUDIENCE}\n  \
         keys: [ {{ alg: EdDSA, public_key_pem: {agent_public:?} }} ]\n\
         operator_auth:\n  keys: [ {{ alg: EdDSA, public_key_pem: {operator_public:?} }} ]\n\
         upstreams:\n  bench: {{ http: {{ url: {upstream:?} }}, timeout_ms: 10000 }}\n\
         mcp_server:\n  enabled: true\n  resource: {MCP_RESOURCE:?}\n  \
         authorization_servers: [{MCP_ISSUER:?}]\n  \
         keys: [ {{ alg: EdDSA, public_key_pem: {person_public:?} }} ]\n  \
         people: [ {{ claim: sub, pattern: \"bench-*\", context: bench-off }} ]\n"
    );
    write_file(&dir.join("sealgate.yaml"), &config)
}

fn operator_token(dir: &Path, scope: &str) -> Result<String, String> {
    let now = clock::now_secs();
    token::sign_eddsa_for_tests_and_cli(
        &read_file(&dir.join("operator.pem"))?,
        &json!({"sub": "bench-operator", "aud": "sealgate-operators", "scope": scope,
                "iat": now, "exp": now + LIFETIME_SECS, "jti": uuid::Uuid::new_v4().to_string()}),
        None,
    )
    .map_err(String::from)
}

/// The bench gateway's MCP endpoint, as its tokens name it (the port does not matter to a bench client).
const MCP_RESOURCE: &str = "http://127.0.0.1/mcp";
const MCP_ISSUER: &str = "http://127.0.0.1";

/// A person's access token from the bench's authorization server, and the `Mcp-Session-Id` that
/// `initialize` gives it.
async fn mcp_session(dir: &Path, gateway: &str) -> Result<String, String> {
    let now = clock::now_secs();
    let token = token::sign_eddsa_for_tests_and_cli(
        &read_file(&dir.join("mcp-person.pem"))?,
        &json!({"iss": MCP_ISSUER, "sub": "bench-person", "aud": MCP_RESOURCE, "scope": "mcp:tools",
                "azp": "bench-host", "iat": now, "exp": now + LIFETIME_SECS,
                "jti": uuid::Uuid::new_v4().to_string()}),
        None,
    )?;
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "sealgate-bench", "version": "1"}}});
    let response = client()?
        .post(format!("{gateway}/mcp"))
        .bearer_auth(&token)
        .json(&initialize)
        .send()
        .await
        .map_err(|e| format!("initialize: {e}"))?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|id| id.to_str().ok())
        .ok_or_else(|| {
            format!(
                "initialize answered {} without an Mcp-Session-Id",
                response.status()
            )
        })?
        .to_owned();
    Ok(format!("token={token} session={session}"))
}

/// A registered session: the agent's key and its token.
struct Session {
    key: SigningKey,
    token: String,
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())
}

/// Registers `target.sessions` sessions through `POST /v1/seal/sessions`, 16 at a time.
async fn register(client: &reqwest::Client, target: &Target) -> Result<Vec<Session>, String> {
    let operator = operator_token(&target.dir, token::scopes::SESSION_CREATE)?;
    let agent_pem = read_file(&target.dir.join("agent.pem"))?;
    let url = format!("{}/v1/seal/sessions", target.gateway);
    futures_util::stream::iter(0..target.sessions)
        .map(|_| async {
            let key = envelope::generate_signing_key()?;
            let id = format!("bench-{}", uuid::Uuid::new_v4().simple());
            let now = clock::now_secs();
            let body = json!({"session_id": id, "security_context": target.context,
                "public_key": envelope::public_key_b64(&key.verifying_key()),
                "expires_at": now + LIFETIME_SECS});
            let response = client
                .post(&url)
                .bearer_auth(&operator)
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("cannot reach {url}: {e}"))?;
            let status = response.status();
            if status != reqwest::StatusCode::CREATED {
                let text = response.text().await.unwrap_or_default();
                return Err(format!("session registration answered {status}: {text}"));
            }
            let claims = json!({"sub": "bench-agent", "scp": target.context, "exec_id": id,
                "jti": uuid::Uuid::new_v4().to_string(), "iat": now, "exp": now + LIFETIME_SECS,
                "iss": AGENT_ISSUER, "aud": AGENT_AUDIENCE});
            let token = token::sign_eddsa_for_tests_and_cli(&agent_pem, &claims, None)?;
            Ok(Session { key, token })
        })
        .buffer_unordered(16)
        .try_collect()
        .await
}

/// Envelope `n`: a call that no other envelope makes (its id and arguments are unique, so it is neither a
/// replay nor a claim's SKIP), signed by session `n mod sessions`; with `key`, its idempotency key.
fn signed(sessions: &[Session], n: u64, timestamp: i64, key: Option<String>) -> Vec<u8> {
    let session = &sessions[(n % sessions.len() as u64) as usize];
    let mut payload = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
        "params": {"name": "bench.echo", "arguments": {"n": n}}});
    if let Some(key) = key {
        payload["params"]["_meta"] = json!({ "idempotency_key": key });
    }
    let wire = envelope::sign_envelope(&session.key, payload, &session.token, timestamp);
    serde_json::to_vec(&wire).unwrap_or_default()
}

async fn write_envelopes(
    target: &Target,
    count: u64,
    files: u64,
    out: &Path,
    secs: i64,
) -> Result<(), String> {
    let files = files.max(1);
    let sessions = register(&client()?, target).await?;
    let started = Instant::now();
    let timestamp = clock::now_secs() + secs;
    // One signing thread per file: file k holds envelopes k, k + files, k + 2·files, …
    std::thread::scope(|scope| {
        let writers: Vec<_> = (0..files)
            .map(|k| {
                let sessions = &sessions;
                scope.spawn(move || -> Result<(), String> {
                    let path = PathBuf::from(format!("{}.{k}", out.display()));
                    let file = std::fs::File::create(&path)
                        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                    let mut file = std::io::BufWriter::new(file);
                    for n in (k..count).step_by(files as usize) {
                        file.write_all(&signed(sessions, n, timestamp, None))
                            .and_then(|()| file.write_all(b"\n"))
                            .map_err(|e| e.to_string())?;
                    }
                    file.flush().map_err(|e| e.to_string())
                })
            })
            .collect();
        writers.into_iter().try_for_each(|w| {
            w.join()
                .map_err(|_| "a signing thread panicked".to_string())?
        })
    })?;
    println!(
        "envelopes={count} files={files} sign_ms={}",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The value at or below which `p` percent of `sorted` lie (nearest rank); 0 for no samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The outcome of one call: its HTTP status (0 when no answer came) and its latency in µs.
type Sample = (u16, u64);

/// What a call got: its HTTP status (0 when no answer came) and the seconds of its `Retry-After`.
struct Answer {
    status: u16,
    retry_after_secs: Option<u64>,
}

async fn post(client: &reqwest::Client, url: &str, body: Bytes) -> Answer {
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let Ok(response) = sent else {
        return Answer {
            status: 0,
            retry_after_secs: None,
        };
    };
    let status = response.status().as_u16();
    let retry_after_secs = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok()?.parse().ok());
    // Read the whole answer: a call is done when its last byte has arrived.
    Answer {
        status: response.bytes().await.map_or(0, |_| status),
        retry_after_secs,
    }
}

/// The summary line of a set of samples.
fn summary(samples: &[Sample], elapsed: Duration) -> String {
    let non2xx = samples
        .iter()
        .filter(|(status, _)| !(200..300).contains(status))
        .count();
    let mut latencies: Vec<u64> = samples.iter().map(|&(_, us)| us).collect();
    latencies.sort_unstable();
    format!(
        "requests={} non2xx={non2xx} rps={:.0} p50_us={} p99_us={} max_us={}",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(0),
    )
}

/// Open loop: call `n` is due at `start + n / rate` whether or not earlier calls have answered, and its
/// latency counts from that instant, so a stalled gateway shows in the numbers instead of slowing the load.
/// At most `connections` calls are in flight (a call waits for a free one, its wait counted); a call still
/// unsent when the run's time is up is not sent and is reported as unsent.
async fn fixed_rate(
    target: &Target,
    rate: u64,
    secs: u64,
    connections: usize,
) -> Result<(), String> {
    let client = client()?;
    let sessions = register(&client, target).await?;
    let rate = rate.max(1);
    // Dated at the middle of the run, which then lies inside the ±30 s clock window for up to a minute.
    let timestamp = clock::now_secs() + secs as i64 / 2;
    let bodies: Vec<Bytes> = (0..rate * secs)
        .map(|n| Bytes::from(signed(&sessions, n, timestamp, None)))
        .collect();
    let due_calls = bodies.len();
    let url: Arc<str> = format!("{}/v1/invoke", target.gateway).into();
    let slots = Arc::new(tokio::sync::Semaphore::new(connections.max(1)));
    let runtime = tokio::runtime::Handle::current();
    // A thread of its own paces the sends: the runtime's timer ticks in whole milliseconds, a thread's
    // sleep is precise to tens of microseconds.
    let (start, calls) = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let end = start + Duration::from_secs(secs);
        let mut calls = Vec::with_capacity(bodies.len());
        for (n, body) in (0..).zip(bodies) {
            let due = start + Duration::from_nanos(n * 1_000_000_000 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let slot = runtime.block_on(tokio::time::timeout_at(
                end.into(),
                slots.clone().acquire_owned(),
            ));
            let Ok(Ok(slot)) = slot else { break };
            let (client, url) = (client.clone(), url.clone());
            calls.push(runtime.spawn(async move {
                let status = post(&client, &url, body).await.status;
                drop(slot);
                (status, due.elapsed().as_micros() as u64)
            }));
        }
        (start, calls)
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(calls.len());
    for call in calls {
        samples.push(call.await.map_err(|e| e.to_string())?);
    }
    let unsent = due_calls - samples.len();
    println!("unsent={unsent} {}", summary(&samples, start.elapsed()));
    Ok(())
}

/// The disk's own durability cost, as a store's log sees it: append a few bytes, then fdatasync.
fn fsync_times(dir: &Path, count: usize) -> Result<(), String> {
    let path = dir.join(format!("bench-fsync-{}", std::process::id()));
    let mut file = std::fs::File::create(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut micros = Vec::with_capacity(count);
    let measured = (0..count).try_for_each(|_| {
        let t = Instant::now();
        file.write_all(&[b'x'; 64])?;
        file.sync_data()?;
        micros.push(t.elapsed().as_micros() as u64);
        Ok::<_, std::io::Error>(())
    });
    let _ = std::fs::remove_file(&path);
    measured.map_err(|e| format!("fsync probe in {}: {e}", dir.display()))?;
    micros.sort_unstable();
    println!(
        "fsyncs={count} p50_us={} p99_us={}",
        percentile(&micros, 50.0),
        percentile(&micros, 99.0)
    );
    Ok(())
}

/// When a closed loop ends.
enum Stop {
    /// After this many calls in all.
    After(u64),
    /// At this instant (a caller waiting out a `Retry-After` stops waiting then too).
    At(Instant),
}

/// The callers of a closed loop.
struct Callers {
    concurrency: usize,
    /// A caller whose call is shed sleeps what its `Retry-After` says (the sleep is not a sample).
    polite: bool,
    /// Each call carries a random idempotency key.
    keyed: bool,
}

/// Closed loop over many sessions, signing each call just before it is sent (a long soak outlasts the
/// clock window that pre-signed envelopes have). Returns the samples and the time the loop took.
async fn closed_loop(
    target: &Target,
    stop: Stop,
    callers: Callers,
) -> Result<(Vec<Sample>, Duration), String> {
    let Callers {
        concurrency,
        polite,
        keyed,
    } = callers;
    let client = client()?;
    let sessions = Arc::new(register(&client, target).await?);
    let url: Arc<str> = format!("{}/v1/invoke", target.gateway).into();
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(stop);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (client, url, sessions, next, stop) = (
                client.clone(),
                url.clone(),
                sessions.clone(),
                next.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    match *stop {
                        Stop::After(calls) if n >= calls => return samples,
                        Stop::At(end) if Instant::now() >= end => return samples,
                        _ => {}
                    }
                    let t = Instant::now();
                    let key = keyed.then(|| uuid::Uuid::new_v4().to_string());
                    let body = signed(&sessions, n, clock::now_secs(), key);
                    let answer = post(&client, &url, Bytes::from(body)).await;
                    samples.push((answer.status, t.elapsed().as_micros() as u64));
                    if let (true, 503, Some(secs)) =
                        (polite, answer.status, answer.retry_after_secs)
                    {
                        let wake = Instant::now() + Duration::from_secs(secs);
                        let wake = match *stop {
                            Stop::At(end) => wake.min(end),
                            Stop::After(_) => wake,
                        };
                        tokio::time::sleep_until(wake.into()).await;
                    }
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.map_err(|e| e.to_string())?);
    }
    Ok((samples, started.elapsed()))
}

/// What `bench guard` measured: the mean time of one guarded answer of each kind.
struct GuardCost {
    bytes: usize,
    /// The benchmark upstream's own answer (`"ok"`): what the guard adds to every row's calls.
    short: Duration,
    clean: Duration,
    near: Duration,
    matched: Duration,
    matches: u64,
}

/// The answer guard with its defaults and a credential: on the benchmark upstream's short answer, and on
/// a 64 KiB text answer of prose with a URL and a non-ASCII word in each line (so the hidden-character
/// check cannot skip it as ASCII) as it is (nothing to find), with near-matches of the formats in each
/// line (`eyJ…`, `AKIA…`: candidates that the automaton must check and reject), and with a secret, the
/// credential or a zero-width joiner in every kibibyte. Each run guards a fresh copy; only the guard is
/// timed.
fn guard_cost(count: usize) -> Result<GuardCost, String> {
    use crate::guard;
    const SIZE: usize = 64 * 1024;
    let text = |line: &str| {
        let mut text = line.repeat(SIZE / line.len() + 1);
        text.truncate(
            (0..=SIZE)
                .rev()
                .find(|&end| text.is_char_boundary(end))
                .unwrap_or(0),
        );
        text
    };
    let clean = text("The quick brown fox reads https://example.com/docs?page=2 and jumps over the lazy dog — café. ");
    let near = text("The quick brown fox reads https://example.com/docs?page=2 and eyJ-shaped words; AKIA is a prefix — café. ");
    let secrets = [
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",
        "AKIAIOSFODNN7EXAMPLE",
        "bench-credential-value",
        "a\u{200d}b",
    ];
    let mut matched = String::with_capacity(SIZE + 64 * 64);
    let (mut from, mut index) = (0, 0);
    while from < clean.len() {
        // The next kibibyte, ended at a character boundary.
        let mut to = (from + 1024).min(clean.len());
        while !clean.is_char_boundary(to) {
            to += 1;
        }
        matched.push_str(&clean[from..to]);
        matched.push(' ');
        matched.push_str(secrets[index % secrets.len()]);
        matched.push(' ');
        (from, index) = (to, index + 1);
    }
    let gateway = guard::Guard::new(&guard::AnswerGuardConfig::default()).map_err(|e| e.reason)?;
    let credentials =
        guard::Credentials::new(["Bearer bench-credential-value", "bench-credential-value"])?;
    let time = |text: &str| {
        let template = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}});
        let mut spent = Duration::ZERO;
        let mut found = 0;
        for _ in 0..count {
            let mut response = template.clone();
            let started = Instant::now();
            let report = guard::answer(&mut response, Some(&credentials), gateway.rules(None));
            spent += started.elapsed();
            found = report.findings().map(|(_, n, _)| n).sum::<u64>();
            std::hint::black_box(&response);
        }
        (spent / count as u32, found)
    };
    for (name, text) in [("clean", &clean), ("near", &near)] {
        if let (_, found @ 1..) = time(text) {
            return Err(format!("the {name} answer has {found} findings"));
        }
    }
    let (short_time, _) = time("ok");
    let (clean_time, _) = time(&clean);
    let (near_time, _) = time(&near);
    let (matched_time, matches) = time(&matched);
    Ok(GuardCost {
        bytes: clean.len(),
        short: short_time,
        clean: clean_time,
        near: near_time,
        matched: matched_time,
        matches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::Verifier as _;

    #[test]
    fn percentile_is_the_nearest_rank() {
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 50.0), 50);
        assert_eq!(percentile(&hundred, 99.0), 99);
        assert_eq!(percentile(&hundred, 100.0), 100);
        assert_eq!(percentile(&hundred, 0.0), 1);
        assert_eq!(percentile(&[7, 9], 50.0), 7);
        assert_eq!(percentile(&[7, 9], 51.0), 9);
        assert_eq!(percentile(&[5], 99.0), 5);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn a_keyed_soak_call_names_its_idempotency_key_and_an_unkeyed_one_none() {
        let sessions = [Session {
            key: SigningKey::from_bytes(&FLOOR_KEY),
            token: "token".into(),
        }];
        let key_of = |key: Option<String>| {
            let envelope = envelope::parse_envelope(&signed(&sessions, 7, 0, key)).unwrap();
            match envelope::parse_call(&envelope.payload).unwrap() {
                envelope::Call::ToolsCall {
                    idempotency_key, ..
                } => idempotency_key,
                envelope::Call::ToolsList { .. } => panic!("a soak call is a tools/call"),
            }
        };
        assert_eq!(key_of(Some("k-1".into())).as_deref(), Some("k-1"));
        assert_eq!(key_of(None), None);
    }

    async fn serve(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn the_floor_forwards_the_payload_and_signs_the_answer_and_refuses_what_is_no_envelope() {
        let upstream = serve(axum::Router::new().fallback(answer)).await;
        let floor = serve(floor_app(format!("{upstream}/rpc"))).await;
        let client = reqwest::Client::new();
        let envelope = json!({
            "signature": "A".repeat(86) + "==",
            "payload": {"jsonrpc": "2.0", "id": 41, "method": "tools/call"},
        });
        let response = client
            .post(format!("{floor}/v1/invoke"))
            .json(&envelope)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let answered: Value = response.json().await.unwrap();
        assert_eq!(answered["result"]["id"], 41, "{answered}");
        let signature: [u8; 64] = hex::decode(answered["signature"].as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let key = SigningKey::from_bytes(&FLOOR_KEY).verifying_key();
        let signed = serde_json::to_vec(&answered["result"]).unwrap();
        key.verify(&signed, &ed25519_dalek::Signature::from_bytes(&signature))
            .expect("the floor signs the upstream's answer");
        let refused = client
            .post(format!("{floor}/v1/invoke"))
            .json(&json!({"payload": {}}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "no signature");
    }
}

//! The `sealgate` command: the gateway (`serve`), a guided tour (`demo`), key and token helpers (`keygen`,
//! `token`, `sign`, `invoke`), the MCP front door (`connect`), offline policy and audit tools, and a benchmark.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod health;

// glibc's allocator spent about a fifth of the gateway's CPU under concurrent load (arena contention and
// consolidation, measured with perf); mimalloc's per-thread heaps remove most of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sealgate",
    version,
    about = "A security gateway for AI agent tool calls (seal/v1)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// YAML configuration (every key has a default).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Validate the whole configuration (keys, policies, upstreams) and exit without serving.
        #[arg(long)]
        check: bool,
    },
    /// Start a gateway in-process with a demo tool and walk through the whole flow.
    Demo {
        /// Keep the demo's folder (configuration, keys, store, audit file) instead of removing it on exit.
        #[arg(long)]
        keep: bool,
        /// After the tour, keep the gateway (and its console at /console/) running until Ctrl-C.
        #[arg(long)]
        serve: bool,
        /// Serve HTTPS, with a CA and a certificate made for the run (the CA file is in the folder).
        #[arg(long)]
        tls: bool,
    },
    /// Make an Ed25519 key pair (JSON on stdout, or files with --out).
    Keygen(sealgate::envelope::keygen::KeygenArgs),
    /// Mint an operator or agent token (JWT on stdout).
    Token {
        #[command(subcommand)]
        command: sealgate::token::cli::TokenCommand,
    },
    /// Print a signed seal/v1 envelope for a JSON-RPC payload.
    Sign(SignArgs),
    /// Sign a payload and POST it to a gateway; prints the answer.
    Invoke {
        #[command(flatten)]
        sign: SignArgs,
        /// The gateway's base URL (http:// or https://).
        #[arg(long, default_value = "http://127.0.0.1:8089")]
        url: String,
        #[command(flatten)]
        tls: sealgate::tls::client::ClientTls,
    },
    /// The MCP front door: an MCP server (stdio, or Streamable HTTP with --listen) that signs every
    /// tool call for the gateway with the session's key.
    Connect(sealgate::connect::ConnectArgs),
    /// Check, explain or test security contexts offline.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Audit trail tools.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The embedded store: an online backup, an integrity check, and the import of an earlier release's
    /// sled store.
    Store {
        #[command(subcommand)]
        command: sealgate::store::cli::StoreCommand,
    },
    /// Signed receipt tools.
    Receipt {
        #[command(subcommand)]
        command: ReceiptCommand,
    },
    /// List, show, grant and deny approval requests on a gateway (SPEC 13).
    Approvals(sealgate::approval::cli::ApprovalsArgs),
    /// Sign in to a gateway with its identity provider's device flow (RFC 8628); keeps the credential
    /// in the user's configuration folder for the other client commands.
    Login(sealgate::identity::login::LoginArgs),
    /// Exit 0 if the gateway at URL answers 2xx (the container's HEALTHCHECK).
    Health {
        /// The URL to ask (http:// or https://).
        #[arg(long, default_value = "http://127.0.0.1:8089/readyz")]
        url: String,
        #[command(flatten)]
        tls: sealgate::tls::client::ClientTls,
    },
    /// The helpers of scripts/bench.sh (upstream, keys, sessions, envelopes, fixed-rate load).
    Bench {
        #[command(subcommand)]
        command: sealgate::bench::BenchCommand,
    },
}

#[derive(clap::Args)]
struct SignArgs {
    /// The execution's private key: base64 or hex of the 32-byte seed, a PKCS#8 PEM, keygen's JSON, or
    /// @FILE holding one.
    #[arg(long, allow_hyphen_values = true)]
    key: String,
    /// The session's JWT (or @FILE).
    #[arg(long)]
    token: String,
    /// The JSON-RPC payload (or @FILE).
    #[arg(long)]
    payload: String,
    /// Unix seconds to sign (default: now).
    #[arg(long)]
    timestamp: Option<i64>,
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate every context file in DIR (default ./policies); exit 1 on the first invalid one.
    Check { dir: Option<PathBuf> },
    /// Print the decision a call would get, its code and the rule that decided. Exits 0 allowed,
    /// 1 refused, 2 bad usage or invalid policies, 3 allowed after a person's approval.
    Explain {
        #[arg(long)]
        context: String,
        #[arg(long)]
        tool: String,
        #[arg(long, default_value = "{}")]
        args: String,
        #[arg(long, default_value = "policies")]
        policies: PathBuf,
        /// Labels the session is assumed to hold (SPEC 19), comma-separated: how the flow rules decide.
        #[arg(long, value_delimiter = ',')]
        session_labels: Vec<String>,
    },
    /// Run test cases (YAML: `cases: [{name, context, tool, args, session_labels?, expect}]`) against
    /// the policies of DIR (default ./policies), calling nothing. CASES are files or folders of
    /// *.yaml/*.yml files; with two or more arguments the first is DIR. Prints one line per failing
    /// case and `N passed, M failed`; exits 0 when all passed, 1 when one failed, 2 when nothing could
    /// run (bad usage, an unreadable or invalid cases file, invalid policies).
    Test {
        /// `[DIR] CASES…`: with two or more paths the first is the policies folder; each CASES is a
        /// cases file or a folder of them.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Also write a JUnit XML report to FILE (for CI).
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Decide by each context's shadow version (NAME.shadow.yaml) where one exists, as if promoted.
        #[arg(long)]
        shadow: bool,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Verify the hash chain of JSON-lines audit files (archives and an export, as one chain) and, with
    /// --keys, every signed checkpoint; names the first broken event.
    Verify {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The gateway's JWK Set: a file, or the http(s) URL of its /v1/keys.
        #[arg(long)]
        keys: Option<String>,
        /// FILE is a replica's own audit.file (PostgreSQL, SPEC 12): check what such a file can show
        /// (each event's hash, rising seqs, one replica, links between consecutive seqs). It cannot
        /// show that the chain is whole: that is GET /v1/audit/export.
        #[arg(long, conflicts_with = "keys")]
        replica_log: bool,
    },
}

#[derive(Subcommand)]
enum ReceiptCommand {
    /// Verify the signed receipt of a saved /v1/invoke response body (exit 0 only when all holds).
    Verify {
        /// The gateway's JWK Set: a file, or the http(s) URL of its /v1/keys.
        #[arg(long)]
        keys: String,
        /// The response body as saved.
        response: PathBuf,
        /// The envelope that was sent, to check the receipt's payload_sha256.
        #[arg(long)]
        envelope: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread or file exists: everything this process creates is its owner's alone.
    sealgate::files::private_umask();
    // `serve` starts its log from the configuration, once it has read it; `serve --check` only reads
    // the configuration, and its warnings (a SEALGATE_* variable that names no key) go to stderr.
    let log = match cli.command {
        Command::Serve { check: false, .. } => Ok(()),
        Command::Connect(_) => sealgate::logging::start_for_connect(),
        _ => sealgate::logging::start_for_command(),
    };
    if let Err(message) = log {
        eprintln!("sealgate: {message}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli.command));
    match result {
        Ok(code) => code,
        Err(message) => {
            sealgate::logging::fatal(&message);
            ExitCode::FAILURE
        }
    }
}

/// `@FILE` reads the argument from a file.
fn arg_text(value: &str) -> Result<String, String> {
    match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("cannot read {path}: {e}")),
        None => Ok(value.to_string()),
    }
}

fn signed_envelope(args: &SignArgs) -> Result<serde_json::Value, String> {
    let key = sealgate::envelope::signing_key_from_text(&arg_text(&args.key)?)?;
    let token = arg_text(&args.token)?;
    // Read as the gateway will: a duplicate key is refused, not resolved to its last value.
    let payload = sealgate::strict_json::parse_strict_json(arg_text(&args.payload)?.as_bytes())
        .map_err(|e| format!("--payload: {e}"))?;
    let timestamp = args.timestamp.unwrap_or_else(sealgate::clock::now_secs);
    Ok(sealgate::envelope::sign_envelope(
        &key, payload, &token, timestamp,
    ))
}

async fn run(command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Serve {
            config,
            check: true,
        } => return Ok(sealgate::config_check::run(config.as_deref()).await),
        Command::Serve { config, .. } => {
            let config = sealgate::config::Config::load_and_start_log(config.as_deref())?;
            let traces = sealgate::otel::start(&config.telemetry, &config.replica_id)?;
            let served = sealgate::serve::serve(config).await;
            if let Some(traces) = traces {
                traces.stop().await;
            }
            served?;
        }
        Command::Demo { keep, serve, tls } => sealgate::demo::run(keep, serve, tls).await?,
        Command::Connect(args) => return Ok(sealgate::connect::run(args).await),
        Command::Keygen(args) => {
            sealgate::envelope::keygen::run(&args).map_err(|e| e.to_string())?
        }
        Command::Token { command } => sealgate::token::cli::run(command)?,
        Command::Sign(args) => println!("{}", signed_envelope(&args)?),
        Command::Invoke { sign, url, tls } => {
            let envelope = signed_envelope(&sign)?;
            let response = tls
                .client(sealgate::outbound::client_builder())?
                .post(format!("{}/v1/invoke", url.trim_end_matches('/')))
                .json(&envelope)
                .send()
                .await
                .map_err(|e| {
                    let why = sealgate::tls::client::failure(&e.without_url());
                    format!("cannot reach {url}: {why}")
                })?;
            let status = response.status();
            // The envelope and token went to the URL given and nowhere else (SPEC 20 rule 8).
            if status.is_redirection() {
                let why = sealgate::outbound::failed_status(status, response.headers());
                return Err(format!("{url} answered {why}"));
            }
            let body = response.text().await.map_err(|e| e.to_string())?;
            println!("{body}");
            if !status.is_success() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Policy { command } => {
            return Ok(sealgate::policy::cli::run(command_to_policy(command)))
        }
        Command::Audit {
            command:
                AuditCommand::Verify {
                    files,
                    replica_log: true,
                    ..
                },
        } => return Ok(sealgate::evidence::cli::replica_log_verify(&files)),
        Command::Audit {
            command: AuditCommand::Verify { files, keys, .. },
        } => return Ok(sealgate::evidence::cli::audit_verify(&files, keys.as_deref()).await),
        Command::Store { command } => return Ok(sealgate::store::cli::run(command).await),
        Command::Receipt {
            command:
                ReceiptCommand::Verify {
                    keys,
                    response,
                    envelope,
                },
        } => {
            return Ok(sealgate::evidence::cli::receipt_verify(
                &keys,
                &response,
                envelope.as_deref(),
            )
            .await)
        }
        Command::Bench { command } => sealgate::bench::run(command).await?,
        Command::Login(args) => return sealgate::identity::login::run(&args).await,
        Command::Health { url, tls } => return Ok(health::check(&url, &tls).await),
        Command::Approvals(args) => return Ok(sealgate::approval::cli::run(args).await),
    }
    Ok(ExitCode::SUCCESS)
}

fn command_to_policy(command: PolicyCommand) -> sealgate::policy::cli::PolicyCommand {
    match command {
        PolicyCommand::Check { dir } => sealgate::policy::cli::PolicyCommand::Check {
            dir: dir.unwrap_or_else(|| PathBuf::from("policies")),
        },
        PolicyCommand::Explain {
            context,
            tool,
            args,
            policies,
            session_labels,
        } => sealgate::policy::cli::PolicyCommand::Explain {
            context,
            tool,
            args,
            policies,
            session_labels,
        },
        PolicyCommand::Test {
            mut paths,
            junit,
            shadow,
        } => {
            // `[DIR] CASES…`: CASES needs one path at least, so a lone path is CASES.
            let dir = if paths.len() > 1 {
                paths.remove(0)
            } else {
                PathBuf::from("policies")
            };
            sealgate::policy::cli::PolicyCommand::Test {
                dir,
                cases: paths,
                junit,
                shadow,
            }
        }
    }
}

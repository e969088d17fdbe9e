//! `sealgate connect` (SPEC 15): the MCP front door. An MCP server that a host starts like any other
//! (stdio, or Streamable HTTP with `--listen`), holding the session's key and token and signing every
//! call as a `seal/v1` envelope to the gateway. It is a client of the gateway, nothing more: it knows
//! the wire protocol and the crate's envelope code, never the gateway's internals.
//!
//! Never logged, at any level: the key, the token, argument values (rmcp's own message logs, which
//! hold them, are switched off by [`crate::logging::start_for_connect`]).

mod bridge;
mod gateway;
mod reply;
mod token_file;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt as _;

pub use bridge::SERVER_NAME;

use bridge::Bridge;
use gateway::{GatewayClient, Tls};
use token_file::TokenFile;

/// Exit status for a bridge that cannot start (a missing token, a bad key, a bad flag).
const CANNOT_START: u8 = 2;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Serves MCP over stdio (newline-delimited JSON-RPC; logs on stderr), or over Streamable HTTP at
http://ADDR/mcp with --listen. Listen on loopback only: whoever reaches the port calls with the
session's key. Logs never hold the key, the token or argument values (RUST_LOG sets the level).

Exit status: 0 when the host closes the connection, 2 when it cannot start (a missing or empty
token file, an unreadable key, a bad flag).")]
pub struct ConnectArgs {
    /// The gateway's base URL: http://HOST:PORT, or https:// (see --ca-file).
    #[arg(
        long,
        env = "SEALGATE_GATEWAY",
        hide_env_values = true,
        value_name = "URL"
    )]
    gateway: String,
    /// The session's Ed25519 private key (PKCS#8 PEM).
    #[arg(
        long,
        env = "SEALGATE_KEY_FILE",
        hide_env_values = true,
        value_name = "FILE"
    )]
    key: PathBuf,
    /// A file holding the session token (white space around it ignored); read again whenever it
    /// changes, so an orchestrator renews tokens by rewriting it. A rewrite that holds no token is
    /// ignored (the last token stays in use) until the file's next change.
    #[arg(
        long,
        env = "SEALGATE_TOKEN_FILE",
        hide_env_values = true,
        value_name = "FILE"
    )]
    token: PathBuf,
    /// Hold a call that needs a person's approval (4003) for up to SECS seconds: it is sent again
    /// every 2 s (not charged again) until it is decided, with progress notifications to hosts that
    /// ask for them. Without it, 4003 is answered at once.
    #[arg(long, value_name = "SECS")]
    wait_approval: Option<u64>,
    /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8765). A request
    /// whose Origin header names another origin is refused with 403.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// For an https:// gateway: trust this CA bundle (PEM) instead of the system's roots.
    #[arg(long, value_name = "PEM")]
    ca_file: Option<PathBuf>,
    /// For a gateway that asks for mutual TLS: the client certificate chain (PEM).
    #[arg(long, value_name = "PEM", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(long, value_name = "PEM", requires = "client_cert")]
    client_key: Option<PathBuf>,
}

/// Runs the bridge until the host goes away (stdio) or the process is stopped (`--listen`).
pub async fn run(args: ConnectArgs) -> ExitCode {
    let bridge = match build(&args) {
        Ok(bridge) => bridge,
        Err(message) => {
            eprintln!("sealgate connect: {message}");
            return ExitCode::from(CANNOT_START);
        }
    };
    let served = match args.listen {
        Some(addr) => serve_http(bridge, addr).await,
        None => serve_stdio(bridge).await,
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Start(message)) => {
            eprintln!("sealgate connect: {message}");
            ExitCode::from(CANNOT_START)
        }
        Err(Failure::Serve(message)) => {
            eprintln!("sealgate connect: {message}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Start(String),
    Serve(String),
}

fn build(args: &ConnectArgs) -> Result<Bridge, String> {
    let key = crate::envelope::read_signing_key_file(&args.key).map_err(|_| {
        format!(
            "--key {}: not an Ed25519 private key (PKCS#8 PEM)",
            args.key.display()
        )
    })?;
    let token = TokenFile::open(&args.token)?;
    let tls = Tls {
        ca_file: args.ca_file.clone(),
        client_cert: args.client_cert.clone(),
        client_key: args.client_key.clone(),
    };
    let gateway = GatewayClient::new(&args.gateway, key, token, &tls)?;
    tracing::info!(gateway = gateway.shown(), "sealgate connect started");
    Ok(Bridge::new(
        gateway,
        args.wait_approval.map(Duration::from_secs),
    ))
}

async fn serve_stdio(bridge: Bridge) -> Result<(), Failure> {
    let running = bridge
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Failure::Serve(format!("the MCP session did not start: {e}")))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| Failure::Serve(format!("the MCP session ended with an error: {e}")))
}

/// Streamable HTTP at `/mcp`. Only this server's own origin may call from a browser (MCP's rule
/// against DNS rebinding); requests without an `Origin` header (not from a browser) are served.
async fn serve_http(bridge: Bridge, addr: SocketAddr) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Start(format!("--listen {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Failure::Start(format!("--listen {addr}: {e}")))?;
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    hosts.push(local.ip().to_string());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins([format!("http://{local}")]);
    let service = StreamableHttpService::new(
        move || Ok(bridge.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    println!("sealgate connect ready on http://{local}/mcp");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Failure::Serve(format!("the HTTP server stopped: {e}")))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        connect: super::ConnectArgs,
    }

    #[test]
    fn every_variable_of_connect_is_listed_as_not_configuration() {
        let command = Command::command();
        let variables: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_env())
            .map(|name| name.to_string_lossy().into_owned())
            .collect();
        assert_eq!(variables.len(), 3, "{variables:?}");
        for variable in variables {
            assert!(
                crate::config::NOT_CONFIGURATION.contains(&variable.as_str()),
                "{variable}"
            );
        }
    }
}

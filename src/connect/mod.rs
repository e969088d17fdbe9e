//! `sealgate connect` (SPEC 15): the MCP front door. An MCP server that a host starts like any other
//! (stdio, or Streamable HTTP with `--listen`), holding the session's key and token and signing every
//! call as a `seal/v1` envelope to the gateway. It is a client of the gateway, nothing more: it knows
//! the wire protocol and the crate's envelope code, never the gateway's internals.
//!
//! Never logged, at any level: the key, the token, argument values (rmcp's own message logs, which
//! hold them, are switched off by [`crate::logging::start_for_connect`]).

mod bridge;
mod gateway;
mod token_file;

use std::net::{Ipv4Addr, SocketAddr};
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
http://ADDR/mcp with --listen, on loopback only: whoever reaches the port calls with the session's
key. Logs never hold the key, the token or argument values (RUST_LOG sets the level).

Exit status: 0 when the host closes the connection, 2 when it cannot start (a missing or empty
token file, an unreadable key, a bad flag, a --listen address that is not loopback).")]
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
    /// Give up on a call when the gateway has not answered within SECS seconds (connecting
    /// included); the host gets "sealgate is unreachable". A call held by --wait-approval waits
    /// for that first, then its last send gets SECS.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8765). A
    /// loopback address only (127.0.0.0/8, [::1], localhost). A request whose Origin header names
    /// another origin is refused with 403.
    #[arg(long, value_name = "ADDR", value_parser = loopback_address)]
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
    let timeout = Duration::from_secs(args.timeout);
    let gateway = GatewayClient::new(&args.gateway, key, token, &tls, timeout)?;
    tracing::info!(gateway = gateway.shown(), "sealgate connect started");
    Ok(Bridge::new(
        gateway,
        args.wait_approval.map(Duration::from_secs),
    ))
}

/// `--listen`: a loopback address only (SPEC 20 rule 9), since whoever reaches the port calls with
/// the session's key. `localhost` is 127.0.0.1.
fn loopback_address(text: &str) -> Result<SocketAddr, String> {
    let address = match text.strip_prefix("localhost:") {
        Some(port) => port
            .parse::<u16>()
            .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .map_err(|_| format!("{port:?} is not a port number"))?,
        None => text
            .parse::<SocketAddr>()
            .map_err(|_| "not an address and port (e.g. 127.0.0.1:8765)".to_owned())?,
    };
    if address.ip().is_loopback() {
        return Ok(address);
    }
    Err(format!(
        "{} is not a loopback address: whoever reaches the port would call with the session's key, \
         so connect listens on 127.0.0.0/8, [::1] or localhost only. Hosts on other machines reach \
         the gateway as a remote MCP server (seal/v1 section 17, MCP hosts over the network)",
        address.ip()
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
    fn listen_takes_loopback_addresses_only() {
        for loopback in [
            "127.0.0.1:8765",
            "127.8.9.10:0",
            "[::1]:8765",
            "localhost:8765",
        ] {
            assert!(super::loopback_address(loopback).is_ok(), "{loopback}");
        }
        for other in [
            "0.0.0.0:8765",
            "[::]:8765",
            "10.0.0.5:8765",
            "[::ffff:127.0.0.1]:1",
        ] {
            let refused = super::loopback_address(other).unwrap_err();
            assert!(refused.contains("section 17"), "{other}: {refused}");
        }
        assert!(super::loopback_address("localhost:x").is_err());
        assert!(super::loopback_address("example.com:80").is_err());
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

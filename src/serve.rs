//! Running a gateway: binding its listener, the ready line, serving until told to stop, and the drain
//! that follows (calls in flight, the audit trail, MCP children, the store).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::gateway::Gateway;

/// Binds, logs one ready line, serves until SIGTERM/SIGINT, then drains calls in flight.
pub async fn serve(config: Config) -> Result<(), String> {
    crate::api::server::raise_open_file_limit(config.limits.max_connections);
    // TLS files that do not load stop start-up before the store is opened.
    crate::tls::check(config.tls_files())?;
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let gateway = Gateway::build(config).await?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    serve_on(gateway, listener, local, shutdown_signal()).await
}

pub async fn serve_on(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    local: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let app = crate::api::router(gateway.clone());
    let front = crate::api::server::Front::from_config(gateway.config())?;
    let scheme = front.scheme();
    let metrics = crate::api::metrics::start_listener(&gateway).await?;
    tracing::info!(listen = %local, scheme, "sealgate ready");
    // The ready line, on stdout, is how scripts and tests learn the port.
    crate::logging::announce_ready(&format!("{scheme}://{local}"));
    crate::api::server::serve(listener, app, front, shutdown).await;
    crate::api::calls_finished(&gateway).await;
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    gateway.audit().shutdown().await;
    gateway.upstreams().shutdown().await;
    if let Err(e) = gateway.shadows().flush().await {
        tracing::warn!(error = %e, "the last shadow tallies could not be stored at shutdown");
    }
    let store = gateway.store().clone();
    if let Err(e) = store.sync().await {
        tracing::error!(error = %e, "the store could not be synced at shutdown");
    }
    tracing::info!("sealgate stopped");
    Ok(())
}

/// SIGTERM or SIGINT (Ctrl-C): how a gateway, and the demo's, is told to stop.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: draining calls in flight");
}

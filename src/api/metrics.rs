//! /metrics: the Prometheus text with the gauges read at scrape time, on the main listener or, with
//! `metrics.listen`, on a listener of its own (SPEC 11 r3).

use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Code};
use crate::gateway::Gateway;

/// The Prometheus text of this moment: the read gauges set, then everything rendered.
pub async fn scrape(gw: &Gateway) -> Response {
    observe_gateway(gw).await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics().render(),
    )
        .into_response()
}

/// Binds `metrics.listen`, when set, and serves /metrics there (everything else is 404) until the
/// returned task is aborted. A listener that cannot be bound stops start-up, like the main one.
pub async fn start_listener(
    gw: &Arc<Gateway>,
) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
    let Some(listen) = gw.config().metrics.listen.clone() else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("metrics.listen: cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let scraped = gw.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let gw = scraped.clone();
                async move { scrape(&gw).await }
            }),
        )
        .fallback(|| async { ApiError::new(Code::NotFound, "no such endpoint") });
    let task = tokio::spawn(super::server::serve(
        listener,
        app,
        super::server::Front::plain(gw.config()),
        std::future::pending(),
    ));
    tracing::info!(listen = %local, "metrics served on their own listener");
    Ok(Some(task))
}

/// Sets the gauges that are read rather than counted: calls in flight from the admission semaphore, and
/// live sessions and pending claims with one count from the store.
async fn observe_gateway(gw: &Gateway) {
    let in_flight = gw
        .config()
        .limits
        .max_concurrent_calls
        .saturating_sub(gw.call_slots().available_permits());
    metrics::gauge!("sealgate_calls_in_flight").set(in_flight as f64);
    match gw.store().live_counts(crate::clock::now_secs()).await {
        Ok(counts) => {
            metrics::gauge!("sealgate_sessions_live").set(counts.sessions as f64);
            metrics::gauge!("sealgate_claims_pending").set(counts.pending_claims as f64);
            metrics::gauge!("sealgate_approvals_pending").set(counts.pending_approvals as f64);
        }
        // The scrape still answers; the store's own metrics and /readyz say what is wrong.
        Err(e) => tracing::warn!(error = %e, "cannot count sessions and claims for /metrics"),
    }
}

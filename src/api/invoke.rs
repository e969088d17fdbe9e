//! `POST /v1/invoke` (alias `/v1/seal/invoke`): the body read within its size and time limits, admission
//! control, the pipeline on a task of its own, and its outcome as HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{read_body, BodyError};
use crate::error::{ApiError, Code};
use crate::gateway::Gateway;
use crate::pipeline::Outcome;

/// The successful answer of a call.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Documents the answer built below.
struct InvokeSuccess {
    /// Always `seal/v1`.
    protocol: String,
    /// Always `success`.
    status: String,
    /// The tool's JSON-RPC response, with the caller's id.
    payload: serde_json::Map<String, Value>,
    /// What the gateway decided and recorded: claim, action_ref, event_id, context and its version.
    receipt: serde_json::Map<String, Value>,
}

/// An agent's signed call (SPEC 2-3): verified, decided, claimed, forwarded, settled and audited.
/// `/v1/seal/invoke` is the same endpoint under the SPEC's older name.
#[utoipa::path(post, path = "/v1/invoke", tag = "agents",
    request_body(content = Object, description = "A signed seal/v1 envelope (SPEC section 2)"),
    responses(
        (status = 200, description = "The tool's answer and the receipt", body = InvokeSuccess),
        (status = "4XX", description = "Refused: the SPEC code says why (1xxx, 2xxx, 3001, 4xxx)", body = super::openapi::ErrorBody),
        (status = "5XX", description = "Failed: upstream (5001-5004), store (5005) or overload (5006)", body = super::openapi::ErrorBody),
    ))]
pub async fn invoke(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    body: Body,
) -> Response {
    let started = std::time::Instant::now();
    let response = answer(&gw, client, body).await;
    crate::telemetry::observe_request(
        crate::telemetry::RequestOutcome::of(response.status()),
        started.elapsed(),
    );
    response
}

async fn answer(gw: &Arc<Gateway>, client: SocketAddr, body: Body) -> Response {
    let bytes = match read_envelope(gw, client, body).await {
        Ok(bytes) => bytes,
        Err(refusal) => return refusal,
    };
    // Admitted only once the body is in (SPEC 3 r3): clients trickling bodies hold no slot. Shed before
    // any check (SPEC 11 r2): an overloaded gateway keeps its admitted calls fast instead of queueing
    // every call until all are slow. Nothing of a shed call is remembered or charged.
    let Ok(slot) = gw.call_slots().clone().try_acquire_owned() else {
        return shed(gw);
    };
    // The call runs on a task of its own, holding its slot to the end (SPEC 3 r3): a client that hangs
    // up drops this handler, never the call's claim, grant, answer or events. Boxed: the pipeline's
    // future is kilobytes, and each wrapper on its way into the task would copy it again.
    let call = {
        let gw = gw.clone();
        tokio::spawn(crate::trace::carry(Box::pin(async move {
            let outcome = crate::pipeline::invoke(&gw, &bytes, Some(client)).await;
            drop(slot);
            outcome
        })))
    };
    match call.await {
        Ok(outcome) => respond(outcome),
        // Only a bug panics in the pipeline: the connection then ends as it would have in this task.
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// Waits until every admitted call has ended, those whose clients left included, so that each writes
/// its outcome before the gateway stops.
pub async fn calls_finished(gw: &Gateway) {
    let every_slot = u32::try_from(gw.config().limits.max_concurrent_calls).unwrap_or(u32::MAX);
    let _all = gw.call_slots().acquire_many(every_slot).await;
}

/// The body, read within `limits.max_body_bytes` and `limits.body_read_timeout_secs`, or the refusal.
async fn read_envelope(gw: &Gateway, client: SocketAddr, body: Body) -> Result<Bytes, Response> {
    let limits = &gw.config().limits;
    let timeout = Duration::from_secs(limits.body_read_timeout_secs);
    match read_body(body, limits.max_body_bytes, timeout).await {
        Ok(bytes) => Ok(bytes),
        Err(BodyError::TooLarge) => {
            gw.audit()
                .record_unreadable(Some(client), limits.max_body_bytes.saturating_add(1));
            let error = ApiError::new(
                Code::MalformedEnvelope,
                format!(
                    "the body is larger than limits.max_body_bytes ({} bytes) or could not be read",
                    limits.max_body_bytes
                ),
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE);
            Err(refused(error, None))
        }
        Err(BodyError::TimedOut) => {
            let error = ApiError::new(
                Code::MalformedEnvelope,
                "the body did not arrive within limits.body_read_timeout_secs",
            );
            log_refusal(&error, None);
            Err(error.request_timeout())
        }
    }
}

/// 5006 with Retry-After: more calls are in progress than `limits.max_concurrent_calls`.
fn shed(gw: &Gateway) -> Response {
    metrics::counter!("sealgate_calls_shed_total").increment(1);
    gw.audit().count_shed();
    let error = ApiError::new(
        Code::GatewayOverloaded,
        format!(
            "more than limits.max_concurrent_calls ({}) calls are in progress",
            gw.config().limits.max_concurrent_calls
        ),
    )
    .with_retry_after(1);
    refused(error, None)
}

fn respond(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Success { payload, receipt } => {
            tracing::debug!(
                event_id = receipt["event_id"].as_str(),
                trace_id = crate::trace::current_trace_id(),
                "call answered"
            );
            axum::Json(json!({
                "protocol": "seal/v1",
                "status": "success",
                "payload": payload,
                "receipt": receipt,
            }))
            .into_response()
        }
        Outcome::Refused { error, tool } => refused(error, tool.as_deref()),
    }
}

fn refused(error: ApiError, tool: Option<&str>) -> Response {
    log_refusal(&error, tool);
    error.into_response()
}

/// One line per refused call: code, tool and trace id, to join it to the caller's error body and to the
/// audit trail. Not the message: what an agent sent stays out of the log as it stays out of events.
fn log_refusal(error: &ApiError, tool: Option<&str>) {
    tracing::info!(
        code = error.code.number(),
        name = error.code.name(),
        tool,
        trace_id = crate::trace::current_trace_id(),
        "call refused"
    );
}

//! `POST /v1/invoke` (alias `/v1/seal/invoke`): reads the body within the size limit and hands it to the pipeline.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::State;
use crate::error::{ApiError, Code};

pub async fn invoke(
    axum::extract::State(gw): State,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    body: Body,
) -> Response {
    let limit = gw.config.limits.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            gw.audit
                .record_unreadable(Some(client), limit.saturating_add(1));
            return ApiError::new(
                Code::MalformedEnvelope,
                format!("the body is larger than limits.max_body_bytes ({limit} bytes) or could not be read"),
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            .into_response();
        }
    };
    crate::pipeline::invoke(&gw, &bytes, Some(client)).await
}

//! `GET /v1/audit` (SPEC 9.3): the trail, newest first, with filters and a cursor.

use axum::extract::RawQuery;
use axum::response::{IntoResponse, Response};

use super::{Operator, State};
use crate::audit::AuditQuery;
use crate::error::{ApiError, Code};

pub async fn query(
    axum::extract::State(gw): State,
    operator: Operator,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    operator.require("seal.audit.read")?;
    // The audit query itself refuses unknown, repeated and empty parameters.
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let query = AuditQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|m| ApiError::new(Code::InvalidRequest, m))?;
    let page = gw.audit.query(&query).await.map_err(ApiError::store)?;
    Ok(axum::Json(page).into_response())
}

/// `GET /v1/audit/export?from_seq=` (SPEC 9.3 r2): the chain as JSON lines, oldest first, streamed.
pub async fn export(
    axum::extract::State(gw): State,
    operator: Operator,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    operator.require("seal.audit.read")?;
    let params = super::query_params(raw.as_deref(), &["from_seq"])?;
    let from_seq = match params.get("from_seq") {
        None => 1,
        Some(raw) => raw.parse::<u64>().map_err(|_| {
            ApiError::new(
                Code::InvalidRequest,
                "from_seq must be a non-negative integer",
            )
        })?,
    };
    let lines = futures_util::stream::unfold(gw.audit.export(from_seq), |mut rx| async move {
        rx.recv().await.map(|line| (line, rx))
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}

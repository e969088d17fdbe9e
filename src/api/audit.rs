//! `GET /v1/audit` (SPEC 9.3): the trail, newest first, with filters and a cursor.

use axum::extract::RawQuery;
use axum::response::{IntoResponse, Response};

use super::{query_params, Operator, State};
use crate::audit::AuditQuery;
use crate::error::{ApiError, Code};

const PARAMS: &[&str] = &[
    "type",
    "session_id",
    "sub",
    "tool",
    "decision",
    "code",
    "from",
    "to",
    "limit",
    "cursor",
];

pub async fn query(
    axum::extract::State(gw): State,
    operator: Operator,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    operator.require("seal.audit.read")?;
    let params = query_params(raw.as_deref(), PARAMS)?;
    let query =
        AuditQuery::from_params(&params).map_err(|m| ApiError::new(Code::InvalidRequest, m))?;
    let audit = gw.audit.clone();
    let page = tokio::task::spawn_blocking(move || audit.query(&query))
        .await
        .map_err(ApiError::store)?
        .map_err(ApiError::store)?;
    Ok(axum::Json(page).into_response())
}

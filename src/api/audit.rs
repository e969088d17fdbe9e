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
    let audit = gw.audit.clone();
    let page = tokio::task::spawn_blocking(move || audit.query(&query))
        .await
        .map_err(ApiError::store)?
        .map_err(ApiError::store)?;
    Ok(axum::Json(page).into_response())
}

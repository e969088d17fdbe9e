//! Reading a request body within a size limit and a time limit: every endpoint that takes a body does.

/// Why a request body could not be read.
pub enum BodyError {
    /// Larger than `limits.max_body_bytes` (413).
    TooLarge,
    /// Not complete within `limits.body_read_timeout_secs` (408, SPEC 11 r2).
    TimedOut,
}

/// Reads a whole body within a size limit and a time limit.
pub async fn read_body(
    body: axum::body::Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<axum::body::Bytes, BodyError> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::TimedOut),
    }
}

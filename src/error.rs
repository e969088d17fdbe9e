//! The code table of SPEC section 10: every refusal the gateway can give, with its number, name and HTTP
//! status, in one place so that the table and the code cannot drift apart. Which audit event records a
//! code (SPEC 9.1) is the audit module's table (`EventType::recording`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Declares the code table once: the enum, its list, and each code's number, name and HTTP status.
macro_rules! code_table {
    ($($variant:ident => ($number:literal, $name:literal, $status:literal),)*) => {
        /// Every error code of SPEC section 10.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// (number, name, HTTP status) exactly as SPEC section 10 lists them.
            const fn row(self) -> (u16, &'static str, u16) {
                match self {
                    $(Code::$variant => ($number, $name, $status),)*
                }
            }
        }
    };
}
code_table! {
    MalformedEnvelope => (1000, "MALFORMED_ENVELOPE", 400),
    InvalidSignature => (1001, "INVALID_SIGNATURE", 401),
    SignatureVerificationFailed => (1002, "SIGNATURE_VERIFICATION_FAILED", 401),
    TokenExpired => (1003, "TOKEN_EXPIRED", 401),
    TokenVerificationFailed => (1004, "TOKEN_VERIFICATION_FAILED", 401),
    SessionNotFound => (1005, "SESSION_NOT_FOUND", 401),
    SessionInactive => (1006, "SESSION_INACTIVE", 401),
    TimestampOutOfWindow => (1007, "TIMESTAMP_OUT_OF_WINDOW", 401),
    EnvelopeReplayed => (1008, "ENVELOPE_REPLAYED", 401),
    ToolNotAllowed => (2000, "POLICY_VIOLATION_TOOL_NOT_ALLOWED", 403),
    ToolDenied => (2001, "POLICY_VIOLATION_TOOL_DENIED", 403),
    PathNotAllowed => (2002, "POLICY_VIOLATION_PATH_NOT_ALLOWED", 403),
    CommandNotAllowed => (2003, "POLICY_VIOLATION_COMMAND_NOT_ALLOWED", 403),
    DomainNotAllowed => (2004, "POLICY_VIOLATION_DOMAIN_NOT_ALLOWED", 403),
    RateLimitExceeded => (2005, "POLICY_VIOLATION_RATE_LIMIT_EXCEEDED", 429),
    NoMatchingCapability => (2006, "POLICY_VIOLATION_NO_MATCHING_CAPABILITY", 403),
    ResponseTooLarge => (2007, "POLICY_VIOLATION_RESPONSE_TOO_LARGE", 502),
    BudgetExhausted => (2008, "POLICY_VIOLATION_BUDGET_EXHAUSTED", 403),
    ToolDefinitionChanged => (2009, "TOOL_DEFINITION_CHANGED", 403),
    FlowBlocked => (2010, "FLOW_BLOCKED", 403),
    AnswerWithheld => (2011, "ANSWER_WITHHELD", 502),
    AttestationScopeMismatch => (3001, "ATTESTATION_SCOPE_MISMATCH", 401),
    ClaimPending => (4001, "CLAIM_PENDING", 409),
    IdempotencyKeyReused => (4002, "IDEMPOTENCY_KEY_REUSED", 422),
    ApprovalRequired => (4003, "APPROVAL_REQUIRED", 403),
    ApprovalDenied => (4004, "APPROVAL_DENIED", 403),
    UpstreamUnavailable => (5001, "UPSTREAM_UNAVAILABLE", 502),
    UpstreamTimeout => (5002, "UPSTREAM_TIMEOUT", 504),
    UpstreamBadResponse => (5003, "UPSTREAM_BAD_RESPONSE", 502),
    NoRouteForTool => (5004, "NO_ROUTE_FOR_TOOL", 502),
    StoreUnavailable => (5005, "STORE_UNAVAILABLE", 503),
    GatewayOverloaded => (5006, "GATEWAY_OVERLOADED", 503),
    OperatorUnauthenticated => (6001, "OPERATOR_UNAUTHENTICATED", 401),
    OperatorForbidden => (6002, "OPERATOR_FORBIDDEN", 403),
    NotFound => (6003, "NOT_FOUND", 404),
    Conflict => (6004, "CONFLICT", 409),
    InvalidRequest => (6005, "INVALID_REQUEST", 422),
}

impl Code {
    pub const fn number(self) -> u16 {
        self.row().0
    }

    pub const fn name(self) -> &'static str {
        self.row().1
    }

    pub fn status(self) -> StatusCode {
        StatusCode::from_u16(self.row().2).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn from_number(number: u16) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.number() == number)
    }
}

/// The refusal that a capability's path, command or URL check gives (SPEC 6.3): the paths inside an
/// accepted command obey the path check's code.
impl From<&crate::policy::Violation> for Code {
    fn from(violation: &crate::policy::Violation) -> Code {
        use crate::policy::Violation;
        match violation {
            Violation::Path { .. }
            | Violation::NotPath { .. }
            | Violation::Expands { .. }
            | Violation::PathInCommand { .. }
            | Violation::FileUrl { .. } => Code::PathNotAllowed,
            Violation::TwoNamed(_)
            | Violation::NoCommand
            | Violation::EmptyCommand
            | Violation::NotWords { .. }
            | Violation::NotArgv { .. }
            | Violation::Shell { .. }
            | Violation::Word { .. } => Code::CommandNotAllowed,
            Violation::Url { .. } | Violation::NotUrl { .. } => Code::DomainNotAllowed,
        }
    }
}

/// A context body the API cannot load: 6005, the message naming the field (`capabilities[0].tool_pattern: …`).
impl From<crate::policy::PolicyError> for ApiError {
    fn from(error: crate::policy::PolicyError) -> ApiError {
        ApiError::new(Code::InvalidRequest, error.to_string())
    }
}

/// A refusal on its way to the wire: the code, a message naming the problem, optional details and headers.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub details: Option<Value>,
    /// Overrides the table's HTTP status (413 for an oversized body, 400 for a control body that is not JSON).
    pub status: Option<StatusCode>,
    pub retry_after_secs: Option<u64>,
    /// The signed receipt of a refusal after check 8 (SPEC 14), answered as `error.receipt`.
    pub receipt: Option<Value>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: None,
            status: None,
            retry_after_secs: None,
            receipt: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    pub fn with_receipt(mut self, receipt: Value) -> Self {
        self.receipt = Some(receipt);
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// 5005 with the store's own message (a `StoreError` or `AuditError` already says what failed).
    pub fn store(err: impl std::fmt::Display) -> Self {
        ApiError::new(Code::StoreUnavailable, err.to_string())
    }

    /// The error object of SPEC section 10 (without the outer envelope).
    pub fn body(&self) -> Value {
        let mut error = json!({
            "code": self.code.number(),
            "name": self.code.name(),
            "message": self.message,
            "timestamp": crate::clock::rfc3339_millis(crate::clock::now_millis()),
            // The request's trace (its `traceparent`), so the body joins its audit events and log line.
            "trace_id": crate::trace::current_trace_id().unwrap_or_else(crate::trace::new_trace_id),
        });
        if let Some(obj) = error.as_object_mut() {
            if let Some(details) = &self.details {
                obj.insert("details".into(), details.clone());
            }
            if let Some(receipt) = &self.receipt {
                obj.insert("receipt".into(), receipt.clone());
            }
        }
        json!({"protocol": "seal/v1", "status": "error", "error": error})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.code.number(),
            self.code.name(),
            self.message
        )
    }
}

/// Checks 2–4: a token that does not verify is 1004, one outside its lifetime 1003.
impl From<crate::token::TokenError> for ApiError {
    fn from(error: crate::token::TokenError) -> Self {
        let code = match error {
            crate::token::TokenError::Invalid(_) => Code::TokenVerificationFailed,
            crate::token::TokenError::Expired(_) => Code::TokenExpired,
        };
        ApiError::new(code, error.to_string())
    }
}

/// A payload that is not an accepted JSON-RPC request is a malformed envelope (check 9 reads it).
impl From<crate::envelope::PayloadError> for ApiError {
    fn from(error: crate::envelope::PayloadError) -> Self {
        ApiError::new(Code::MalformedEnvelope, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or_else(|| self.code.status());
        crate::otel::refused(
            self.code.number(),
            self.code.name(),
            status.is_server_error(),
        );
        let mut response = (status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        assert_eq!(Code::ALL.len(), 37);
        for &code in Code::ALL {
            assert!(seen.insert(code.number()), "duplicate {}", code.number());
            assert_eq!(Code::from_number(code.number()), Some(code));
        }
        assert_eq!(Code::from_number(1234), None);
    }

    #[test]
    fn statuses_follow_the_spec_table() {
        assert_eq!(Code::MalformedEnvelope.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            Code::RateLimitExceeded.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(Code::ResponseTooLarge.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(Code::UpstreamTimeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            Code::StoreUnavailable.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            Code::InvalidRequest.status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(Code::ClaimPending.status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::IdempotencyKeyReused.status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            Code::GatewayOverloaded.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn error_body_has_the_spec_shape() {
        let body = ApiError::new(Code::PathNotAllowed, "outside /workspace").body();
        assert_eq!(body["protocol"], "seal/v1");
        assert_eq!(body["status"], "error");
        assert_eq!(body["error"]["code"], 2002);
        assert_eq!(body["error"]["name"], "POLICY_VIOLATION_PATH_NOT_ALLOWED");
        assert!(body["error"]["timestamp"].as_str().unwrap().ends_with('Z'));
        assert!(body["error"].get("details").is_none());
    }
}

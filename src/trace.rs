//! W3C Trace Context at the HTTP edge. Every request gets a trace id: the caller's when it sent a valid
//! `traceparent` (so an orchestrator's trace continues through the gateway), else a fresh one. The error
//! body, the audit events and the refusal log line of the request all carry it, and the response's
//! `traceparent` names the gateway's own span within that trace. When traces are exported (`crate::otel`)
//! that span is the exported one: its ids are the ones these carry.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The trace a request belongs to and the gateway's span in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 lower-case hex digits, not all zero.
    trace_id: String,
    /// 16 lower-case hex digits, not all zero: this request's span.
    span_id: String,
    /// The caller's trace flags (sampling), passed on unchanged; 0 for a trace that starts here (the
    /// exported span's flags when traces are exported).
    flags: u8,
}

tokio::task_local! {
    /// The trace of the request this task serves: set once at the edge rather than passed through every
    /// function that may build an error body or an audit event.
    static CURRENT: TraceContext;
}

impl TraceContext {
    /// Continues the trace of a valid `traceparent`, else starts a new one.
    pub fn continue_or_start(traceparent: Option<&str>) -> Self {
        let (trace_id, flags) = traceparent
            .and_then(parse_traceparent)
            .map_or_else(|| (new_trace_id(), 0), |p| (p.trace_id.to_owned(), p.flags));
        TraceContext {
            trace_id,
            span_id: format!("{:016x}", nonzero_random_u64()),
            flags,
        }
    }

    /// The trace of an API request (`/v1/…`) and its exported span, a child of the caller's when
    /// `traceparent` is valid; None when traces are not exported or the request is a probe, a scrape or
    /// the console's.
    fn exported(
        request: &Request,
        traceparent: Option<&str>,
    ) -> Option<(Self, opentelemetry::Context)> {
        if !crate::otel::enabled() {
            return None;
        }
        let route = request.extensions().get::<MatchedPath>()?.as_str();
        if !route.starts_with("/v1/") {
            return None;
        }
        let parent = traceparent
            .and_then(parse_traceparent)
            .map(|p| (p.trace_id, p.parent_id, p.flags));
        let span = crate::otel::request_span(request.method().as_str(), route, parent)?;
        let (trace_id, span_id, flags) = crate::otel::ids(&span);
        let context = TraceContext {
            trace_id,
            span_id,
            flags,
        };
        Some((context, span))
    }

    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The header value that names this gateway's span as the parent of whatever follows.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }
}

/// The trace id of the request being served, if this task serves one.
pub fn current_trace_id() -> Option<String> {
    CURRENT.try_with(|c| c.trace_id.clone()).ok()
}

/// `future`, to run on a task of its own within the trace (and the log span) of the request this task
/// serves: a task-local does not follow a spawned task by itself.
pub fn carry<F: std::future::Future>(future: F) -> impl std::future::Future<Output = F::Output> {
    use tracing::Instrument;
    let context = CURRENT.try_with(TraceContext::clone).ok();
    let future = crate::otel::within(crate::otel::current(), future.in_current_span());
    async move {
        match context {
            Some(context) => CURRENT.scope(context, future).await,
            None => future.await,
        }
    }
}

/// 32 random lower-case hex digits.
pub fn new_trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn nonzero_random_u64() -> u64 {
    // A v4 UUID has fixed version bits in its first half, so that half is never zero.
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// Router middleware: picks the request's trace, serves the request inside it, and answers its
/// `traceparent`. Several `traceparent` headers are as good as none: which one would be the caller's?
pub async fn propagate(request: Request, next: Next) -> Response {
    let mut values = request.headers().get_all(TRACEPARENT).iter();
    let header = match (values.next(), values.next()) {
        (Some(only), None) => only.to_str().ok(),
        _ => None,
    };
    let (context, span) = match TraceContext::exported(&request, header) {
        Some((context, span)) => (context, Some(span)),
        None => (TraceContext::continue_or_start(header), None),
    };
    let traceparent = HeaderValue::from_str(&context.traceparent());
    let answered = span.clone();
    let served = crate::otel::within(span, next.run(request));
    let mut response = CURRENT.scope(context, served).await;
    if let Some(span) = answered {
        crate::otel::answered(&span, response.status().as_u16());
    }
    if let Ok(value) = traceparent {
        response.headers_mut().insert(TRACEPARENT, value);
    }
    response
}

/// The fields of a valid `traceparent` value, borrowed from it.
#[derive(Debug, PartialEq, Eq)]
pub struct Traceparent<'a> {
    pub trace_id: &'a str,
    /// The caller's span.
    pub parent_id: &'a str,
    pub flags: u8,
}

/// The fields of a `traceparent` value (W3C Trace Context, version 00), or None when it is not one. As
/// the recommendation asks, a later version is read for its version-00 fields when it has them in the
/// same places; version `ff` is never valid.
pub fn parse_traceparent(value: &str) -> Option<Traceparent<'_>> {
    let bytes = value.as_bytes();
    let version = value.get(0..2)?;
    if !is_lower_hex(version) || version == "ff" {
        return None;
    }
    let fits = if version == "00" {
        bytes.len() == 55
    } else {
        bytes.len() == 55 || (bytes.len() > 55 && bytes[55] == b'-')
    };
    if !fits || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let (trace_id, parent_id, flags) = (&value[3..35], &value[36..52], &value[53..55]);
    let valid_id = |id: &str| is_lower_hex(id) && id.bytes().any(|b| b != b'0');
    if !valid_id(trace_id) || !valid_id(parent_id) || !is_lower_hex(flags) {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(Traceparent {
        trace_id,
        parent_id,
        flags,
    })
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    /// The trace id and flags that a header gives, when it is valid.
    fn trace_and_flags(value: &str) -> Option<(String, u8)> {
        parse_traceparent(value).map(|p| (p.trace_id.to_owned(), p.flags))
    }

    #[test]
    fn a_valid_version_00_header_gives_its_trace_id_and_flags() {
        let header = format!("00-{TRACE}-00f067aa0ba902b7-01");
        assert_eq!(
            parse_traceparent(&header),
            Some(Traceparent {
                trace_id: TRACE,
                parent_id: "00f067aa0ba902b7",
                flags: 1
            })
        );
        let header = format!("00-{TRACE}-00f067aa0ba902b7-00");
        assert_eq!(trace_and_flags(&header), Some((TRACE.to_owned(), 0)));
    }

    #[test]
    fn malformed_or_all_zero_headers_are_refused() {
        let refused = [
            String::new(),
            "00".to_owned(),
            format!("00-{TRACE}-00f067aa0ba902b7"),
            // All-zero trace id or parent id.
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            // Upper-case hex, short and long fields, other separators.
            format!("00-{}-00f067aa0ba902b7-01", TRACE.to_uppercase()),
            format!("00-{}-00f067aa0ba902b7-01", &TRACE[1..]),
            format!("00-{TRACE}0-00f067aa0ba902b7-01"),
            format!("00-{TRACE}-00f067aa0ba902b7-1"),
            format!("00_{TRACE}-00f067aa0ba902b7-01"),
            format!("00-{TRACE}-00f067aa0ba902b7-0g"),
            // Version 00 has exactly four fields; ff is never a version; a version must be hex.
            format!("00-{TRACE}-00f067aa0ba902b7-01-extra"),
            format!("ff-{TRACE}-00f067aa0ba902b7-01"),
            format!("0x-{TRACE}-00f067aa0ba902b7-01"),
            // Non-ASCII where a separator belongs must not split a character.
            format!("00-{}é-00f067aa0ba902b7-01", &TRACE[..31]),
        ];
        for header in refused {
            assert_eq!(parse_traceparent(&header), None, "{header:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_version_00_fields() {
        let header = format!("01-{TRACE}-00f067aa0ba902b7-01-what-comes-later");
        assert_eq!(trace_and_flags(&header), Some((TRACE.to_owned(), 1)));
        let header = format!("01-{TRACE}-00f067aa0ba902b7-01x");
        assert_eq!(parse_traceparent(&header), None);
    }

    #[test]
    fn the_gateway_continues_a_valid_trace_with_its_own_span_and_else_starts_one() {
        let incoming = format!("00-{TRACE}-00f067aa0ba902b7-01");
        let context = TraceContext::continue_or_start(Some(&incoming));
        assert_eq!(context.trace_id(), TRACE);
        let answered = context.traceparent();
        assert_eq!(trace_and_flags(&answered), Some((TRACE.to_owned(), 1)));
        assert_ne!(&answered[36..52], "00f067aa0ba902b7");

        let fresh = TraceContext::continue_or_start(Some("00-garbage"));
        assert_ne!(fresh.trace_id(), TRACE);
        assert_eq!(
            trace_and_flags(&fresh.traceparent()),
            Some((fresh.trace_id().to_owned(), 0))
        );
    }
}

//! `GET /v1/audit` (SPEC 9.3): query parameters, filtering and cursor pagination over the store.

use std::collections::HashMap;

use chrono::{DateTime, Datelike, Utc};
use serde::Serialize;
use serde_json::Value;

use super::chain::format_at;
use super::event::{Decision, EventType};
use super::AuditBackend;
use crate::error::{ApiError, Code};
use crate::identity::TeamFilter;
use crate::store::StoreError;

/// Default and largest page size.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

/// How many stored events one page may examine. A selective filter over a large store then returns a
/// short page with a cursor instead of scanning everything in one request.
const MAX_SCANNED_PER_PAGE: usize = 100_000;
/// Events read from the store per round trip.
const SCAN_PAGE: usize = 512;

const PARAMS: [&str; 11] = [
    "type",
    "session_id",
    "sub",
    "tool",
    "decision",
    "code",
    "trace_id",
    "from",
    "to",
    "limit",
    "cursor",
];

/// A validated audit query. `from` and `to` bound `at` inclusively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    pub r#type: Option<EventType>,
    pub session_id: Option<String>,
    pub sub: Option<String>,
    pub tool: Option<String>,
    pub decision: Option<Decision>,
    pub code: Option<u16>,
    /// The trace of the request that the events were written for (an extension of SPEC 9.3).
    pub trace_id: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// 1..=1000.
    pub limit: usize,
    /// Opaque to clients: the `seq` below which the next page continues.
    pub cursor: Option<String>,
    /// Events below this seq are not looked at (the checkpoint listing's `from_seq`; not a parameter
    /// of `GET /v1/audit`).
    pub min_seq: Option<u64>,
    /// The teams whose events the caller may read (SPEC 16; not a parameter: the caller's scopes). An
    /// event that names no team (a refusal before any session was found, a checkpoint) is the whole
    /// gateway's, shown only to a caller who may read every team.
    pub teams: TeamFilter,
}

impl Default for AuditQuery {
    fn default() -> Self {
        AuditQuery {
            r#type: None,
            session_id: None,
            sub: None,
            tool: None,
            decision: None,
            code: None,
            trace_id: None,
            from: None,
            to: None,
            limit: DEFAULT_LIMIT,
            cursor: None,
            min_seq: None,
            teams: TeamFilter::Every,
        }
    }
}

/// Why an audit query is refused: a bad parameter (the API answers 6005), or the store failing under it
/// (5005). The messages are the ones clients read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("unknown query parameter {0:?}")]
    Unknown(String),
    #[error("query parameter {0:?} is given more than once")]
    Repeated(String),
    #[error("query parameter {0:?} is empty")]
    Empty(String),
    /// A value that does not read as its parameter's kind; `problem` says how.
    #[error("{name} {value:?} {problem}")]
    Value {
        name: &'static str,
        value: String,
        problem: &'static str,
    },
    /// A `type` or `decision` that names none; the message is the parser's.
    #[error("{0}")]
    Name(String),
    #[error("limit {0:?} is not a number from 1 to {MAX_LIMIT}")]
    LimitNotNumber(String),
    #[error("limit must be from 1 to {MAX_LIMIT}, not {0}")]
    Limit(usize),
    #[error("from lies after to")]
    FromAfterTo,
    #[error("cursor {0:?} is not one this API gave out")]
    Cursor(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An audit query's bad parameter is 6005 with its message; a store that fails under the query, 5005.
/// Here rather than in `error.rs`, which the audit room's events already import (its codes).
impl From<QueryError> for ApiError {
    fn from(error: QueryError) -> ApiError {
        match error {
            QueryError::Store(e) => ApiError::store(e),
            invalid => ApiError::new(Code::InvalidRequest, invalid.to_string()),
        }
    }
}

impl QueryError {
    fn value(name: &'static str, value: &str, problem: &'static str) -> Self {
        QueryError::Value {
            name,
            value: value.to_owned(),
            problem,
        }
    }
}

/// One page of results, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditPage {
    pub items: Vec<Value>,
    /// Pass as `cursor` to get the next page; `null` when the store holds no older events.
    pub next_cursor: Option<String>,
}

impl AuditQuery {
    /// Builds a query from URL query parameters. Unknown or empty parameters, malformed values, a limit
    /// outside 1..=1000 and `from` after `to` are errors (the API answers 6005 / 422).
    pub fn from_params(params: &HashMap<String, String>) -> Result<Self, QueryError> {
        Self::from_pairs(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Like [`AuditQuery::from_params`] for a raw list of pairs, where a repeated parameter is an error
    /// (a map would keep one of them silently).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, QueryError> {
        let mut query = AuditQuery::default();
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in pairs {
            let Some(known) = PARAMS.iter().copied().find(|p| *p == key) else {
                return Err(QueryError::Unknown(key.to_owned()));
            };
            if seen.contains(&known) {
                return Err(QueryError::Repeated(key.to_owned()));
            }
            seen.push(known);
            if value.is_empty() {
                return Err(QueryError::Empty(key.to_owned()));
            }
            match known {
                "type" => query.r#type = Some(value.parse().map_err(QueryError::Name)?),
                "session_id" => query.session_id = Some(value.to_owned()),
                "sub" => query.sub = Some(value.to_owned()),
                "tool" => query.tool = Some(value.to_owned()),
                "decision" => query.decision = Some(value.parse().map_err(QueryError::Name)?),
                "code" => {
                    let code = value
                        .parse::<u16>()
                        .map_err(|_| QueryError::value("code", value, "is not a code number"))?;
                    query.code = Some(code);
                }
                "trace_id" => query.trace_id = Some(parse_trace_id(value)?),
                "from" => query.from = Some(parse_instant("from", value)?),
                "to" => query.to = Some(parse_instant("to", value)?),
                "limit" => {
                    query.limit = value
                        .parse::<usize>()
                        .map_err(|_| QueryError::LimitNotNumber(value.to_owned()))?;
                }
                "cursor" => query.cursor = Some(value.to_owned()),
                _ => return Err(QueryError::Unknown(key.to_owned())),
            }
        }
        query.validate()?;
        Ok(query)
    }

    /// Checks the limits that a hand-built query could break.
    pub fn validate(&self) -> Result<(), QueryError> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(QueryError::Limit(self.limit));
        }
        if let (Some(from), Some(to)) = (self.from, self.to) {
            if from > to {
                return Err(QueryError::FromAfterTo);
            }
        }
        self.cursor_seq()?;
        Ok(())
    }

    fn cursor_seq(&self) -> Result<Option<u64>, QueryError> {
        match &self.cursor {
            None => Ok(None),
            Some(cursor) => match cursor.parse::<u64>() {
                Ok(seq) if seq >= 1 && cursor.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(seq)),
                _ => Err(QueryError::Cursor(cursor.clone())),
            },
        }
    }

    /// Runs the query against a store, a page of the store at a time.
    pub(crate) async fn run(&self, backend: &dyn AuditBackend) -> Result<AuditPage, QueryError> {
        self.validate()?;
        let mut before = self.cursor_seq()?;
        // `at` is fixed-width UTC, so comparing the strings compares the instants.
        let from = self.from.map(format_at);
        let to = self.to.map(format_at);
        let mut items = Vec::new();
        let mut scanned = 0usize;
        let mut last_seq: Option<u64> = None;
        let mut stopped_early = false;
        'pages: loop {
            let page_size = (MAX_SCANNED_PER_PAGE - scanned).min(SCAN_PAGE);
            let page = backend.events_newest_first(before, page_size).await?;
            let exhausted = page.len() < page_size;
            for event in page {
                let seq = event.get("seq").and_then(Value::as_u64);
                if seq.zip(self.min_seq).is_some_and(|(seq, min)| seq < min) {
                    break 'pages;
                }
                scanned += 1;
                last_seq = seq;
                if self.matches(&event, from.as_deref(), to.as_deref()) {
                    items.push(event);
                }
                if items.len() >= self.limit || scanned >= MAX_SCANNED_PER_PAGE {
                    stopped_early = true;
                    break 'pages;
                }
            }
            // A page without a readable seq gives no place to continue from.
            match last_seq {
                Some(seq) if !exhausted && before != Some(seq) => before = Some(seq),
                _ => break,
            }
        }
        // Nothing lies below seq 1 (or `min_seq`), so a page that ends there has no successor.
        let floor = self.min_seq.unwrap_or(1).max(1);
        let next_cursor = match last_seq {
            Some(seq) if stopped_early && seq > floor => Some(seq.to_string()),
            _ => None,
        };
        Ok(AuditPage { items, next_cursor })
    }

    fn matches(&self, event: &Value, from: Option<&str>, to: Option<&str>) -> bool {
        let text = |key: &str| event.get(key).and_then(Value::as_str);
        let equals = |key: &str, wanted: Option<&str>| wanted.is_none_or(|w| text(key) == Some(w));
        let readable = match text("team") {
            Some(team) => self.teams.admits(team),
            None => self.teams == TeamFilter::Every,
        };
        readable
            && equals("type", self.r#type.map(EventType::as_str))
            && equals("session_id", self.session_id.as_deref())
            && equals("sub", self.sub.as_deref())
            && equals("tool", self.tool.as_deref())
            && equals("decision", self.decision.map(Decision::as_str))
            && equals("trace_id", self.trace_id.as_deref())
            && self.code.is_none_or(|code| {
                event.get("code").and_then(Value::as_u64) == Some(u64::from(code))
            })
            && from.is_none_or(|from| text("at").is_some_and(|at| at >= from))
            && to.is_none_or(|to| text("at").is_some_and(|at| at <= to))
    }
}

/// Every recorded trace id has the W3C form; a value that does not could only match nothing, so it is
/// refused as the typo it probably is.
fn parse_trace_id(value: &str) -> Result<String, QueryError> {
    let hex = value
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if value.len() == 32 && hex {
        Ok(value.to_owned())
    } else {
        Err(QueryError::value(
            "trace_id",
            value,
            "is not 32 lower-case hex digits",
        ))
    }
}

const OUT_OF_RANGE: &str = "is out of range";

/// Unix seconds (an integer) or an RFC 3339 timestamp.
fn parse_instant(name: &'static str, value: &str) -> Result<DateTime<Utc>, QueryError> {
    let instant = parse_instant_unchecked(name, value)?;
    // Bounds are compared as fixed-width text, which holds for four-digit years only.
    if !(0..=9999).contains(&instant.year()) {
        return Err(QueryError::value(name, value, OUT_OF_RANGE));
    }
    Ok(instant)
}

fn parse_instant_unchecked(name: &'static str, value: &str) -> Result<DateTime<Utc>, QueryError> {
    let digits = value.strip_prefix('-').unwrap_or(value);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<i64>()
            .ok()
            .and_then(|secs| DateTime::from_timestamp(secs, 0))
            .ok_or_else(|| QueryError::value(name, value, OUT_OF_RANGE));
    }
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            QueryError::value(
                name,
                value,
                "is neither Unix seconds nor an RFC 3339 timestamp",
            )
        })
}

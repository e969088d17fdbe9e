//! The hash chain of SPEC 9.2: sealing events into it and verifying exports and the store.
//!
//! `hash` = hex(SHA-256(JCS(event without `hash`))), `prev_hash` = the previous event's `hash` (64 zeros
//! before the first). Sealing stores the event exactly as JCS reads it back, so what is stored is what was
//! hashed even for numbers that JCS rounds (integers beyond 2^53).

use std::fmt;
use std::io::BufRead;

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Map, Value};

use super::event::{is_sha256_hex, EventType, Unsealed, CHAIN_KEYS};
use super::{AuditBackend, ChainHead, InvalidEvent, Recorded};
use crate::envelope::{write_string, write_value};
use crate::store::StoredEvent;
use crate::strict_json::{self, exact_in_jcs};

pub use crate::store::GENESIS_HASH;

/// The layout of `at`: RFC 3339, UTC, exactly three fraction digits.
const AT_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.3fZ";

/// Formats an instant as an event's `at` (`2026-11-30T10:00:00.000Z`): [`AT_FORMAT`]'s layout, without
/// parsing that format for every event.
pub fn format_at(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Whether `text` is exactly an `at` in the layout [`format_at`] writes.
pub(crate) fn is_valid_at(text: &str) -> bool {
    text.len() == 24
        && NaiveDateTime::parse_from_str(text, AT_FORMAT)
            .map(|parsed| format_at(parsed.and_utc()) == text)
            .unwrap_or(false)
}

/// hex(SHA-256(JCS(event))) of an event object that holds no `hash` key, and the event as JCS reads it
/// back (identical unless it held numbers JCS cannot write exactly).
fn canonical_hash(event: Map<String, Value>) -> Result<(String, Value), String> {
    let canonical = crate::envelope::jcs_object(&event);
    let hash = crate::envelope::sha256_hex(&canonical);
    // Strings and integers within ±(2^53−1) read back exactly as JCS writes them; only another number
    // may read back differently, so only then is the event read back, by the same reader as `verify`,
    // so that sealing and verifying cannot disagree on a number.
    if event.values().all(exact_in_jcs) {
        return Ok((hash, Value::Object(event)));
    }
    let normalised = strict_json::parse_strict_json_with(&canonical, strict_json::AUDIT_LINES)
        .map_err(|e| format!("canonical event does not read back: {e}"))?;
    Ok((hash, normalised))
}

/// Where an event is chained: the chain fields that [`seal`] adds to it.
pub(crate) struct Link<'a> {
    pub(crate) seq: u64,
    pub(crate) prev_hash: &'a str,
    pub(crate) at: &'a str,
    /// The writer's `replica_id` (SPEC 12), when it has one.
    pub(crate) replica: Option<&'a str>,
}

/// A chained event as the file and standard output take it: its JSON line (the stored event's text), and
/// how it links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub(crate) line: String,
    pub(crate) seq: u64,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
}

impl Sealed {
    /// A stored event as the file takes it; None when it lacks `seq`, `prev_hash` or `hash`.
    pub(crate) fn of_stored(event: &Value) -> Option<Sealed> {
        let text = |key: &str| event.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Sealed {
            line: event.to_string(),
            seq: event.get("seq").and_then(Value::as_u64)?,
            prev_hash: text("prev_hash")?,
            hash: text("hash")?,
        })
    }
}

/// A chain field's value, as [`seal`] writes it.
enum ChainField<'a> {
    Text(&'a str),
    Number(u64),
    /// The hash, written once the rest is hashed.
    Hash,
    Absent,
}

/// Adds the chain fields to an event and hashes it: the event's members are already in JCS order, so its
/// JCS bytes are written once, and hashed without the `hash` member. Returns the event as the copies
/// and as the store take it, and the caller's receipt.
pub(crate) fn seal(
    event: &Unsealed,
    link: &Link<'_>,
) -> Result<(Sealed, StoredEvent, Recorded), InvalidEvent> {
    let event_id = uuid::Uuid::new_v4().to_string();
    let fields = [
        ChainField::Text(link.at),
        ChainField::Text(&event_id),
        ChainField::Hash,
        ChainField::Text(link.prev_hash),
        link.replica.map_or(ChainField::Absent, ChainField::Text),
        ChainField::Number(link.seq),
    ];
    let mut out = Vec::with_capacity(event.members.len() + 320);
    out.push(b'{');
    let mut hash_at = 0;
    let mut from = 0;
    for ((key, gap), field) in CHAIN_KEYS.iter().zip(event.gaps).zip(fields) {
        out.extend_from_slice(event.members.get(from..gap).unwrap_or_default());
        from = gap;
        match field {
            ChainField::Text(text) => {
                chain_key(&mut out, key);
                write_string(&mut out, text);
                out.push(b',');
            }
            ChainField::Number(number) => {
                chain_key(&mut out, key);
                write_value(&mut out, &Value::from(number));
                out.push(b',');
            }
            ChainField::Hash => hash_at = out.len(),
            ChainField::Absent => {}
        }
    }
    out.extend_from_slice(event.members.get(from..).unwrap_or_default());
    // `seq` is always written, so the bytes end with a member's comma: it closes the object instead.
    if let Some(last) = out.last_mut() {
        *last = b'}';
    }
    let hash = crate::envelope::sha256_hex(&out);
    // `prev_hash` and `seq` always follow `hash`, so its member ends with a comma.
    let hash_member = format!("\"hash\":\"{hash}\",");
    out.splice(hash_at..hash_at, hash_member.into_bytes());
    let line = String::from_utf8(out).map_err(|_| InvalidEvent::NotUtf8)?;
    let line = read_back(
        line,
        event.plain && link.seq <= strict_json::MAX_SAFE_INTEGER,
    )?;
    let stored = StoredEvent {
        line: line.clone(),
        head: ChainHead {
            seq: link.seq,
            hash: hash.clone(),
        },
        labels: event.labels.clone(),
    };
    let sealed = Sealed {
        line,
        seq: link.seq,
        prev_hash: link.prev_hash.to_owned(),
        hash: hash.clone(),
    };
    let recorded = Recorded {
        event_id,
        seq: link.seq,
        at: link.at.to_owned(),
        hash,
    };
    Ok((sealed, stored, recorded))
}

/// The sealed event's text as the store keeps it: what JCS reads back, so that what is stored is what
/// was hashed even for numbers that JCS rounds (integers beyond 2^53). A `plain` event's line reads back
/// exactly and is already the text serde_json writes of it (the store's text before it took lines);
/// any other is read by the strict reader of `verify`, so that sealing and verifying cannot disagree on
/// a number, and written as serde_json writes it.
fn read_back(line: String, plain: bool) -> Result<String, InvalidEvent> {
    if plain {
        return Ok(line);
    }
    strict_json::parse_strict_json_with(line.as_bytes(), strict_json::AUDIT_LINES)
        .map(|stored| stored.to_string())
        .map_err(InvalidEvent::ReadBack)
}

fn chain_key(out: &mut Vec<u8>, key: &str) {
    write_string(out, key);
    out.push(b':');
}

/// What a verified chain (a file or the store) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// How many events were checked.
    pub events: u64,
    /// `seq` of the first (oldest) event; 0 for an empty store.
    pub first_seq: u64,
    /// `seq` of the last (newest) event; 0 for an empty store.
    pub last_seq: u64,
    /// `prev_hash` of the first event: 64 zeros for a chain that starts at seq 1, the hash of the
    /// previous file's last event for a rotated file (compare the two to join files).
    pub first_prev_hash: String,
    /// `hash` of the last event (compare with the store's head to detect a truncated export).
    pub last_hash: String,
}

/// The first event that breaks the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// 1-based line of the file; for [`super::AuditLog::verify_store`], the 1-based position counted
    /// from the newest event; 0 when no event was read (an empty file, an unreadable store).
    pub line: usize,
    pub seq: Option<u64>,
    pub event_id: Option<String>,
    pub reason: String,
}

impl fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "audit chain broken at line {}", self.line)?;
        if let Some(seq) = self.seq {
            write!(f, ", seq {seq}")?;
        }
        if let Some(event_id) = &self.event_id {
            write!(f, ", event_id {event_id}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ChainBreak {}

/// The chain fields of one event whose own hash has been checked.
pub(crate) struct Linked {
    pub(crate) seq: u64,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
}

/// One line of a JSON-lines file read strictly, with the event's own form and hash checked.
pub(crate) fn read_event(
    line_number: usize,
    line: std::io::Result<String>,
) -> Result<(Value, Linked), ChainBreak> {
    let at_line = |reason: String| ChainBreak {
        line: line_number,
        seq: None,
        event_id: None,
        reason,
    };
    let line = line.map_err(|e| at_line(format!("line cannot be read: {e}")))?;
    let event = parse_strict(&line).map_err(at_line)?;
    let linked = check_event(&event).map_err(|(seq, event_id, reason)| ChainBreak {
        line: line_number,
        seq,
        event_id,
        reason,
    })?;
    Ok((event, linked))
}

/// Checks one event on its own: required fields and their forms, canonical numbers, and its hash.
/// On failure returns the event's seq and id as far as they could be read, and why.
fn check_event(event: &Value) -> Result<Linked, (Option<u64>, Option<String>, String)> {
    let Some(object) = event.as_object() else {
        return Err((None, None, "the event is not a JSON object".to_owned()));
    };
    let seq = object.get("seq").and_then(Value::as_u64);
    let event_id = object
        .get("event_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let fail = |reason: String| (seq, event_id.clone(), reason);

    let Some(seq_value) = seq.filter(|s| *s >= 1) else {
        return Err(fail("seq is missing or not a positive integer".to_owned()));
    };
    match event_id.as_deref().map(uuid::Uuid::parse_str) {
        Some(Ok(_)) => {}
        _ => return Err(fail("event_id is missing or not a UUID".to_owned())),
    }
    match object.get("at").and_then(Value::as_str) {
        Some(at) if is_valid_at(at) => {}
        _ => {
            return Err(fail(
                "at is missing or not RFC 3339 UTC with milliseconds".to_owned(),
            ))
        }
    }
    match object.get("type").and_then(Value::as_str) {
        Some(name) if name.parse::<EventType>().is_ok() => {}
        _ => return Err(fail("type is missing or not an event type".to_owned())),
    }
    let prev_hash = match object.get("prev_hash").and_then(Value::as_str) {
        Some(prev) if is_sha256_hex(prev) => prev.to_owned(),
        _ => {
            return Err(fail(
                "prev_hash is missing or not 64 lower-case hex digits".to_owned(),
            ))
        }
    };
    let stated_hash = match object.get("hash").and_then(Value::as_str) {
        Some(hash) if is_sha256_hex(hash) => hash.to_owned(),
        _ => {
            return Err(fail(
                "hash is missing or not 64 lower-case hex digits".to_owned(),
            ))
        }
    };

    let mut unhashed = object.clone();
    unhashed.remove("hash");
    let (computed, normalised) = canonical_hash(unhashed.clone()).map_err(&fail)?;
    // A number that JCS would rewrite (say 9007199254740993 for ...992) leaves the hash unchanged, so
    // only the canonical spelling is accepted.
    if normalised != Value::Object(unhashed) {
        return Err(fail("a number is not in its canonical form".to_owned()));
    }
    if computed != stated_hash {
        return Err(fail("hash does not match the event's content".to_owned()));
    }
    Ok(Linked {
        seq: seq_value,
        prev_hash,
        hash: stated_hash,
    })
}

/// Verifies a JSON-lines export (one event per line, oldest first), as `sealgate audit verify FILE`.
///
/// Every line's hash is recomputed, each `prev_hash` must equal the previous line's `hash`, and `seq` must
/// rise by exactly 1; a first line that is not seq 1 (a rotated file) is accepted and its `prev_hash` is
/// reported. Lines are parsed strictly: a repeated key or trailing text is a break. An empty file is
/// refused, since a file truncated to nothing would otherwise pass.
pub fn verify_chain<R: BufRead>(reader: R) -> Result<VerifyReport, ChainBreak> {
    let mut walker = ChainWalker::default();
    for (index, line) in reader.lines().enumerate() {
        let line_number = index + 1;
        walker.push_line(line, line_number)?;
    }
    walker.finish()
}

/// Follows one chain an event at a time, as [`verify_chain`] does, so that several files (archives
/// followed by an export) can be checked as one chain and each event looked at further by the caller.
#[derive(Debug, Default)]
pub struct ChainWalker {
    report: Option<VerifyReport>,
}

impl ChainWalker {
    /// Checks the next line (its own hash, and its link to the line before); returns its event.
    pub fn push_line(
        &mut self,
        line: std::io::Result<String>,
        line_number: usize,
    ) -> Result<Value, ChainBreak> {
        let (event, linked) = read_event(line_number, line)?;
        let broken = |reason: String| ChainBreak {
            line: line_number,
            seq: Some(linked.seq),
            event_id: event
                .get("event_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            reason,
        };
        match self.report.as_mut() {
            None => {
                let starts_store = linked.seq == 1;
                let genesis = linked.prev_hash == GENESIS_HASH;
                if starts_store != genesis {
                    return Err(broken(if starts_store {
                        "seq 1 must have a prev_hash of 64 zeros".to_owned()
                    } else {
                        "only seq 1 may have a prev_hash of 64 zeros".to_owned()
                    }));
                }
                self.report = Some(VerifyReport {
                    events: 1,
                    first_seq: linked.seq,
                    last_seq: linked.seq,
                    first_prev_hash: linked.prev_hash,
                    last_hash: linked.hash,
                });
            }
            Some(report) => {
                let expected_seq = report.last_seq.checked_add(1);
                if Some(linked.seq) != expected_seq {
                    return Err(broken(format!(
                        "seq {} follows seq {} (expected {})",
                        linked.seq,
                        report.last_seq,
                        report.last_seq.saturating_add(1)
                    )));
                }
                if linked.prev_hash != report.last_hash {
                    return Err(broken(
                        "prev_hash is not the hash of the previous line's event".to_owned(),
                    ));
                }
                report.events += 1;
                report.last_seq = linked.seq;
                report.last_hash = linked.hash;
            }
        }
        Ok(event)
    }

    /// What the chain held; refused when it held no event.
    pub fn finish(self) -> Result<VerifyReport, ChainBreak> {
        self.report.ok_or_else(|| ChainBreak {
            line: 0,
            seq: None,
            event_id: None,
            reason: "the file holds no events".to_owned(),
        })
    }
}

/// Events read from the store per round trip while verifying.
const VERIFY_PAGE: usize = 512;

/// Walks a store from its head down to seq 1 (see [`super::AuditLog::verify_store`]).
pub(crate) async fn verify_backend(backend: &dyn AuditBackend) -> Result<VerifyReport, ChainBreak> {
    let unreadable = |e: crate::store::StoreError| ChainBreak {
        line: 0,
        seq: None,
        event_id: None,
        reason: format!("the store cannot be read: {e}"),
    };
    let Some(head) = backend.head().await.map_err(unreadable)? else {
        return Ok(VerifyReport {
            events: 0,
            first_seq: 0,
            last_seq: 0,
            first_prev_hash: GENESIS_HASH.to_owned(),
            last_hash: GENESIS_HASH.to_owned(),
        });
    };
    let mut expected_seq = head.seq;
    let mut expected_hash = head.hash.clone();
    let mut position = 0usize;
    // Events appended after the head was read are left out, so the walk sees one consistent chain.
    let mut before = head.seq.checked_add(1);
    // Stop at seq 1: anything the store still holds below it is reported as extra.
    while expected_seq > 0 {
        let page = backend
            .events_newest_first(before, VERIFY_PAGE)
            .await
            .map_err(unreadable)?;
        let exhausted = page.len() < VERIFY_PAGE;
        for event in &page {
            if expected_seq == 0 {
                break;
            }
            position += 1;
            let event_id = event
                .get("event_id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let linked = check_event(event).map_err(|(seq, event_id, reason)| ChainBreak {
                line: position,
                seq,
                event_id,
                reason,
            })?;
            let reason = if linked.seq != expected_seq {
                Some(format!(
                    "found seq {} where seq {expected_seq} belongs",
                    linked.seq
                ))
            } else if linked.hash != expected_hash {
                Some("hash is not the prev_hash of the next event (or the store's head)".to_owned())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(ChainBreak {
                    line: position,
                    seq: Some(linked.seq),
                    event_id,
                    reason,
                });
            }
            expected_seq -= 1;
            expected_hash = linked.prev_hash;
            before = Some(linked.seq);
        }
        if exhausted {
            break;
        }
    }
    if expected_seq != 0 {
        return Err(ChainBreak {
            line: position,
            seq: Some(expected_seq),
            event_id: None,
            reason: format!(
                "events from seq {expected_seq} down to seq 1 are missing from the store"
            ),
        });
    }
    if expected_hash != GENESIS_HASH {
        return Err(ChainBreak {
            line: position,
            seq: Some(1),
            event_id: None,
            reason: "seq 1 does not have a prev_hash of 64 zeros".to_owned(),
        });
    }
    Ok(VerifyReport {
        events: head.seq,
        first_seq: 1,
        last_seq: head.seq,
        first_prev_hash: GENESIS_HASH.to_owned(),
        last_hash: head.hash,
    })
}

/// Parses one line as JSON with the strict reader of request bodies, under its audit-line rules: a
/// repeated key (a reader that keeps the first of two `seq` keys would otherwise see another event than
/// the one that was hashed), trailing text, a lone surrogate or a non-finite number is a break.
pub(crate) fn parse_strict(line: &str) -> Result<Value, String> {
    strict_json::parse_strict_json_with(line.as_bytes(), strict_json::AUDIT_LINES)
        .map_err(|e| format!("line is not valid JSON: {e}"))
}

#[cfg(test)]
mod reader_tests {
    use super::*;
    use crate::audit::AuditEvent;
    use crate::strict_json::{parse_strict_json, MAX_DEPTH};

    /// Lines that an envelope body's reader refuses for reasons other than integer range and depth,
    /// the two rules that audit lines relax (see `strict_json`).
    const REFUSED: &[&str] = &[
        r#"{"seq":1,"seq":2}"#,
        r#"{"a":{"k":1,"\u006b":2}}"#,
        r#"{"tool":"\ud800"}"#,
        r#"{"tool":"\udc00"}"#,
        "{\"tool\":\"\u{1}\"}",
        r#"{"n":1e400}"#,
        r#"{"n":-1e400}"#,
        r#"{"n":01}"#,
        r#"{"n":NaN}"#,
        r#"{"seq":1} {"seq":2}"#,
        r#"{"seq":1,}"#,
        "",
    ];

    #[test]
    fn lines_are_refused_exactly_as_the_envelope_reader_refuses_them() {
        for line in REFUSED {
            let Err(strict) = parse_strict_json(line.as_bytes()) else {
                panic!("the envelope reader accepts {line}")
            };
            assert_eq!(
                parse_strict(line),
                Err(format!("line is not valid JSON: {strict}"))
            );
        }
    }

    #[test]
    fn the_documented_differences_are_integer_range_and_depth() {
        // JCS writes the double 2^53 as plain digits, so a chain the gateway wrote can hold it.
        assert!(parse_strict_json(b"[9007199254740992]").is_err());
        assert_eq!(
            parse_strict("[9007199254740992]"),
            Ok(Value::from(vec![9_007_199_254_740_992_u64]))
        );
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(parse_strict_json(deep.as_bytes()).is_err());
        assert!(parse_strict(&deep).is_ok());
    }

    #[test]
    fn verify_names_the_line_that_only_a_lenient_reader_would_accept() {
        let sealed = |seq: u64, prev_hash: &str| {
            let event = AuditEvent::new(EventType::SessionCreated)
                .into_unsealed(false)
                .unwrap();
            let link = Link {
                seq,
                prev_hash,
                at: "2026-11-30T10:00:00.000Z",
                replica: None,
            };
            match seal(&event, &link) {
                Ok((sealed, _, recorded)) => (sealed.line, recorded.hash),
                Err(error) => panic!("cannot seal: {error}"),
            }
        };
        let (first, first_hash) = sealed(1, GENESIS_HASH);
        let (second, _) = sealed(2, &first_hash);
        // The same key twice (serde_json's Value keeps the last one) and a lone surrogate.
        for bad in [
            second.replacen("{", "{\"seq\":1,", 1),
            second.replacen("{", "{\"x\":\"\\udead\",", 1),
        ] {
            let file = format!("{first}\n{bad}\n");
            let broken = verify_chain(std::io::Cursor::new(file)).err();
            assert_eq!(broken.as_ref().map(|b| b.line), Some(2), "{bad}");
            assert!(broken.is_some_and(|b| b.reason.starts_with("line is not valid JSON")));
        }
        let intact = verify_chain(std::io::Cursor::new(format!("{first}\n{second}\n")));
        assert_eq!(intact.map(|report| report.events), Ok(2));
    }
}

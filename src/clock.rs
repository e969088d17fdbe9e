//! Wall-clock helpers: one place that reads the time and one format for instants on the wire
//! (RFC 3339, UTC, exactly three fraction digits, `Z`), as receipts and audit events require.

use chrono::{DateTime, SecondsFormat, Utc};

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    Utc::now().timestamp_millis()
}

/// Whole seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    now_millis().div_euclid(1000)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a millisecond instant.
pub fn rfc3339_millis(millis: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(millis)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a whole-second instant.
pub fn rfc3339_secs(secs: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parses an RFC 3339 instant into whole Unix seconds, rounded down.
pub fn parse_rfc3339_secs(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp())
}

/// Which way a time with a fraction of a second is rounded: toward the stricter reading of the rule it
/// feeds (an expiry earlier, a start later).
#[derive(Clone, Copy)]
pub enum Round {
    Down,
    Up,
}

/// Unix seconds written as a JSON number, perhaps with a fraction (RFC 7519's NumericDate), as whole
/// seconds; None when it is not finite or lies beyond ±10^15 s.
pub fn whole_seconds(number: &serde_json::Number, round: Round) -> Option<i64> {
    if let Some(whole) = number.as_i64() {
        return Some(whole);
    }
    let seconds = number
        .as_f64()
        .filter(|s| s.is_finite() && s.abs() < 1e15)?;
    let rounded = match round {
        Round::Down => seconds.floor(),
        Round::Up => seconds.ceil(),
    };
    // Within ±10^15, so the conversion is exact.
    Some(rounded as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_exactly_three_fraction_digits() {
        assert_eq!(
            rfc3339_millis(1_782_640_800_000),
            "2026-06-28T10:00:00.000Z"
        );
        assert_eq!(
            rfc3339_millis(1_782_640_800_007),
            "2026-06-28T10:00:00.007Z"
        );
        assert_eq!(rfc3339_secs(1_782_640_800), "2026-06-28T10:00:00Z");
    }

    #[test]
    fn parses_and_rounds_down() {
        assert_eq!(
            parse_rfc3339_secs("2026-02-17T14:32:01.583Z"),
            Some(1_771_338_721)
        );
        assert_eq!(parse_rfc3339_secs("1969-12-31T23:59:59.500Z"), Some(-1));
        assert_eq!(parse_rfc3339_secs("yesterday"), None);
    }
}

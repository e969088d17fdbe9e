//! What the store's replay records cover (SPEC 3 check 8, SPEC 20 rule 3). A record is kept for the clock
//! window it was written with, so after a start with a wider `max_clock_skew_secs` the records written
//! before cover less than the new window accepts: until every envelope accepted before that start has
//! left the wider window, an envelope older than the narrower window gets 1007, never a second run.

use serde::{Deserialize, Serialize};

/// The window that the store's replay records cover, as the last start left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCover {
    /// The `max_clock_skew_secs` that records are written with since the last start.
    pub skew_secs: i64,
    /// After a start with a wider window than the records covered: that narrower window.
    pub narrowed: Option<Narrowed>,
}

/// A narrower window that the records written before the last start cover, until `until_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Narrowed {
    pub secs: i64,
    pub until_ms: i64,
}

impl ReplayCover {
    /// The cover after a start at `now_ms` with `skew_secs`, given the store's cover before it (None: a
    /// store that holds no records of another window).
    pub fn at_start(before: Option<ReplayCover>, skew_secs: i64, now_ms: i64) -> ReplayCover {
        let covered = before.map_or(skew_secs, |before| before.covered_secs(now_ms));
        // An envelope accepted before now carries a timestamp at most `covered` s ahead of now; it
        // leaves the new window `skew_secs` s after that.
        let narrowed = (skew_secs > covered).then(|| Narrowed {
            secs: covered,
            until_ms: now_ms.saturating_add(
                covered
                    .saturating_add(skew_secs)
                    .saturating_add(1)
                    .saturating_mul(1000),
            ),
        });
        ReplayCover {
            skew_secs,
            narrowed,
        }
    }

    /// The narrower window that an envelope's age must keep to at `now_ms`, while one is in force.
    pub fn narrowed_secs(&self, now_ms: i64) -> Option<i64> {
        self.narrowed
            .filter(|narrowed| now_ms < narrowed.until_ms)
            .map(|narrowed| narrowed.secs)
    }

    /// The window that every record covers at `now_ms`.
    fn covered_secs(&self, now_ms: i64) -> i64 {
        self.narrowed_secs(now_ms)
            .map_or(self.skew_secs, |secs| secs.min(self.skew_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wider_start_narrows_until_the_older_records_are_out_of_the_wider_window() {
        let first = ReplayCover::at_start(None, 2, 0);
        assert_eq!(first.narrowed, None);
        let wider = ReplayCover::at_start(Some(first), 60, 10_000);
        // Envelopes accepted before 10 000 carry timestamps up to 12 s; the 60 s window lets them in
        // until 72 s inclusive.
        assert_eq!(wider.narrowed_secs(10_000), Some(2));
        assert_eq!(wider.narrowed_secs(72_999), Some(2));
        assert_eq!(wider.narrowed_secs(73_000), None);
    }

    #[test]
    fn a_restart_during_the_narrowing_keeps_it_and_a_narrower_start_needs_none() {
        let wider = ReplayCover::at_start(Some(ReplayCover::at_start(None, 2, 0)), 60, 10_000);
        let again = ReplayCover::at_start(Some(wider), 60, 20_000);
        assert_eq!(again.narrowed_secs(20_000), Some(2));
        assert_eq!(again.narrowed_secs(82_999), Some(2));
        let narrower = ReplayCover::at_start(Some(wider), 1, 20_000);
        assert_eq!(narrower.narrowed, None);
        // The same window again, once the narrowing is over: nothing to narrow.
        let later = ReplayCover::at_start(Some(wider), 60, 73_000);
        assert_eq!(later.narrowed, None);
    }
}

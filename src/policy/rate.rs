//! Rate limits as a generic cell rate algorithm (GCRA): one stored number per session and capability (the
//! theoretical arrival time), so a limit of `calls` per `per_seconds` admits a burst of `calls` and then
//! one call per `per_seconds / calls`, and the check is a single compare-and-set in the store.

/// A compiled `rate_limit: {calls, per_seconds}`; times are microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    interval_us: i64,
    tolerance_us: i64,
}

impl Gcra {
    pub fn new(calls: u32, per_seconds: u32) -> Gcra {
        let period_us = i64::from(per_seconds.max(1)) * 1_000_000;
        let interval_us = period_us / i64::from(calls.max(1));
        Gcra {
            interval_us,
            tolerance_us: period_us - interval_us,
        }
    }

    /// Given the stored arrival time (None for a fresh limit), admits the call and returns the new one,
    /// or refuses with the milliseconds to wait.
    pub fn admit(&self, stored_us: Option<i64>, now_ms: i64) -> Result<i64, i64> {
        let now_us = now_ms.saturating_mul(1000);
        let tat = stored_us.unwrap_or(now_us).max(now_us);
        let ahead = tat - now_us;
        if ahead > self.tolerance_us {
            Err((ahead - self.tolerance_us).div_euclid(1000).max(1))
        } else {
            Ok(tat + self.interval_us)
        }
    }

    /// Gives back one admitted call (used when a later check refused it).
    pub fn refund(&self, stored_us: i64) -> i64 {
        stored_us - self.interval_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_a_burst_then_one_per_interval() {
        let gcra = Gcra::new(3, 60);
        let now = 1_000_000;
        let mut stored = None;
        for _ in 0..3 {
            stored = Some(gcra.admit(stored, now).expect("within the burst"));
        }
        let wait = gcra.admit(stored, now).unwrap_err();
        assert_eq!(
            wait, 20_000,
            "the fourth call waits one interval (60 s / 3)"
        );
        assert!(gcra.admit(stored, now + 19_999).is_err());
        assert!(gcra.admit(stored, now + 20_000).is_ok());
    }

    #[test]
    fn a_refund_restores_one_slot() {
        let gcra = Gcra::new(1, 10);
        let stored = gcra.admit(None, 0).unwrap();
        assert!(gcra.admit(Some(stored), 0).is_err());
        assert!(gcra.admit(Some(gcra.refund(stored)), 0).is_ok());
    }

    #[test]
    fn idle_time_does_not_bank_more_than_the_burst() {
        let gcra = Gcra::new(2, 1);
        let stored = gcra.admit(None, 0).unwrap();
        let later = 3_600_000;
        let a = gcra.admit(Some(stored), later).unwrap();
        let b = gcra.admit(Some(a), later).unwrap();
        assert!(gcra.admit(Some(b), later).is_err());
    }
}

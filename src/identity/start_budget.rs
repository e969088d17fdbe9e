//! How many sign-ins may start. Starting one needs no credential, yet it writes to the store (the
//! sign-in in progress, synced) and may ask the provider: a flood of starts must not become a flood of
//! syncs that slows every call. A token bucket per process: a burst, then a steady rate.

use std::sync::Mutex;
use std::time::Instant;

/// Starts allowed at once.
const BURST: f64 = 60.0;
/// Starts allowed per second after the burst: far more people than sign in at one gateway at once.
const PER_SECOND: f64 = 5.0;

pub struct StartBudget {
    /// Starts left, and when they were counted.
    left: Mutex<(f64, Instant)>,
}

impl Default for StartBudget {
    fn default() -> Self {
        StartBudget {
            left: Mutex::new((BURST, Instant::now())),
        }
    }
}

impl StartBudget {
    /// Takes one start, or answers false when the budget is spent for now.
    pub fn take(&self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> bool {
        let mut left = self
            .left
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tokens, since) = *left;
        let refilled =
            (tokens + now.saturating_duration_since(since).as_secs_f64() * PER_SECOND).min(BURST);
        let allowed = refilled >= 1.0;
        *left = (if allowed { refilled - 1.0 } else { refilled }, now);
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_steady_rate() {
        let budget = StartBudget::default();
        let start = Instant::now();
        let burst = (0..100).filter(|_| budget.take_at(start)).count();
        assert_eq!(burst, BURST as usize);
        assert!(!budget.take_at(start + Duration::from_millis(100)));
        assert!(budget.take_at(start + Duration::from_millis(300)));
        assert!(!budget.take_at(start + Duration::from_millis(300)));
        let later = start + Duration::from_secs(3600);
        assert_eq!(
            (0..100).filter(|_| budget.take_at(later)).count(),
            BURST as usize
        );
    }
}

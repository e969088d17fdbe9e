//! Rate limits (SPEC 6.3 r2): a capability's `rate_limit` becomes a [`SlidingWindow`] (`crate::window`),
//! kept per session and capability under [`cell_key`], and a refusal's wait becomes a `Retry-After`.

use super::model::RateLimit;
use crate::window::SlidingWindow;

impl From<RateLimit> for SlidingWindow {
    fn from(limit: RateLimit) -> SlidingWindow {
        SlidingWindow::new(limit.calls.get(), i64::from(limit.per_seconds.get()) * 1000)
    }
}

/// The key of the window that a capability keeps per session: one per (session, context, capability),
/// the capability named by its [identity](super::model::Capability::identity), never its position.
pub fn cell_key(session_id: &str, context: &str, capability: &str) -> String {
    format!("rate\0{session_id}\0{context}\0{capability}")
}

/// The `Retry-After` of a 2005: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(wait_ms: i64) -> u64 {
    u64::try_from(wait_ms).unwrap_or(0).div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn two_per_four_seconds_never_admits_a_third_within_four_seconds() {
        // The operator's reading of `calls: 2, per_seconds: 4` (issue 10, item 7).
        let window = SlidingWindow::from(RateLimit {
            calls: NonZeroU32::MIN.saturating_add(1),
            per_seconds: NonZeroU32::MIN.saturating_add(3),
        });
        let mut state = None;
        let mut run = |now: i64| -> Result<(), i64> {
            state = Some(window.admit(state.as_deref(), now)?);
            Ok(())
        };
        assert_eq!(run(10_000), Ok(()));
        assert_eq!(run(13_000), Ok(()));
        assert_eq!(run(13_999), Err(1));
        assert_eq!(run(10_001), Err(3_999));
        // The first admission leaves the window 4 s after it was made.
        assert_eq!(run(14_000), Ok(()));
        assert_eq!(run(16_999), Err(1));
        assert_eq!(run(17_000), Ok(()));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(999), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(-5), 1);
    }

    proptest! {
        /// Any wait a window gives (at least 1 ms) becomes the fewest whole seconds that cover it.
        #[test]
        fn retry_after_is_the_wait_in_whole_seconds(wait in 1i64..10_000_000) {
            let secs = retry_after_secs(wait);
            prop_assert!(secs >= 1 && secs * 1000 >= wait as u64);
            prop_assert!((secs - 1) * 1000 < wait as u64);
        }
    }
}

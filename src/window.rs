//! A sliding window of admissions (SPEC 6.3 r2): no interval of `per_ms` ever admits more than `calls`
//! calls, whatever their timing. What a policy's `rate_limit` compiles to (`crate::policy::rate`), and what
//! the stores charge; it knows nothing of either.
//!
//! The window is pure: its state is a short byte string (the admission times, in milliseconds, of the
//! last `calls` admitted calls, as ascending big-endian `i64`s) that the store keeps per session and
//! capability and updates with a compare-and-set, so parallel calls on any replica see every admission.

/// Bytes per stored admission time.
const ENTRY: usize = 8;

/// At most `calls` admissions in any `per_ms` milliseconds; a policy's `rate_limit` compiles to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    calls: usize,
    per_ms: i64,
}

impl SlidingWindow {
    /// At most `calls` admissions in any `per_ms` milliseconds (both taken as at least 1).
    pub fn new(calls: u32, per_ms: i64) -> SlidingWindow {
        SlidingWindow {
            calls: usize::try_from(calls.max(1)).unwrap_or(usize::MAX),
            per_ms: per_ms.max(1),
        }
    }

    /// Admits a call at `now_ms` given the stored state (`None` for a limit never used), returning
    /// the state to store; or refuses it with the milliseconds until a call would be admitted (≥ 1).
    ///
    /// A call is admitted when fewer than `calls` stored admissions lie after `now_ms - per_ms`. Stored
    /// times later than `now_ms` (another replica's clock ahead) count too, which keeps the guarantee
    /// for calls that arrive out of order.
    pub fn admit(&self, state: Option<&[u8]>, now_ms: i64) -> Result<Vec<u8>, i64> {
        let mut times = self.decode(state.unwrap_or_default());
        let horizon = now_ms.saturating_sub(self.per_ms);
        if times.len() >= self.calls {
            // Only the last `calls` admissions are kept, so the window is full exactly when the oldest
            // of them is still inside it; the call becomes possible when that one leaves the window.
            let oldest = times[0];
            if oldest > horizon {
                return Err(oldest.saturating_sub(horizon).max(1));
            }
            times.remove(0);
        }
        let at = times.partition_point(|&time| time <= now_ms);
        times.insert(at, now_ms);
        Ok(encode(&times))
    }

    /// Gives back the admission made at `admitted_at_ms` (the budget refused that call after this limit
    /// admitted it). The entry becomes `admitted_at_ms - per_ms` rather than vanishing: it stands in
    /// for the older admission that `admit` may have dropped to make room, and no call made at or after
    /// `admitted_at_ms` can see it inside its window. A state without that entry is returned unchanged.
    pub fn refund(&self, state: &[u8], admitted_at_ms: i64) -> Vec<u8> {
        let mut times = self.decode(state);
        if let Some(found) = times.iter().position(|&time| time == admitted_at_ms) {
            times.remove(found);
            let stand_in = admitted_at_ms.saturating_sub(self.per_ms);
            let at = times.partition_point(|&time| time <= stand_in);
            times.insert(at, stand_in);
        }
        encode(&times)
    }

    /// Whether an admission made at `admitted_at_ms` still counts in the window at `now_ms`.
    pub fn holds(&self, admitted_at_ms: i64, now_ms: i64) -> bool {
        admitted_at_ms > now_ms.saturating_sub(self.per_ms)
    }

    /// Whether no stored admission lies inside the window at `now_ms`: the state can then be forgotten.
    pub fn is_empty_at(&self, state: &[u8], now_ms: i64) -> bool {
        !self
            .decode(state)
            .iter()
            .any(|&time| self.holds(time, now_ms))
    }

    /// The stored times, ascending, at most `calls` of them (the latest: a lowered limit keeps the
    /// most recent admissions). A trailing partial entry, which only a damaged store could hold, is
    /// dropped so that the next admission writes a well-formed state again.
    fn decode(&self, state: &[u8]) -> Vec<i64> {
        let mut times: Vec<i64> = state
            .chunks_exact(ENTRY)
            .map(|chunk| {
                let mut bytes = [0; ENTRY];
                bytes.copy_from_slice(chunk);
                i64::from_be_bytes(bytes)
            })
            .collect();
        times.sort_unstable();
        let excess = times.len().saturating_sub(self.calls);
        times.drain(..excess);
        times
    }
}

fn encode(times: &[i64]) -> Vec<u8> {
    times.iter().flat_map(|time| time.to_be_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn run(window: &SlidingWindow, state: &mut Option<Vec<u8>>, now: i64) -> Result<(), i64> {
        let next = window.admit(state.as_deref(), now)?;
        *state = Some(next);
        Ok(())
    }

    #[test]
    fn a_burst_fills_the_window_and_idle_time_banks_nothing() {
        let window = SlidingWindow::new(3, 60_000);
        let mut state = None;
        for _ in 0..3 {
            assert_eq!(run(&window, &mut state, 0), Ok(()));
        }
        assert_eq!(run(&window, &mut state, 0), Err(60_000));
        // After an hour, again exactly three.
        for _ in 0..3 {
            assert_eq!(run(&window, &mut state, 3_600_000), Ok(()));
        }
        assert_eq!(run(&window, &mut state, 3_600_000), Err(60_000));
    }

    #[test]
    fn state_is_the_last_admissions_in_big_endian() {
        let window = SlidingWindow::new(2, 1_000);
        let mut state = None;
        for now in [5, 2_000, 4_000] {
            assert_eq!(run(&window, &mut state, now), Ok(()));
        }
        let expected: Vec<u8> = [2_000i64, 4_000]
            .iter()
            .flat_map(|t| t.to_be_bytes())
            .collect();
        assert_eq!(state, Some(expected));
    }

    #[test]
    fn a_refund_frees_the_slot_it_took() {
        let window = SlidingWindow::new(1, 10_000);
        let state = window.admit(None, 0).unwrap_or_default();
        assert_eq!(window.admit(Some(&state), 5), Err(9_995));
        let refunded = window.refund(&state, 0);
        assert!(window.admit(Some(&refunded), 5).is_ok());
        // Refunding a time that was never admitted changes nothing.
        assert_eq!(window.refund(&state, 7), state);
    }

    #[test]
    fn a_refund_keeps_the_admission_it_pushed_out() {
        // `admit` at 6 000 drops the admission at 5 000; refunding 6 000 must not forget that one,
        // or a call stamped 4 500 (a replica whose clock is behind) would share a window with it.
        let window = SlidingWindow::new(1, 1_000);
        let state = window.admit(None, 5_000).unwrap_or_default();
        let state = window.admit(Some(&state), 6_000).unwrap_or_default();
        let refunded = window.refund(&state, 6_000);
        assert!(window.admit(Some(&refunded), 4_500).is_err());
        assert!(window.admit(Some(&refunded), 6_000).is_ok());
    }

    #[test]
    fn lowering_the_limit_keeps_the_latest_admissions() {
        let wide = SlidingWindow::new(3, 1_000);
        let mut state = None;
        for now in [0, 10, 20] {
            assert_eq!(run(&wide, &mut state, now), Ok(()));
        }
        let narrow = SlidingWindow::new(1, 1_000);
        assert_eq!(narrow.admit(state.as_deref(), 30), Err(990));
    }

    #[test]
    fn a_damaged_state_does_not_stick() {
        let window = SlidingWindow::new(1, 1_000);
        let mut damaged = 0i64.to_be_bytes().to_vec();
        damaged.push(7);
        assert_eq!(window.admit(Some(&damaged), 500), Err(500));
        let state = window.admit(Some(&damaged), 1_000).unwrap_or_default();
        assert_eq!(state, 1_000i64.to_be_bytes().to_vec());
    }

    /// Admissions that stay counted: for each window start at an admission, how many lie in
    /// `[start, start + per)`; the largest such count is the most any window holds.
    fn fullest_window(admitted: &[i64], per: i64) -> usize {
        admitted
            .iter()
            .map(|&start| {
                admitted
                    .iter()
                    .filter(|&&t| t >= start && t - start < per)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    proptest! {
        /// Calls in time order (several may share a millisecond), some refunded right after their
        /// admission: no window holds more than `calls`, a refusal happens only when the window is full,
        /// and the wait it gives is exact.
        #[test]
        fn exact_for_calls_in_time_order(
            calls in 1u32..5,
            per in 1i64..5_000,
            steps in proptest::collection::vec((0i64..3_000, any::<bool>()), 1..60),
        ) {
            let window = SlidingWindow::new(calls, per);
            let mut state: Option<Vec<u8>> = None;
            let mut admitted: Vec<i64> = Vec::new();
            let mut now = 1_000_000;
            for (gap, refund) in steps {
                now += gap;
                match window.admit(state.as_deref(), now) {
                    Ok(next) => {
                        if refund {
                            state = Some(window.refund(&next, now));
                        } else {
                            state = Some(next);
                            admitted.push(now);
                        }
                    }
                    Err(wait) => {
                        let in_window = admitted.iter().filter(|&&t| t > now - per).count();
                        prop_assert_eq!(in_window, calls as usize, "refused at {} with room", now);
                        prop_assert!(wait >= 1);
                        prop_assert!(window.admit(state.as_deref(), now + wait - 1).is_err());
                        prop_assert!(window.admit(state.as_deref(), now + wait).is_ok());
                    }
                }
                prop_assert!(fullest_window(&admitted, per) <= calls as usize);
            }
        }

        /// Calls stamped in any order (replicas whose clocks disagree), with refunds: still no window
        /// holds more than `calls` admissions.
        #[test]
        fn never_overfull_for_calls_in_any_order(
            calls in 1u32..5,
            per in 1i64..5_000,
            steps in proptest::collection::vec((0i64..20_000, any::<bool>()), 1..60),
        ) {
            let window = SlidingWindow::new(calls, per);
            let mut state: Option<Vec<u8>> = None;
            let mut admitted: Vec<i64> = Vec::new();
            for (now, refund) in steps {
                if let Ok(next) = window.admit(state.as_deref(), now) {
                    if refund {
                        state = Some(window.refund(&next, now));
                    } else {
                        state = Some(next);
                        admitted.push(now);
                    }
                }
                prop_assert!(fullest_window(&admitted, per) <= calls as usize);
            }
        }
    }
}

//! What the embedded store keeps in memory instead of on disk (issue 20): the replay records of SPEC 3
//! check 8 and the rate windows of SPEC 6.3. Both would otherwise be a random write per call; both can be
//! rebuilt at start-up from the audit chain, whose events carry every envelope signature that passed check 7
//! and every call a capability charged (see `crate::recovery`). Budget counts are kept here too, but only
//! in front of their table, so that a call need not wait for the writer thread to charge one.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::window::SlidingWindow;

/// Envelope signatures whose clock window has not passed. A signature is kept by its first 16 bytes: Ed25519's
/// `R` half, a hash output, so two envelopes share them only by a 2^-128 chance (and then the second is
/// refused, never admitted twice). Each entry is those bytes and the whole second its window ends in: 20
/// bytes, where a `u128` key and a millisecond `i64` took 32 (a `u128` is aligned to 16). At 5,000 calls a
/// second and a 30 s skew the set holds about 300,000 entries, about 11 MB at its largest.
#[derive(Default)]
pub struct ReplaySet {
    seen: Mutex<HashMap<[u8; 16], u32>>,
}

impl ReplaySet {
    /// Remembers `signature` until `expires_at_ms`; false when it was remembered already.
    pub fn remember(&self, signature: &[u8], expires_at_ms: i64) -> bool {
        let key = Self::key(signature);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Self::ends_in_second(expires_at_ms));
                true
            }
        }
    }

    /// Forgets the signatures whose window has passed; returns how many.
    pub fn purge(&self, now_ms: i64) -> usize {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let before = seen.len();
        seen.retain(|_, ends| i64::from(*ends) * 1000 >= now_ms);
        before - seen.len()
    }

    fn key(signature: &[u8]) -> [u8; 16] {
        let mut prefix = [0u8; 16];
        let n = signature.len().min(16);
        prefix[..n].copy_from_slice(&signature[..n]);
        prefix
    }

    /// The second that `expires_at_ms` falls in, rounded up: a record is kept up to a second longer than
    /// its window, never shorter. Seconds fit a `u32` until 2106.
    fn ends_in_second(expires_at_ms: i64) -> u32 {
        let secs = expires_at_ms.div_euclid(1000) + i64::from(expires_at_ms.rem_euclid(1000) > 0);
        u32::try_from(secs.max(0)).unwrap_or(u32::MAX)
    }
}

/// The sliding windows of every (session, context, capability) that has a rate limit, by cell key, each
/// with the window it was last charged under.
#[derive(Default)]
pub struct RateWindows {
    cells: Mutex<HashMap<String, (SlidingWindow, Vec<u8>)>>,
}

impl RateWindows {
    /// Admits a call at `now_ms` or refuses it with the milliseconds to wait (see [`SlidingWindow::admit`]).
    pub fn admit(&self, key: &str, window: &SlidingWindow, now_ms: i64) -> Result<(), i64> {
        let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        let state = cells.get(key).map(|(_, state)| state.as_slice());
        let next = window.admit(state, now_ms)?;
        cells.insert(key.to_owned(), (*window, next));
        Ok(())
    }

    /// Gives back the admission made at `admitted_at_ms` (the budget refused the call).
    pub fn refund(&self, key: &str, window: &SlidingWindow, admitted_at_ms: i64) {
        let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, state)) = cells.get_mut(key) {
            *state = window.refund(state, admitted_at_ms);
        }
    }

    /// Forgets the windows that no longer hold an admission at `now_ms` (their sessions went quiet).
    pub fn purge(&self, now_ms: i64) {
        let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        cells.retain(|_, (window, state)| !window.is_empty_at(state, now_ms));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The budget counts of the sessions calling now, and the changes to them that the counters table does not
/// hold yet. A call is charged here; the store's writer takes the unwritten changes before each request it
/// applies and before each commit ([`BudgetCounts::take_unwritten`]), so the table never runs ahead of
/// these counts, a read through the writer sees every charge made before it, and the commit that makes a
/// call's event durable holds its charge. A charge wakes nobody. A count is loaded from the table (through
/// the writer) on a key's first call; past `BUDGETS_KEPT` keys all are dropped and loaded again as calls
/// come.
#[derive(Default)]
pub struct BudgetCounts {
    state: Mutex<Budgets>,
}

#[derive(Default)]
struct Budgets {
    counts: HashMap<String, i64>,
    /// What each key's count moved by since the writer last took it.
    unwritten: HashMap<String, i64>,
}

impl Budgets {
    fn add(&mut self, key: &str, change: i64) {
        match self.unwritten.get_mut(key) {
            Some(pending) => *pending += change,
            None => {
                self.unwritten.insert(key.to_owned(), change);
            }
        }
    }
}

/// Keys of sessions that ended stay until this many are kept; a reload costs one read per session.
const BUDGETS_KEPT: usize = 65_536;

impl BudgetCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Budgets> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges one call to `key` unless it holds `max` already: `Some(true)` charged, `Some(false)` used
    /// up, `None` when the count is not loaded (load it, then ask again).
    pub fn charge(&self, key: &str, max: u64) -> Option<bool> {
        let mut budgets = self.lock();
        let count = budgets.counts.get_mut(key)?;
        if u64::try_from(*count).is_ok_and(|used| used >= max) {
            return Some(false);
        }
        *count += 1;
        budgets.add(key, 1);
        Some(true)
    }

    /// Gives one call back (its claim was not written).
    pub fn refund(&self, key: &str) {
        let mut budgets = self.lock();
        if let Some(count) = budgets.counts.get_mut(key) {
            *count -= 1;
        }
        budgets.add(key, -1);
    }

    /// Takes `count`, read from the table, as `key`'s count unless a call loaded it meanwhile.
    pub fn load(&self, key: &str, count: i64) {
        let mut budgets = self.lock();
        if budgets.counts.len() >= BUDGETS_KEPT && !budgets.counts.contains_key(key) {
            budgets.counts.clear();
        }
        budgets.counts.entry(key.to_owned()).or_insert(count);
    }

    /// Forgets `key`'s count (the table was set directly).
    pub fn forget(&self, key: &str) {
        self.lock().counts.remove(key);
    }

    /// The changes the table does not hold yet, by key, now handed to the writer; `None` when there are
    /// none.
    pub fn take_unwritten(&self) -> Option<HashMap<String, i64>> {
        let mut budgets = self.lock();
        budgets.unwritten.retain(|_, change| *change != 0);
        (!budgets.unwritten.is_empty()).then(|| std::mem::take(&mut budgets.unwritten))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_remembered_once_until_its_window_passes() {
        let replay = ReplaySet::default();
        assert!(replay.remember(&[1; 64], 1_000));
        assert!(!replay.remember(&[1; 64], 5_000));
        assert!(replay.remember(&[2; 64], 1_000));
        assert_eq!(replay.purge(1_000), 0);
        assert_eq!(replay.purge(1_001), 2);
        assert!(replay.remember(&[1; 64], 9_000));
    }

    #[test]
    fn a_record_is_kept_to_the_end_of_the_second_its_window_ends_in_never_less() {
        let replay = ReplaySet::default();
        assert!(replay.remember(&[3; 64], 1_500));
        assert_eq!(replay.purge(1_501), 0, "still inside its window's second");
        assert_eq!(replay.purge(2_000), 0);
        assert_eq!(replay.purge(2_001), 1);
        assert!(
            replay.remember(&[4; 64], i64::MAX),
            "far future: kept, not wrapped"
        );
        assert_eq!(replay.purge(4_000_000_000_000), 0);
        assert!(replay.remember(&[5; 64], -5), "before 1970: already passed");
        assert_eq!(replay.purge(1), 1);
    }

    #[test]
    fn budget_counts_charge_up_to_the_limit_and_hand_each_change_to_the_writer_once() {
        let budgets = BudgetCounts::default();
        assert_eq!(budgets.charge("k", 2), None, "not loaded yet");
        budgets.load("k", 1);
        budgets.load("k", 0); // a later read does not undo a charge made since the first
        assert_eq!(budgets.charge("k", 2), Some(true));
        assert_eq!(budgets.charge("k", 2), Some(false));
        assert_eq!(
            budgets.take_unwritten(),
            Some(HashMap::from([("k".to_owned(), 1)])),
            "a refusal changes nothing"
        );
        assert_eq!(budgets.take_unwritten(), None, "taken once");
        budgets.refund("k");
        assert_eq!(
            budgets.take_unwritten(),
            Some(HashMap::from([("k".to_owned(), -1)]))
        );
        assert_eq!(budgets.charge("k", 2), Some(true));
        budgets.refund("k");
        assert_eq!(
            budgets.take_unwritten(),
            None,
            "a charge given back nets out"
        );
        budgets.forget("k");
        assert_eq!(budgets.charge("k", 2), None);
    }

    #[test]
    fn rate_windows_admit_refuse_and_refund() {
        let windows = RateWindows::default();
        let window = SlidingWindow::new(2, 1_000);
        assert!(windows.admit("k", &window, 100).is_ok());
        assert!(windows.admit("k", &window, 200).is_ok());
        assert_eq!(windows.admit("k", &window, 300), Err(800));
        windows.refund("k", &window, 200);
        assert!(windows.admit("k", &window, 300).is_ok());
        windows.purge(1_200);
        assert_eq!(windows.len(), 1, "300 is still inside the window at 1,200");
        windows.purge(1_300);
        assert_eq!(windows.len(), 0);
    }
}

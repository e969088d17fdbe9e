//! [`Store::admit`] on the embedded store: the replay record, the rate window and the budget count are
//! charged in memory ([`super::memory`]), the claim through the writer; the budget counts reach the
//! counters table with the writer's next request or commit.

use std::sync::Arc;

use rusqlite::{params, Connection};

use super::memory::BudgetCounts;
use super::sql::{changes_one, claim_insert, db, ClaimRow};
use super::{threads, SqliteStore};
use crate::store::{Admission, Admitted, ClaimRecord, Store, StoreResult};

impl SqliteStore {
    /// [`Store::admit`] on the embedded store: the replay record and the rate window are charged in memory,
    /// then the budget and the claim ([`Self::charge_and_claim`]); a refusal or a failure gives the rate
    /// charge back.
    pub(super) async fn admit_with_memory(&self, admission: &Admission) -> StoreResult<Admitted> {
        self.check_running()?;
        if let Some(seen) = &admission.signature {
            if !self.replay.remember(&seen.signature, seen.expires_at_ms) {
                return Ok(Admitted::Replayed);
            }
        }
        let now_ms = admission.now_ms;
        if let Some((key, window)) = &admission.rate {
            if let Err(retry_after_ms) = self.rates.admit(key, window, now_ms) {
                return Ok(Admitted::RateLimited { retry_after_ms });
            }
        }
        let charged = self.charge_and_claim(admission).await;
        if !matches!(charged, Ok(Some(_))) {
            // Refused by the budget, or not written: the rate window must not count the call either.
            if let Some((key, window)) = &admission.rate {
                self.rates.refund(key, window, now_ms);
            }
        }
        Ok(match charged? {
            Some(existing) => Admitted::Charged {
                existing_claim: existing.map(Box::new),
            },
            None => Admitted::BudgetExhausted,
        })
    }

    /// Charges the call's budget, then inserts its claim: `None` when the budget is used up, otherwise
    /// the claim that existed already, if any. Only the claim waits for the writer; a claim not written
    /// gives its charge back.
    async fn charge_and_claim(
        &self,
        admission: &Admission,
    ) -> StoreResult<Option<Option<ClaimRecord>>> {
        // Packed before the charge: a claim that cannot be packed charges nothing.
        let claim = admission.claim.as_ref().map(ClaimRow::of).transpose()?;
        if let Some((key, max)) = &admission.budget {
            if !self.charge_budget(key, *max).await? {
                return Ok(None);
            }
        }
        let Some(claim) = claim else {
            return Ok(Some(None));
        };
        let claimed = self
            .writer
            .write(move |w| claim_insert(&w.conn, &claim))
            .await;
        if let (Err(_), Some((key, _))) = (&claimed, &admission.budget) {
            self.budgets.refund(key);
        }
        claimed.map(Some)
    }

    /// Charges one call to the budget `key` in memory, for the writer to write (see [`BudgetCounts`]);
    /// false when it holds `max` already. A key's first call reads its count first.
    async fn charge_budget(&self, key: &str, max: u64) -> StoreResult<bool> {
        loop {
            if let Some(charged) = self.budgets.charge(key, max) {
                return Ok(charged);
            }
            let count = self.counter_get(key).await?.unwrap_or(0);
            self.budgets.load(key, count);
        }
    }

    /// Sets a budget count as an earlier release's store held it (`store import-sled`).
    pub(crate) async fn import_counter(&self, key: &str, count: i64) -> StoreResult<()> {
        let bytes = key.as_bytes().to_vec();
        let set = self
            .writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "INSERT INTO counters (key, value) VALUES (?1, ?2) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![bytes, count],
                )
                .map(drop)
            })
            .await;
        self.budgets.forget(key);
        set
    }
}

/// The budget counts' changes that the counters table does not hold yet, for the writer to write (see
/// [`BudgetCounts`]).
pub(super) fn unwritten_budgets(budgets: Arc<BudgetCounts>) -> threads::Unwritten {
    Box::new(move || {
        let changes = budgets.take_unwritten()?;
        Some(Box::new(move |conn: &Connection| {
            let mut add = conn
                .prepare_cached(
                    "INSERT INTO counters (key, value) VALUES (?1, ?2) \
                     ON CONFLICT (key) DO UPDATE SET value = value + excluded.value",
                )
                .map_err(db)?;
            for (key, change) in &changes {
                add.execute(params![key.as_bytes(), change]).map_err(db)?;
            }
            Ok(())
        }))
    })
}

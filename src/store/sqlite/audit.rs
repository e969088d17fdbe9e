//! The audit chain in the embedded store: the writer thread holds the head, so an append is a
//! compare-and-set on it; a batch's events, the claims it settles and the labels it gives sessions are
//! written in one transaction.

use rusqlite::params;
use serde_json::Value;

use super::packed::{pack, Stored};
use super::sql::{claim_replace, db, ClaimRow};
use super::threads::Writable;
use super::SqliteStore;
use crate::store::{
    decode_record, labels_of_batch, sql_int, AuditBackend, ChainHead, ClaimRecord, ClaimSettlement,
    StoreError, StoreResult, StoredEvent,
};

#[async_trait::async_trait]
impl AuditBackend for SqliteStore {
    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        self.writer
            .write(|w| Ok((w.head.seq > 0).then(|| w.head.clone())))
            .await
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.writer
            .write(append_work(after, events, settlements)?)
            .await
    }

    async fn sync(&self) -> StoreResult<()> {
        self.writer.commit().await
    }

    async fn append_durably(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.writer
            .write_durably(append_work(after, events, settlements)?)
            .await
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        let before = before_seq.map_or(i64::MAX, sql_int);
        self.events_where(
            "SELECT event FROM audit_events WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
            before,
            limit,
        )
        .await
    }

    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        self.events_where(
            "SELECT event FROM audit_events WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
            sql_int(from_seq),
            limit,
        )
        .await
    }
}

/// The writer's work that appends `events` after `after` (a compare-and-set on the head), with the claims
/// they settle and the labels they give sessions. Packed here, on the caller's thread, so that the
/// writer's turn only runs statements.
fn append_work(
    after: &ChainHead,
    events: &[StoredEvent],
    settlements: &[ClaimSettlement],
) -> StoreResult<impl FnOnce(&mut Writable) -> StoreResult<()> + Send + 'static> {
    let after = after.clone();
    let rows = events
        .iter()
        .map(|event| Ok((event.head.clone(), pack(&event.line)?)))
        .collect::<StoreResult<Vec<(ChainHead, Vec<u8>)>>>()?;
    let settlements = settlements
        .iter()
        .map(|s| Ok((s.pending.clone(), ClaimRow::of(&s.settled)?)))
        .collect::<StoreResult<Vec<(ClaimRecord, ClaimRow)>>>()?;
    let labels = labels_of_batch(events);
    Ok(move |w: &mut Writable| {
        if w.head != after {
            return Err(StoreError::HeadMoved);
        }
        for (pending, settled) in &settlements {
            // A claim an operator resolved meanwhile is left as it is.
            claim_replace(&w.conn, pending, Some(settled))?;
        }
        if !labels.is_empty() {
            // SPEC 19: in the batch's transaction; a label held keeps the seq that first brought it.
            let mut label = w
                .conn
                .prepare_cached(
                    "INSERT INTO session_labels (session_id, label, seq) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (session_id, label) DO NOTHING",
                )
                .map_err(db)?;
            for (session_id, name, seq) in &labels {
                label
                    .execute(params![session_id, name, sql_int(*seq)])
                    .map_err(db)?;
            }
        }
        let mut insert = w
            .conn
            .prepare_cached("INSERT INTO audit_events (seq, event) VALUES (?1, ?2)")
            .map_err(db)?;
        for (head, packed) in &rows {
            insert
                .execute(params![sql_int(head.seq), packed])
                .map_err(db)?;
        }
        drop(insert);
        if let Some((head, _)) = rows.last() {
            w.head = head.clone();
        }
        Ok(())
    })
}

impl SqliteStore {
    /// The events that `query` selects with its bound `seq` (?1) and at most `limit` rows (?2), decoded.
    async fn events_where(
        &self,
        query: &'static str,
        seq: i64,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        let limit = sql_int(limit as u64);
        self.read(move |conn| {
            let texts: Vec<Stored> = conn
                .prepare_cached(query)
                .and_then(|mut s| {
                    s.query_map(params![seq, limit], |row| row.get(0))?
                        .collect()
                })
                .map_err(db)?;
            texts
                .iter()
                .map(|Stored(text)| decode_record(text))
                .collect()
        })
        .await
    }
}

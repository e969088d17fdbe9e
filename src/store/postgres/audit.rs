//! The audit chain on PostgreSQL: events appended by compare-and-set on the head, or in turns under its
//! row lock while other replicas keep moving it (see [`AuditBackend::append_in_turn`]).

use deadpool_postgres::Object;
use serde_json::Value;

use super::sql::{db, Prepared};
use super::PgStore;
use crate::store::{
    decode_record, encode_record, sql_int, AuditBackend, ChainHead, Chainer, ClaimSettlement,
    StoreError, StoreResult, StoredEvent,
};

/// One statement: the head moves only from where the batch was chained (a compare-and-set), and the events
/// and the claims' settlements and the sessions' new labels (SPEC 19) are written only when it did. Outside a transaction it is one commit, and the
/// head's row lock is held for this statement alone; a replica that lost the race sees no row changed and
/// chains again. Counts 1 when the head moved.
const WRITE_BATCH: &str = "WITH moved AS (\
     UPDATE audit_head SET seq = $3, hash = $4 WHERE id = 1 AND seq = $5 AND hash = $6 \
     RETURNING 1), \
     appended AS (\
     INSERT INTO audit_events (seq, event) \
     SELECT t.seq, t.event FROM moved, unnest($1::bigint[], $2::text[]) AS t(seq, event)), \
     settled AS (\
     SELECT sealgate_settle($7::text[], $8::text[], $9::text[], $10::text[]) FROM moved), \
     labelled AS (\
     INSERT INTO session_labels (session_id, label, seq) \
     SELECT l.session_id, l.label, l.seq FROM moved, unnest($11::text[], $12::text[], $13::bigint[]) \
     AS l(session_id, label, seq) ON CONFLICT (session_id, label) DO NOTHING) \
     SELECT count(*) FROM moved, settled";

/// The head's row, locked until the transaction ends: the other replicas' writers wait for their turn.
const LOCK_HEAD: &str = "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE";

/// What [`WRITE_BATCH`] takes: a chained batch, where it was chained, and its claims' settlements.
struct BatchColumns<'a> {
    seqs: Vec<i64>,
    /// The events' lines, stored as the writer sealed them.
    texts: Vec<&'a str>,
    last_seq: i64,
    last_hash: &'a str,
    after_seq: i64,
    after_hash: String,
    /// Kind, request id, PENDING record and settled record of each settlement.
    settlements: [Vec<String>; 4],
    /// Session id, label and seq of each label the batch's completion events give (SPEC 19).
    label_sessions: Vec<String>,
    label_names: Vec<String>,
    label_seqs: Vec<i64>,
}

impl<'a> BatchColumns<'a> {
    /// None for an empty batch, which writes nothing.
    fn of(
        after: &ChainHead,
        events: &'a [StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<Option<BatchColumns<'a>>> {
        let Some(last) = events.last() else {
            return Ok(None);
        };
        let mut columns: [Vec<String>; 4] = Default::default();
        for settlement in settlements {
            let pending = &settlement.pending;
            columns[0].push(pending.kind.as_str().to_owned());
            columns[1].push(pending.request_id.clone());
            columns[2].push(encode_record(pending)?);
            columns[3].push(encode_record(&settlement.settled)?);
        }
        let (mut label_sessions, mut label_names, mut label_seqs) = (vec![], vec![], vec![]);
        for (session_id, label, seq) in crate::store::labels_of_batch(events) {
            label_sessions.push(session_id);
            label_names.push(label);
            label_seqs.push(sql_int(seq));
        }
        Ok(Some(BatchColumns {
            seqs: events.iter().map(|event| sql_int(event.head.seq)).collect(),
            texts: events.iter().map(|event| event.line.as_str()).collect(),
            last_seq: sql_int(last.head.seq),
            last_hash: &last.head.hash,
            after_seq: sql_int(after.seq),
            after_hash: after.hash.clone(),
            settlements: columns,
            label_sessions,
            label_names,
            label_seqs,
        }))
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 13] {
        let [kinds, request_ids, pendings, settleds] = &self.settlements;
        [
            &self.seqs,
            &self.texts,
            &self.last_seq,
            &self.last_hash,
            &self.after_seq,
            &self.after_hash,
            kinds,
            request_ids,
            pendings,
            settleds,
            &self.label_sessions,
            &self.label_names,
            &self.label_seqs,
        ]
    }
}

/// The head in a row of `audit_head` (seq, hash); seq 0 is the genesis.
fn head_of(row: &tokio_postgres::Row) -> StoreResult<ChainHead> {
    Ok(ChainHead {
        seq: u64::try_from(row.get::<_, i64>(0))
            .map_err(|_| StoreError::Corrupt("negative audit seq".into()))?,
        hash: row.get(1),
    })
}

/// Whether [`WRITE_BATCH`] moved the head.
fn head_moved(row: &tokio_postgres::Row) -> bool {
    row.get::<_, i64>(0) == 1
}

/// A pooled connection inside a transaction opened with a plain `BEGIN`, so that the `BEGIN` can travel
/// with the statement after it. Unless [`OpenTransaction::close`] hands it back after the transaction
/// ended, dropping it takes the connection out of the pool: its session ends and PostgreSQL rolls the
/// transaction back, where the pool would hand the open transaction to the next statement.
struct OpenTransaction(Option<Object>);

impl OpenTransaction {
    /// Back to the pool: only once the transaction has ended (committed or rolled back).
    fn close(mut self) {
        drop(self.0.take());
    }
}

impl std::ops::Deref for OpenTransaction {
    type Target = Object;

    fn deref(&self) -> &Object {
        // Set from the start; only `close` and `drop` take it, and neither leaves `self` in use.
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(Object::take(conn));
        }
    }
}

#[async_trait::async_trait]
impl AuditBackend for PgStore {
    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        let row = self
            .conn()
            .await?
            .query_one_prepared("SELECT seq, hash FROM audit_head WHERE id = 1", &[])
            .await
            .map_err(db)?;
        let head = head_of(&row)?;
        Ok((head.seq > 0).then_some(head))
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let Some(columns) = BatchColumns::of(after, events, settlements)? else {
            return Ok(());
        };
        let row = self
            .conn()
            .await?
            .query_one_prepared(WRITE_BATCH, &columns.params())
            .await
            .map_err(db)?;
        match head_moved(&row) {
            true => Ok(()),
            false => Err(StoreError::HeadMoved),
        }
    }

    async fn append_in_turn(
        &self,
        chain: &mut Chainer<'_>,
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        let conn = self.conn().await?;
        // Prepared first, so that nothing waits between the statements queued together below: `BEGIN`
        // goes with the lock, the write with `COMMIT`, and the head is held for two round trips, not three.
        let lock = conn.prepare_cached(LOCK_HEAD).await.map_err(db)?;
        let write = conn.prepare_cached(WRITE_BATCH).await.map_err(db)?;
        let turn = OpenTransaction(Some(conn));
        let (begun, row) = tokio::join!(turn.batch_execute("BEGIN"), turn.query_one(&lock, &[]));
        begun.map_err(db)?;
        let row = row.map_err(db)?;
        let head = head_of(&row)?;
        let events = chain(&head);
        let moved = match BatchColumns::of(&head, &events, settlements)? {
            Some(columns) => {
                // A failed write turns the `COMMIT` into a rollback; its error is the one reported.
                let params = columns.params();
                let (written, committed) = tokio::join!(
                    turn.query_one(&write, &params),
                    turn.batch_execute("COMMIT")
                );
                let moved = head_moved(&written.map_err(db)?);
                committed.map_err(db)?;
                moved
            }
            None => {
                turn.batch_execute("COMMIT").await.map_err(db)?;
                true
            }
        };
        turn.close();
        if !moved {
            return Err(StoreError::Corrupt(
                "the audit head moved while its row was locked".into(),
            ));
        }
        Ok(())
    }

    async fn sync(&self) -> StoreResult<()> {
        // Every write was a commit, durable before it returned.
        Ok(())
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        let before = before_seq.map_or(i64::MAX, sql_int);
        let limit = sql_int(limit as u64);
        let rows = self
            .conn()
            .await?
            .query_prepared(
                "SELECT event FROM audit_events WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
                &[&before, &limit],
            )
            .await
            .map_err(db)?;
        rows.iter().map(|row| decode_record(row.get(0))).collect()
    }

    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        let from = sql_int(from_seq);
        let limit = sql_int(limit as u64);
        let rows = self
            .conn()
            .await?
            .query_prepared(
                "SELECT event FROM audit_events WHERE seq >= $1 ORDER BY seq LIMIT $2",
                &[&from, &limit],
            )
            .await
            .map_err(db)?;
        rows.iter().map(|row| decode_record(row.get(0))).collect()
    }
}

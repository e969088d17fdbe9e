//! [`Store::admit`] on PostgreSQL. A call with a rate window is admitted in a transaction of its own that
//! locks its counter cells ([`PgStore::admit_in_transaction`]): the window is computed here, not in SQL.
//!
//! Group commit of the other admissions (issue 20): the admissions of concurrent calls that need no
//! rate window go to one task, which admits whatever has queued while its previous batch was in flight in
//! one statement (`sealgate_admit`, migration 0007): one round trip and one commit for the batch instead of
//! one of each per call. No timer holds a call back: a batch is what queued meanwhile.

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;

use super::sql::{db, Prepared};
use super::PgStore;
use crate::store::{
    decode_record, encode_record, Admission, Admitted, ClaimRecord, SeenSignature, Store,
    StoreError, StoreResult,
};

/// The most admissions one statement takes; more wait for the next.
const MAX_BATCH: usize = 128;

/// How often a batch is tried when PostgreSQL picks it as a deadlock's victim.
const DEADLOCK_ATTEMPTS: usize = 3;

const ADMIT_BATCH: &str = "SELECT ordinal, fresh, charged, claimed FROM sealgate_admit(\
     $1::bytea[], $2::bigint[], $3::bytea[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $8::text[])";

/// One call's admission as the statement takes it: its replay record, its budget cell and maximum, and
/// the PENDING claim to insert when charged.
#[derive(Debug, Clone)]
pub(super) struct AdmitRow {
    pub signature: Option<SeenSignature>,
    pub cell: Vec<u8>,
    pub max: i64,
    pub claim: Option<PendingClaim>,
}

/// A PENDING claim's columns, its record already the text the table keeps.
#[derive(Debug, Clone)]
pub(super) struct PendingClaim {
    pub kind: &'static str,
    pub request_id: String,
    pub claimed_at_ms: i64,
    pub record: String,
}

/// What the statement did for one admission: whether the replay record was new, the budget charged, the
/// claim inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AdmitOutcome {
    pub fresh: bool,
    pub charged: bool,
    pub claimed: bool,
}

struct Job {
    row: AdmitRow,
    reply: oneshot::Sender<StoreResult<AdmitOutcome>>,
}

/// The handle the store keeps; the task ends when it is dropped.
pub(super) struct Admitter {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Admitter {
    /// Starts the task that admits batches over connections of `pool`.
    pub fn start(pool: Pool) -> Admitter {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, queue));
        Admitter { jobs }
    }

    pub async fn admit(&self, row: AdmitRow) -> StoreResult<AdmitOutcome> {
        let (reply, answer) = oneshot::channel();
        let stopped =
            || StoreError::unavailable("the admission task of the PostgreSQL store stopped");
        self.jobs.send(Job { row, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(pool: Pool, mut queue: mpsc::UnboundedReceiver<Job>) {
    while let Some(batch) = next_batch(&mut queue).await {
        admit_batch(&pool, batch).await;
    }
}

/// Waits for one admission, then takes every one queued behind it, up to [`MAX_BATCH`]. None when the
/// store is gone.
async fn next_batch(queue: &mut mpsc::UnboundedReceiver<Job>) -> Option<Vec<Job>> {
    let first = queue.recv().await?;
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// Admits `batch` in one statement and answers every job. A batch that PostgreSQL aborted as a deadlock
/// (another replica's batch took a claim's request id that this one holds, and the other way round)
/// changed nothing, and is admitted again.
async fn admit_batch(pool: &Pool, batch: Vec<Job>) {
    let rows: Vec<&AdmitRow> = batch.iter().map(|job| &job.row).collect();
    let mut attempts = 1;
    let answer = loop {
        match execute(pool, &rows).await {
            Err(Failure::Deadlock(_)) if attempts < DEADLOCK_ATTEMPTS => attempts += 1,
            answer => break answer.map_err(StoreError::from),
        }
    };
    match answer {
        Ok(outcomes) => {
            for (job, outcome) in batch.into_iter().zip(outcomes) {
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

enum Failure {
    Deadlock(StoreError),
    Other(StoreError),
}

impl From<Failure> for StoreError {
    fn from(failure: Failure) -> StoreError {
        match failure {
            Failure::Deadlock(error) | Failure::Other(error) => error,
        }
    }
}

/// Runs the statement for `rows`; one outcome per row, in their order.
async fn execute(pool: &Pool, rows: &[&AdmitRow]) -> Result<Vec<AdmitOutcome>, Failure> {
    let conn = pool.get().await.map_err(|e| Failure::Other(db(e)))?;
    let columns = Columns::of(rows);
    let answer = conn
        .query_prepared(
            ADMIT_BATCH,
            &[
                &columns.signatures,
                &columns.expiries,
                &columns.cells,
                &columns.maxes,
                &columns.kinds,
                &columns.ids,
                &columns.times,
                &columns.records,
            ],
        )
        .await;
    let answer = answer.map_err(|e| match e.code() {
        Some(&SqlState::T_R_DEADLOCK_DETECTED) => Failure::Deadlock(db(e)),
        _ => Failure::Other(db(e)),
    })?;
    let mut outcomes = vec![None; rows.len()];
    for row in answer {
        let ordinal: i32 = row.get(0);
        let slot = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|index| outcomes.get_mut(index));
        if let Some(slot) = slot {
            *slot = Some(AdmitOutcome {
                fresh: row.get(1),
                charged: row.get(2),
                claimed: row.get(3),
            });
        }
    }
    outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Failure::Other(StoreError::Corrupt("sealgate_admit skipped a row".into())))
}

/// The statement's parameters: one array per column, NULL where an admission has no such part.
struct Columns<'a> {
    signatures: Vec<Option<&'a [u8]>>,
    expiries: Vec<Option<i64>>,
    cells: Vec<&'a [u8]>,
    maxes: Vec<i64>,
    kinds: Vec<Option<&'static str>>,
    ids: Vec<Option<&'a str>>,
    times: Vec<Option<i64>>,
    records: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn of(rows: &[&'a AdmitRow]) -> Columns<'a> {
        let mut columns = Columns {
            signatures: Vec::with_capacity(rows.len()),
            expiries: Vec::with_capacity(rows.len()),
            cells: Vec::with_capacity(rows.len()),
            maxes: Vec::with_capacity(rows.len()),
            kinds: Vec::with_capacity(rows.len()),
            ids: Vec::with_capacity(rows.len()),
            times: Vec::with_capacity(rows.len()),
            records: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            let (signature, claim) = (row.signature.as_ref(), row.claim.as_ref());
            columns
                .signatures
                .push(signature.map(|seen| &seen.signature[..]));
            columns
                .expiries
                .push(signature.map(|seen| seen.expires_at_ms));
            columns.cells.push(&row.cell);
            columns.maxes.push(row.max);
            columns.kinds.push(claim.map(|claim| claim.kind));
            columns
                .ids
                .push(claim.map(|claim| claim.request_id.as_str()));
            columns.times.push(claim.map(|claim| claim.claimed_at_ms));
            columns
                .records
                .push(claim.map(|claim| claim.record.as_str()));
        }
        columns
    }
}

pub(super) const REMEMBER_SIGNATURE: &str =
    "INSERT INTO seen_signatures (signature, expires_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// A budget cell's state: the count as 8 big-endian bytes (what `int8send` writes in SQL).
fn budget_bytes(count: i64) -> Vec<u8> {
    count.to_be_bytes().to_vec()
}

pub(super) fn budget_count(bytes: Option<&[u8]>) -> StoreResult<i64> {
    match bytes {
        None => Ok(0),
        Some(raw) => raw
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| StoreError::Corrupt("budget counter is not 8 bytes".into())),
    }
}

impl PgStore {
    /// [`Store::admit`] with a rate window, or without a budget: one transaction that locks every cell it
    /// reads before it writes any.
    pub(super) async fn admit_in_transaction(
        &self,
        admission: &Admission,
    ) -> StoreResult<Admitted> {
        let now_ms = admission.now_ms;
        let mut conn = self.conn().await?;
        // One transaction that reads and locks every cell before it writes any: a refusal commits only the
        // replay record (dropping `tx` instead would roll that back too).
        let tx = conn.transaction().await.map_err(db)?;
        if let Some(seen) = &admission.signature {
            let inserted = tx
                .execute_prepared(
                    REMEMBER_SIGNATURE,
                    &[&&seen.signature[..], &seen.expires_at_ms],
                )
                .await
                .map_err(db)?;
            if inserted == 0 {
                return Ok(Admitted::Replayed);
            }
        }
        let mut writes = Vec::with_capacity(2);
        if let Some((key, window)) = &admission.rate {
            let state = Self::lock_cell(&tx, key).await?;
            match window.admit(state.as_deref(), now_ms) {
                Ok(next) => writes.push((key, next)),
                Err(retry_after_ms) => {
                    tx.commit().await.map_err(db)?;
                    return Ok(Admitted::RateLimited { retry_after_ms });
                }
            }
        }
        if let Some((key, max)) = &admission.budget {
            let max = i64::try_from(*max).unwrap_or(i64::MAX);
            let count = budget_count(Self::lock_cell(&tx, key).await?.as_deref())?;
            if count >= max {
                tx.commit().await.map_err(db)?;
                return Ok(Admitted::BudgetExhausted);
            }
            writes.push((key, budget_bytes(count + 1)));
        }
        for (key, state) in &writes {
            Self::set_cell(&tx, key, state).await?;
        }
        let mut existing_claim = None;
        if let Some(claim) = &admission.claim {
            let inserted = tx
                .execute_prepared(
                    "INSERT INTO claims (kind, request_id, claimed_at_ms, record) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[
                        &claim.kind.as_str(),
                        &claim.request_id,
                        &claim.claimed_at_ms,
                        &encode_record(claim)?,
                    ],
                )
                .await
                .map_err(db)?;
            if inserted == 0 {
                // The conflicting row is committed (the insert waited for it), so this read sees it.
                let row = tx
                    .query_one_prepared(
                        "SELECT record FROM claims WHERE kind = $1 AND request_id = $2",
                        &[&claim.kind.as_str(), &claim.request_id],
                    )
                    .await
                    .map_err(db)?;
                existing_claim = Some(decode_record(row.get(0))?);
            }
        }
        tx.commit().await.map_err(db)?;
        Ok(Admitted::Charged { existing_claim })
    }

    /// [`Store::admit`] without a rate window, in the statement of a batch of concurrent calls (see
    /// [`admit`]): the replay record, the budget charge and the claim insert commit together, each only
    /// when the one before it happened. (A rate window is computed here, not in SQL, so a call with one
    /// takes the transaction of [`Store::admit`].)
    pub(super) async fn admit_batched(
        &self,
        admission: &Admission,
        (key, max): (&str, u64),
    ) -> StoreResult<Admitted> {
        let claim = admission.claim.as_ref();
        let pending = |claim: &ClaimRecord| -> StoreResult<PendingClaim> {
            Ok(PendingClaim {
                kind: claim.kind.as_str(),
                request_id: claim.request_id.clone(),
                claimed_at_ms: claim.claimed_at_ms,
                record: encode_record(claim)?,
            })
        };
        let row = AdmitRow {
            signature: admission.signature.clone(),
            cell: key.as_bytes().to_vec(),
            max: i64::try_from(max).unwrap_or(i64::MAX),
            claim: claim.map(pending).transpose()?,
        };
        let outcome = self.admitter.admit(row).await?;
        if !outcome.fresh {
            return Ok(Admitted::Replayed);
        }
        if !outcome.charged {
            return Ok(Admitted::BudgetExhausted);
        }
        // Charged, and the request id was taken: the call is answered from that claim (section 7). If it
        // was released meanwhile, this call takes it now.
        let existing_claim = match claim {
            Some(claim) if !outcome.claimed => self.claim_insert(claim).await?.map(Box::new),
            _ => None,
        };
        Ok(Admitted::Charged { existing_claim })
    }

    /// Locks the counter cell `key` in `tx` (creating it empty) and returns its state.
    async fn lock_cell(
        tx: &deadpool_postgres::Transaction<'_>,
        key: &str,
    ) -> StoreResult<Option<Vec<u8>>> {
        // One statement: the upsert creates the cell or takes its row lock, and returns its state either way.
        let row = tx
            .query_one_prepared(
                "INSERT INTO counters (key, state) VALUES ($1, NULL) \
                 ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING state",
                &[&key.as_bytes()],
            )
            .await
            .map_err(db)?;
        Ok(row.get(0))
    }

    async fn set_cell(
        tx: &deadpool_postgres::Transaction<'_>,
        key: &str,
        state: &[u8],
    ) -> StoreResult<()> {
        tx.execute_prepared(
            "UPDATE counters SET state = $2 WHERE key = $1",
            &[&key.as_bytes(), &state],
        )
        .await
        .map_err(db)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cell: &str) -> Job {
        let row = AdmitRow {
            signature: None,
            cell: cell.as_bytes().to_vec(),
            max: 1,
            claim: None,
        };
        Job {
            row,
            reply: oneshot::channel().0,
        }
    }

    #[tokio::test]
    async fn a_batch_is_everything_queued_up_to_the_cap_and_the_rest_waits() {
        let (jobs, mut queue) = mpsc::unbounded_channel();
        for n in 0..MAX_BATCH + 3 {
            jobs.send(job(&format!("cell-{n}")))
                .unwrap_or_else(|_| panic!("queue open"));
        }
        let first = next_batch(&mut queue).await.unwrap();
        assert_eq!(first.len(), MAX_BATCH);
        assert_eq!(first[0].row.cell, b"cell-0");
        let second = next_batch(&mut queue).await.unwrap();
        assert_eq!(second.len(), 3);
        drop(jobs);
        assert!(next_batch(&mut queue).await.is_none());
    }
}

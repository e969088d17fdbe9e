//! What the embedded store's statements share: the error of a failed statement, insert-if-absent,
//! compare-and-set, reading records by key, the claims' rows (packed off the writer thread), and the one
//! loop that fills a page of a listing.

use rusqlite::{params, Connection, OptionalExtension};

use super::packed::{pack, Stored};
use super::SqliteStore;
use crate::store::{
    decode_record, encode_record, sql_int, ClaimKind, ClaimRecord, ClaimStatus, Page, StoreError,
    StoreResult,
};

pub(super) fn db(err: rusqlite::Error) -> StoreError {
    StoreError::unavailable(format!("sqlite: {err}"))
}

/// Inserts `record` unless its key exists; returns the record found otherwise.
pub(super) fn insert_or_get<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    insert: &str,
    insert_params: &[&dyn rusqlite::ToSql],
    select: &str,
    select_params: &[&dyn rusqlite::ToSql],
) -> StoreResult<Option<T>> {
    let inserted = conn
        .prepare_cached(insert)
        .and_then(|mut s| s.execute(insert_params))
        .map_err(db)?;
    if inserted == 1 {
        return Ok(None);
    }
    let Stored(existing) = conn
        .prepare_cached(select)
        .and_then(|mut s| s.query_row(select_params, |row| row.get(0)))
        .map_err(db)?;
    decode_record(&existing).map(Some)
}

/// Every record that `sql` (a query of one `record` column) selects, decoded.
pub(super) fn all_records<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
) -> StoreResult<Vec<T>> {
    let texts: Vec<String> = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect())
        .map_err(db)?;
    texts.iter().map(|text| decode_record(text)).collect()
}

/// A shadow set again, or removed, starts its count over (SPEC 6.4 r4: calls decided since it was set).
pub(super) fn forget_tallies(conn: &Connection, context: &str) -> StoreResult<()> {
    changes_one(
        conn,
        "DELETE FROM shadow_tallies WHERE context = ?1",
        params![context],
    )
    .map(|_| ())
}

/// Runs a compare-and-set statement; true when it changed the one row.
pub(super) fn changes_one(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> StoreResult<bool> {
    let changed = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(db)?;
    Ok(changed == 1)
}

/// Removes the rows that `purge` finds before `cutoff`, then inserts one row: the sign-in tables hold no
/// more than their records' lifetimes.
pub(super) fn purge_then_insert(
    conn: &Connection,
    purge: &str,
    cutoff: i64,
    insert: &str,
    params: &[&dyn rusqlite::ToSql],
) -> StoreResult<()> {
    conn.prepare_cached(purge)
        .and_then(|mut s| s.execute(params![cutoff]))
        .map_err(db)?;
    changes_one(conn, insert, params).map(|_| ())
}

/// One record by key, decoded.
pub(super) fn get_record<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> StoreResult<Option<T>> {
    let text: Option<Stored> = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.query_row(params, |row| row.get(0)).optional())
        .map_err(db)?;
    text.map(|Stored(text)| decode_record(&text)).transpose()
}

pub(super) const SESSION_BY_ID: &str = "SELECT record FROM sessions WHERE session_id = ?1";
pub(super) const CLAIM_BY_ID: &str =
    "SELECT record FROM claims WHERE kind = ?1 AND request_id = ?2";
pub(super) const APPROVAL_BY_ID: &str = "SELECT record FROM approvals WHERE approval_id = ?1";

/// A claim ready for its row, its text packed by the caller's thread so the one writer does not spend its
/// time compressing.
pub(super) struct ClaimRow {
    pub(super) kind: ClaimKind,
    pub(super) request_id: String,
    pub(super) claimed_at_ms: i64,
    pub(super) pending: bool,
    pub(super) packed: Vec<u8>,
}

impl ClaimRow {
    pub(super) fn of(record: &ClaimRecord) -> StoreResult<ClaimRow> {
        Ok(ClaimRow {
            kind: record.kind,
            request_id: record.request_id.clone(),
            claimed_at_ms: record.claimed_at_ms,
            pending: record.status == ClaimStatus::Pending,
            packed: pack(&encode_record(record)?)?,
        })
    }
}

pub(super) fn claim_insert(conn: &Connection, row: &ClaimRow) -> StoreResult<Option<ClaimRecord>> {
    let kind = row.kind.as_str();
    insert_or_get(
        conn,
        "INSERT INTO claims (kind, request_id, claimed_at_ms, pending, record) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (kind, request_id) DO NOTHING",
        params![
            kind,
            row.request_id,
            row.claimed_at_ms,
            row.pending,
            row.packed
        ],
        CLAIM_BY_ID,
        params![kind, row.request_id],
    )
}

/// Compare-and-set of a claim: replaces (or with `new` None deletes) the row only while it still holds
/// `old`. The comparison is of the records' text, not of packed bytes, which another zstd build may
/// produce differently; the one writer thread makes the read and the write one step.
pub(super) fn claim_replace(
    conn: &Connection,
    old: &ClaimRecord,
    new: Option<&ClaimRow>,
) -> StoreResult<bool> {
    let kind = old.kind.as_str();
    let current: Option<Stored> = conn
        .prepare_cached(CLAIM_BY_ID)
        .and_then(|mut s| s.query_row(params![kind, old.request_id], |row| row.get(0)))
        .optional()
        .map_err(db)?;
    if current.map(|Stored(text)| text) != Some(encode_record(old)?) {
        return Ok(false);
    }
    match new {
        Some(new) => changes_one(
            conn,
            "UPDATE claims SET record = ?3, pending = ?4 WHERE kind = ?1 AND request_id = ?2",
            params![kind, old.request_id, new.packed, new.pending],
        ),
        None => changes_one(
            conn,
            "DELETE FROM claims WHERE kind = ?1 AND request_id = ?2",
            params![kind, old.request_id],
        ),
    }
}

/// Reads one batch of a listing, after the cursor when there is one: rows of (cursor, record text).
pub(super) type BatchQuery<C> =
    fn(&Connection, Option<&C>, i64) -> rusqlite::Result<Vec<(C, Stored)>>;

impl SqliteStore {
    /// Fills one page of a listing from batches that the readers read with `query`, starting after
    /// `cursor`; `keep` runs here, on the records as they come.
    pub(super) async fn page<C, T>(
        &self,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r T) -> bool + Sync),
        mut cursor: Option<C>,
        query: BatchQuery<C>,
    ) -> StoreResult<(Vec<T>, bool)>
    where
        C: Clone + Send + 'static,
        T: serde::de::DeserializeOwned,
    {
        let mut page = Page::new(limit, keep);
        let batch = limit.saturating_add(1).max(64);
        loop {
            let from = cursor.clone();
            let rows = self
                .read(move |conn| query(conn, from.as_ref(), sql_int(batch as u64)).map_err(db))
                .await?;
            let exhausted = rows.len() < batch;
            for (next, Stored(text)) in rows {
                cursor = Some(next);
                if page.offer(decode_record(&text)?) {
                    return Ok(page.done(true));
                }
            }
            if exhausted {
                return Ok(page.done(false));
            }
        }
    }
}

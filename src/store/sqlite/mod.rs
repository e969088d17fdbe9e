//! The embedded default store on SQLite (SPEC 12 r3): one database file, `data_dir/sealgate.db`, in WAL mode
//! with `synchronous=FULL`, which an operator can open with the `sqlite3` shell and back up while it runs.
//!
//! One writer thread applies every write in order and commits them in groups (see [`threads`]); the
//! audit events of a batch and the claims they settle are written in the same transaction, so the store
//! and its chain never disagree. Reads that feed a compare-and-set go through the writer too (they see its
//! uncommitted writes); listings and exports go to reader threads that see the last commit.
//!
//! Replay records and rate windows live in memory ([`memory`]): a common call then writes only its
//! budget count, its claim and its audit events. They are rebuilt from the chain at start-up
//! ([`Store::restore`]).

mod folder_lock;
mod memory;
mod packed;
mod threads;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value;

use self::folder_lock::FolderLock;
use self::memory::{BudgetCounts, RateWindows, ReplaySet};
use self::packed::{pack, Stored};
use self::threads::{Checkpointer, Readers, Writable, Writer};
use super::{
    decode_record, encode_record, Admission, Admitted, ApprovalCursor, ApprovalRecord,
    ApprovalStatus, AuditBackend, ChainHead, ClaimCursor, ClaimKind, ClaimRecord, ClaimSettlement,
    ClaimStatus, ConsoleSessionRecord, LiveCounts, Page, Recovered, SessionLabel, SessionRecord,
    ShadowTally, Shelf, SignInAttempt, Store, StoreError, StoreResult, StoredContext, ToolPin,
};
use crate::replay::ReplayCover;

/// The database file in `data_dir`.
pub const FILE_NAME: &str = "sealgate.db";

/// The migrations, in order: entry `i` brings the schema (`PRAGMA user_version`) to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_initial.sql"),
    include_str!("../migrations/sqlite/0002_replay_cover.sql"),
    include_str!("../migrations/sqlite/0003_console_sign_in.sql"),
    include_str!("../migrations/sqlite/0004_session_labels.sql"),
    include_str!("../migrations/sqlite/0005_tool_pins.sql"),
    include_str!("../migrations/sqlite/0006_context_shadows.sql"),
];

/// Read connections: lookups and listings are rare next to writes, and the machine may have two cores.
const READERS: usize = 2;

/// What every connection of the writer sets. The writer never checkpoints by itself (the checkpointer
/// does, off the commit path); the WAL file is cut back to 64 MiB after each reset.
/// The write-ahead log is started over once it holds this much (SQLite's own default is about 4 MiB).
const WAL_LIMIT_BYTES: u64 = 64 << 20;

const WRITER_PRAGMAS: &str = "PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0; \
     PRAGMA journal_size_limit = 67108864; PRAGMA cache_size = -2048; PRAGMA busy_timeout = 5000; \
     PRAGMA foreign_keys = OFF; PRAGMA temp_store = MEMORY;";

pub struct SqliteStore {
    writer: Writer,
    readers: Readers,
    replay: ReplaySet,
    rates: RateWindows,
    budgets: Arc<BudgetCounts>,
    _checkpointer: Checkpointer,
    _folder_lock: FolderLock,
}

fn db(err: rusqlite::Error) -> StoreError {
    StoreError::unavailable(format!("sqlite: {err}"))
}

/// SQLite's integers are signed 64-bit: a seq, a count or a limit is clamped, never wrapped.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens (creating when missing) `dir/sealgate.db`, brings its schema up to date and starts its
    /// threads. Refuses a schema newer than this build knows, and a folder another process has open.
    pub fn open(dir: &Path) -> StoreResult<SqliteStore> {
        SqliteStore::open_with_wal_limit(dir, WAL_LIMIT_BYTES)
    }

    fn open_with_wal_limit(dir: &Path, wal_limit: u64) -> StoreResult<SqliteStore> {
        let path = create_database_file(dir)?;
        let folder_lock = FolderLock::take(dir)?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| StoreError::unavailable(format!("cannot open {}: {e}", path.display())))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(db)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::unavailable(format!(
                "{} cannot use a write-ahead log (journal mode {mode})",
                path.display()
            )));
        }
        conn.execute_batch(WRITER_PRAGMAS).map_err(db)?;
        migrate(&conn)?;
        let head = read_head(&conn)?;
        let budgets = Arc::new(BudgetCounts::default());
        let writer = Writer::start(
            Writable { conn, head },
            wal_limit,
            unwritten_budgets(budgets.clone()),
        )?;
        let readers = Readers::start(&path, READERS)?;
        let checkpointer = Checkpointer::start(&path, writer.commits())?;
        Ok(SqliteStore {
            writer,
            readers,
            replay: ReplaySet::default(),
            rates: RateWindows::default(),
            budgets,
            _checkpointer: checkpointer,
            _folder_lock: folder_lock,
        })
    }

    /// The database file of the store in `dir`.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(FILE_NAME)
    }

    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.check_running()?;
        self.readers.read(work).await
    }
}

/// Makes `dir` (mode 0700) and the database file (mode 0600, which SQLite gives its WAL and shared-memory
/// files too) when missing, and syncs the folder so that the new name survives a power cut.
fn create_database_file(dir: &Path) -> StoreResult<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    crate::files::private_dir(dir).map_err(StoreError::unavailable)?;
    let path = SqliteStore::path_in(dir);
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path);
    match created {
        Ok(_) => crate::files::sync_folder(dir).map_err(StoreError::unavailable)?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(StoreError::unavailable(format!(
                "cannot create {}: {e}",
                path.display()
            )))
        }
    }
    Ok(path)
}

/// Applies the migrations the file lacks, each in its own transaction with its version.
fn migrate(conn: &Connection) -> StoreResult<()> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(db)?;
    let current = usize::try_from(current).unwrap_or(usize::MAX);
    let known = MIGRATIONS.len();
    if current > known {
        return Err(StoreError::Unavailable(format!(
            "the store's schema is at version {current}, newer than the {known} this build knows: \
             refusing to start (upgrade sealgate)"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
        let version = index + 1;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {migration}; PRAGMA user_version = {version}; COMMIT;"
        ))
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            StoreError::unavailable(format!("store schema migration {version} failed: {e}"))
        })?;
        tracing::info!(version, "store schema migrated");
    }
    Ok(())
}

/// The last event's seq and hash, or the genesis head for an empty chain.
fn read_head(conn: &Connection) -> StoreResult<ChainHead> {
    let last: Option<Stored> = conn
        .query_row(
            "SELECT event FROM audit_events ORDER BY seq DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(db)?;
    let Some(Stored(text)) = last else {
        return Ok(ChainHead::genesis());
    };
    let event: Value = decode_record(&text)?;
    ChainHead::of_event(&event)
}

/// Inserts `record` unless its key exists; returns the record found otherwise.
fn insert_or_get<T: serde::de::DeserializeOwned>(
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

/// Runs a compare-and-set statement; true when it changed the one row.
/// Every record that `sql` (a query of one `record` column) selects, decoded.
fn all_records<T: serde::de::DeserializeOwned>(
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
fn forget_tallies(conn: &Connection, context: &str) -> StoreResult<()> {
    changes_one(
        conn,
        "DELETE FROM shadow_tallies WHERE context = ?1",
        params![context],
    )
    .map(|_| ())
}

fn changes_one(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> StoreResult<bool> {
    let changed = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(db)?;
    Ok(changed == 1)
}

/// Removes the rows that `purge` finds before `cutoff`, then inserts one row: the sign-in tables hold no
/// more than their records' lifetimes.
fn purge_then_insert(
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
fn get_record<T: serde::de::DeserializeOwned>(
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

const SESSION_BY_ID: &str = "SELECT record FROM sessions WHERE session_id = ?1";
const CLAIM_BY_ID: &str = "SELECT record FROM claims WHERE kind = ?1 AND request_id = ?2";
const APPROVAL_BY_ID: &str = "SELECT record FROM approvals WHERE approval_id = ?1";

/// A session's expiry while it is not revoked (the live-sessions gauge's index).
fn live_until(record: &SessionRecord) -> Option<i64> {
    record.revoked_at_ms.is_none().then_some(record.expires_at)
}

/// A claim ready for its row, its text packed by the caller's thread so the one writer does not spend its
/// time compressing.
struct ClaimRow {
    kind: ClaimKind,
    request_id: String,
    claimed_at_ms: i64,
    pending: bool,
    packed: Vec<u8>,
}

impl ClaimRow {
    fn of(record: &ClaimRecord) -> StoreResult<ClaimRow> {
        Ok(ClaimRow {
            kind: record.kind,
            request_id: record.request_id.clone(),
            claimed_at_ms: record.claimed_at_ms,
            pending: record.status == ClaimStatus::Pending,
            packed: pack(&encode_record(record)?)?,
        })
    }
}

fn claim_insert(conn: &Connection, row: &ClaimRow) -> StoreResult<Option<ClaimRecord>> {
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
fn claim_replace(
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

/// The budget counts' changes that the counters table does not hold yet, for the writer to write (see
/// [`BudgetCounts`]).
fn unwritten_budgets(budgets: Arc<BudgetCounts>) -> threads::Unwritten {
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

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> StoreResult<()> {
        self.read(|conn| conn.query_row("SELECT 1", [], |_| Ok(())).map_err(db))
            .await
    }

    async fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>> {
        let record = record.clone();
        self.writer
            .write(move |w| {
                insert_or_get(
                    &w.conn,
                    "INSERT INTO sessions (session_id, record, live_until) VALUES (?1, ?2, ?3) \
                     ON CONFLICT DO NOTHING",
                    params![
                        record.session_id,
                        encode_record(&record)?,
                        live_until(&record)
                    ],
                    SESSION_BY_ID,
                    params![record.session_id],
                )
            })
            .await
    }

    async fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let id = session_id.to_owned();
        self.writer
            .write(move |w| get_record(&w.conn, SESSION_BY_ID, params![id]))
            .await
    }

    async fn session_labels(&self, session_id: &str) -> StoreResult<Vec<SessionLabel>> {
        // The writer's connection: it sees every batch before this read, committed or about to be (a
        // read connection would not see one whose group commit is still under way).
        let id = session_id.to_owned();
        self.writer
            .write(move |w| {
                let mut select = w
                    .conn
                    .prepare_cached(
                        "SELECT label, seq FROM session_labels WHERE session_id = ?1 ORDER BY seq, label",
                    )
                    .map_err(db)?;
                let rows = select
                    .query_map(params![id], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                    })
                    .map_err(db)?;
                rows.map(|row| {
                    let (label, seq) = row.map_err(db)?;
                    Ok(SessionLabel {
                        label,
                        seq: u64::try_from(seq)
                            .map_err(|_| StoreError::Corrupt("negative label seq".into()))?,
                    })
                })
                .collect()
            })
            .await
    }

    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        let (old, new) = (old.clone(), new.clone());
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "UPDATE sessions SET record = ?3, live_until = ?4 \
                     WHERE session_id = ?1 AND record = ?2",
                    params![
                        old.session_id,
                        encode_record(&old)?,
                        encode_record(&new)?,
                        live_until(&new)
                    ],
                )
            })
            .await
    }

    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)> {
        self.page(
            limit,
            keep,
            after.map(str::to_owned),
            |conn, after, batch| {
                conn.prepare_cached(
                    "SELECT session_id, record FROM sessions WHERE session_id > ?1 \
                 ORDER BY session_id LIMIT ?2",
                )?
                // Every id sorts after the empty string.
                .query_map(params![after.map_or("", String::as_str), batch], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?
                .collect()
            },
        )
        .await
    }

    async fn counter_get(&self, key: &str) -> StoreResult<Option<i64>> {
        let key = key.as_bytes().to_vec();
        self.writer
            .write(move |w| {
                w.conn
                    .prepare_cached("SELECT value FROM counters WHERE key = ?1")
                    .and_then(|mut s| s.query_row(params![key], |row| row.get(0)).optional())
                    .map_err(db)
            })
            .await
    }

    async fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool> {
        self.check_running()?;
        Ok(self.replay.remember(signature, expires_at_ms))
    }

    async fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize> {
        self.rates.purge(now_ms);
        Ok(self.replay.purge(now_ms))
    }

    async fn admit(&self, admission: &Admission) -> StoreResult<Admitted> {
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

    async fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>> {
        let row = ClaimRow::of(record)?;
        self.writer
            .write(move |w| claim_insert(&w.conn, &row))
            .await
    }

    async fn claim_get(
        &self,
        kind: ClaimKind,
        request_id: &str,
    ) -> StoreResult<Option<ClaimRecord>> {
        let id = request_id.to_owned();
        self.writer
            .write(move |w| get_record(&w.conn, CLAIM_BY_ID, params![kind.as_str(), id]))
            .await
    }

    async fn claim_replace(
        &self,
        old: &ClaimRecord,
        new: Option<&ClaimRecord>,
    ) -> StoreResult<bool> {
        let new = new.map(ClaimRow::of).transpose()?;
        let old = old.clone();
        self.writer
            .write(move |w| claim_replace(&w.conn, &old, new.as_ref()))
            .await
    }

    async fn claim_page(
        &self,
        before: Option<&ClaimCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ClaimRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ClaimRecord>, bool)> {
        let cursor = before.map(|c| {
            (
                c.claimed_at_ms,
                c.kind.as_str().to_owned(),
                c.request_id.clone(),
            )
        });
        self.page(limit, keep, cursor, |conn, before, batch| {
            let row = |row: &rusqlite::Row<'_>| {
                Ok(((row.get(0)?, row.get(1)?, row.get(2)?), row.get(3)?))
            };
            match before {
                None => conn
                    .prepare_cached(
                        "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                         ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT ?1",
                    )?
                    .query_map(params![batch], row)?
                    .collect(),
                Some((ms, kind, id)) => conn
                    .prepare_cached(
                        "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                         WHERE (claimed_at_ms, kind, request_id) < (?1, ?2, ?3) \
                         ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT ?4",
                    )?
                    .query_map(params![ms, kind, id, batch], row)?
                    .collect(),
            }
        })
        .await
    }

    async fn live_counts(&self, now_secs: i64) -> StoreResult<LiveCounts> {
        self.read(move |conn| {
            let (sessions, claims, approvals): (i64, i64, i64) = conn
                .prepare_cached(
                    "SELECT (SELECT count(*) FROM sessions WHERE live_until > ?1), \
                     (SELECT count(*) FROM claims WHERE pending = 1), \
                     (SELECT count(*) FROM approvals WHERE pending = 1)",
                )
                .and_then(|mut s| {
                    s.query_row(params![now_secs], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                    })
                })
                .map_err(db)?;
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            Ok(LiveCounts {
                sessions: count(sessions),
                pending_claims: count(claims),
                pending_approvals: count(approvals),
            })
        })
        .await
    }

    async fn approval_insert(
        &self,
        record: &ApprovalRecord,
        replacing: Option<&str>,
    ) -> StoreResult<bool> {
        let record = record.clone();
        let replacing = replacing.map(str::to_owned);
        self.writer
            .write(move |w| {
                // The call's pointer first: only a request that becomes current is stored.
                let current = match &replacing {
                    None => changes_one(
                        &w.conn,
                        "INSERT INTO approval_calls (session_id, call_digest, approval_id) \
                         VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![record.session_id, record.call_digest, record.approval_id],
                    )?,
                    Some(previous) => changes_one(
                        &w.conn,
                        "UPDATE approval_calls SET approval_id = ?3 \
                         WHERE session_id = ?1 AND call_digest = ?2 AND approval_id = ?4",
                        params![
                            record.session_id,
                            record.call_digest,
                            record.approval_id,
                            previous
                        ],
                    )?,
                };
                if !current {
                    return Ok(false);
                }
                changes_one(
                    &w.conn,
                    "INSERT INTO approvals (approval_id, requested_at_ms, pending, record) \
                     VALUES (?1, ?2, ?3, ?4)",
                    params![
                        record.approval_id,
                        record.requested_at_ms,
                        record.status == ApprovalStatus::Pending,
                        encode_record(&record)?
                    ],
                )
            })
            .await
    }

    async fn approval_current(
        &self,
        session_id: &str,
        call_digest: &str,
    ) -> StoreResult<Option<ApprovalRecord>> {
        let (session_id, call_digest) = (session_id.to_owned(), call_digest.to_owned());
        self.writer
            .write(move |w| {
                get_record(
                    &w.conn,
                    "SELECT a.record FROM approval_calls c JOIN approvals a USING (approval_id) \
                     WHERE c.session_id = ?1 AND c.call_digest = ?2",
                    params![session_id, call_digest],
                )
            })
            .await
    }

    async fn approval_get(&self, approval_id: &str) -> StoreResult<Option<ApprovalRecord>> {
        let id = approval_id.to_owned();
        self.writer
            .write(move |w| get_record(&w.conn, APPROVAL_BY_ID, params![id]))
            .await
    }

    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool> {
        let (old, new) = (old.clone(), new.clone());
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "UPDATE approvals SET record = ?3, pending = ?4 \
                     WHERE approval_id = ?1 AND record = ?2",
                    params![
                        old.approval_id,
                        encode_record(&old)?,
                        encode_record(&new)?,
                        new.status == ApprovalStatus::Pending
                    ],
                )
            })
            .await
    }

    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)> {
        let cursor = before.map(|c| (c.requested_at_ms, c.approval_id.clone()));
        self.page(limit, keep, cursor, |conn, before, batch| {
            let row = |row: &rusqlite::Row<'_>| Ok(((row.get(0)?, row.get(1)?), row.get(2)?));
            match before {
                None => conn
                    .prepare_cached(
                        "SELECT requested_at_ms, approval_id, record FROM approvals \
                         ORDER BY requested_at_ms DESC, approval_id DESC LIMIT ?1",
                    )?
                    .query_map(params![batch], row)?
                    .collect(),
                Some((ms, id)) => conn
                    .prepare_cached(
                        "SELECT requested_at_ms, approval_id, record FROM approvals \
                         WHERE (requested_at_ms, approval_id) < (?1, ?2) \
                         ORDER BY requested_at_ms DESC, approval_id DESC LIMIT ?3",
                    )?
                    .query_map(params![ms, id, batch], row)?
                    .collect(),
            }
        })
        .await
    }

    async fn context_put(&self, shelf: Shelf, context: &StoredContext) -> StoreResult<()> {
        let context = context.clone();
        self.writer
            .write(move |w| {
                let put = match shelf {
                    Shelf::Live => {
                        "INSERT INTO contexts (name, record) VALUES (?1, ?2) \
                         ON CONFLICT (name) DO UPDATE SET record = excluded.record"
                    }
                    Shelf::Shadow => {
                        forget_tallies(&w.conn, &context.name)?;
                        "INSERT INTO context_shadows (name, record) VALUES (?1, ?2) \
                         ON CONFLICT (name) DO UPDATE SET record = excluded.record"
                    }
                };
                changes_one(
                    &w.conn,
                    put,
                    params![context.name, encode_record(&context)?],
                )
                .map(|_| ())
            })
            .await
    }

    async fn context_delete(&self, shelf: Shelf, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.writer
            .write(move |w| {
                let delete = match shelf {
                    Shelf::Live => "DELETE FROM contexts WHERE name = ?1",
                    Shelf::Shadow => {
                        forget_tallies(&w.conn, &name)?;
                        "DELETE FROM context_shadows WHERE name = ?1"
                    }
                };
                changes_one(&w.conn, delete, params![name])
            })
            .await
    }

    async fn context_list(&self, shelf: Shelf) -> StoreResult<Vec<StoredContext>> {
        let list = match shelf {
            Shelf::Live => "SELECT record FROM contexts ORDER BY name",
            Shelf::Shadow => "SELECT record FROM context_shadows ORDER BY name",
        };
        self.writer.write(move |w| all_records(&w.conn, list)).await
    }

    async fn shadow_tally_add(&self, counts: &[ShadowTally]) -> StoreResult<()> {
        let counts = counts.to_vec();
        self.writer
            .write(move |w| {
                for count in &counts {
                    changes_one(
                        &w.conn,
                        "INSERT INTO shadow_tallies \
                         (context, version, tool, live, shadow, calls, first_at_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                         ON CONFLICT (context, version, tool, live, shadow) DO UPDATE SET \
                         calls = calls + excluded.calls, \
                         first_at_ms = min(first_at_ms, excluded.first_at_ms)",
                        params![
                            count.context,
                            count.version,
                            count.tool,
                            count.live,
                            count.shadow,
                            int(count.calls),
                            count.first_at_ms
                        ],
                    )?;
                }
                Ok(())
            })
            .await
    }

    async fn shadow_tallies(&self, context: &str, version: &str) -> StoreResult<Vec<ShadowTally>> {
        let (context, version) = (context.to_owned(), version.to_owned());
        self.writer
            .write(move |w| {
                w.conn
                    .prepare_cached(
                        "SELECT tool, live, shadow, calls, first_at_ms FROM shadow_tallies \
                         WHERE context = ?1 AND version = ?2 ORDER BY tool, live, shadow",
                    )
                    .and_then(|mut s| {
                        s.query_map(params![context, version], |row| {
                            Ok(ShadowTally {
                                context: context.clone(),
                                version: version.clone(),
                                tool: row.get(0)?,
                                live: row.get(1)?,
                                shadow: row.get(2)?,
                                calls: u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
                                first_at_ms: row.get(4)?,
                            })
                        })?
                        .collect()
                    })
                    .map_err(db)
            })
            .await
    }

    async fn tool_pin_first(&self, pin: &ToolPin) -> StoreResult<ToolPin> {
        let pin = pin.clone();
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "INSERT INTO tool_pins (upstream, tool, record) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (upstream, tool) DO NOTHING",
                    params![pin.upstream, pin.tool, encode_record(&pin)?],
                )?;
                let text: String = w
                    .conn
                    .prepare_cached(
                        "SELECT record FROM tool_pins WHERE upstream = ?1 AND tool = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![pin.upstream, pin.tool], |row| row.get(0))
                    })
                    .map_err(db)?;
                decode_record(&text)
            })
            .await
    }

    async fn tool_pin_put(&self, pin: &ToolPin) -> StoreResult<()> {
        let pin = pin.clone();
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "INSERT INTO tool_pins (upstream, tool, record) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (upstream, tool) DO UPDATE SET record = excluded.record",
                    params![pin.upstream, pin.tool, encode_record(&pin)?],
                )
                .map(|_| ())
            })
            .await
    }

    async fn tool_pins(&self) -> StoreResult<Vec<ToolPin>> {
        self.writer
            .write(|w| {
                all_records(
                    &w.conn,
                    "SELECT record FROM tool_pins ORDER BY upstream, tool",
                )
            })
            .await
    }

    async fn tool_sighting_first(
        &self,
        upstream: &str,
        tool: &str,
        sha256: &str,
        seen_at_ms: i64,
    ) -> StoreResult<bool> {
        let (upstream, tool, sha256) = (upstream.to_owned(), tool.to_owned(), sha256.to_owned());
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "INSERT INTO tool_sightings (upstream, tool, definition_sha256, seen_at_ms) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                    params![upstream, tool, sha256, seen_at_ms],
                )
            })
            .await
    }

    async fn sign_in_insert(
        &self,
        attempt: &SignInAttempt,
        forget_before_ms: i64,
    ) -> StoreResult<()> {
        let (state, created, record) = (
            attempt.state.clone(),
            attempt.created_at_ms,
            encode_record(attempt)?,
        );
        self.writer
            .write(move |w| {
                purge_then_insert(
                    &w.conn,
                    "DELETE FROM sign_in_attempts WHERE created_at_ms < ?1",
                    forget_before_ms,
                    "INSERT INTO sign_in_attempts (state, created_at_ms, record) VALUES (?1, ?2, ?3)",
                    params![state, created, record],
                )
            })
            .await?;
        self.writer.commit().await
    }

    async fn sign_in_take(&self, state: &str) -> StoreResult<Option<SignInAttempt>> {
        let state = state.to_owned();
        let taken = self
            .writer
            .write(move |w| {
                get_record(
                    &w.conn,
                    "DELETE FROM sign_in_attempts WHERE state = ?1 RETURNING record",
                    params![state],
                )
            })
            .await?;
        // Durable before the code is exchanged, so that a restart cannot give the state back.
        self.writer.commit().await?;
        Ok(taken)
    }

    async fn console_session_insert(
        &self,
        record: &ConsoleSessionRecord,
        now_ms: i64,
    ) -> StoreResult<()> {
        let (id_hash, ends, text) = (
            record.id_hash.clone(),
            record.ends_at_ms(),
            encode_record(record)?,
        );
        self.writer
            .write(move |w| {
                purge_then_insert(
                    &w.conn,
                    "DELETE FROM console_sessions WHERE ends_at_ms < ?1",
                    now_ms,
                    "INSERT INTO console_sessions (id_hash, ends_at_ms, record) VALUES (?1, ?2, ?3)",
                    params![id_hash, ends, text],
                )
            })
            .await?;
        self.writer.commit().await
    }

    async fn console_session_get(
        &self,
        id_hash: &str,
    ) -> StoreResult<Option<ConsoleSessionRecord>> {
        let id_hash = id_hash.to_owned();
        self.writer
            .write(move |w| {
                get_record(
                    &w.conn,
                    "SELECT record FROM console_sessions WHERE id_hash = ?1",
                    params![id_hash],
                )
            })
            .await
    }

    async fn console_session_touch(&self, record: &ConsoleSessionRecord) -> StoreResult<()> {
        let (id_hash, ends, text) = (
            record.id_hash.clone(),
            record.ends_at_ms(),
            encode_record(record)?,
        );
        // Not committed on its own: a last use lost to a crash only shortens an idle session.
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "UPDATE console_sessions SET ends_at_ms = ?2, record = ?3 WHERE id_hash = ?1",
                    params![id_hash, ends, text],
                )
                .map(|_| ())
            })
            .await
    }

    async fn console_session_delete(&self, id_hash: &str) -> StoreResult<bool> {
        let id_hash = id_hash.to_owned();
        let deleted = self
            .writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "DELETE FROM console_sessions WHERE id_hash = ?1",
                    params![id_hash],
                )
            })
            .await?;
        self.writer.commit().await?;
        Ok(deleted)
    }

    async fn first_seq(&self) -> StoreResult<Option<u64>> {
        self.writer
            .write(|w| {
                let first: Option<i64> = w
                    .conn
                    .query_row("SELECT min(seq) FROM audit_events", [], |row| row.get(0))
                    .map_err(db)?;
                Ok(first.and_then(|seq| u64::try_from(seq).ok()))
            })
            .await
    }

    async fn events_remove_through(&self, through: u64) -> StoreResult<u64> {
        let through = int(through);
        let removed = self
            .writer
            .write(move |w| {
                w.conn
                    .prepare_cached("DELETE FROM audit_events WHERE seq <= ?1")
                    .and_then(|mut s| s.execute(params![through]))
                    .map_err(db)
            })
            .await?;
        self.writer.commit().await?;
        Ok(removed as u64)
    }

    async fn settled_remove_before(&self, before_ms: i64, now_ms: i64) -> StoreResult<(u64, u64)> {
        let removed = self
            .writer
            .write(move |w| {
                let claims = w
                    .conn
                    .prepare_cached("DELETE FROM claims WHERE pending = 0 AND claimed_at_ms < ?1")
                    .and_then(|mut s| s.execute(params![before_ms]))
                    .map_err(db)?;
                let approvals = w
                    .conn
                    .prepare_cached(
                        "DELETE FROM approvals WHERE pending = 0 AND requested_at_ms < ?1 \
                         AND json_extract(record, '$.status') <> 'granted' \
                         AND json_extract(record, '$.expires_at_ms') + \
                             CASE json_extract(record, '$.status') \
                             WHEN 'expired' THEN json_extract(record, '$.expires_secs') * 1000 ELSE 0 END \
                             <= ?2",
                    )
                    .and_then(|mut s| s.execute(params![before_ms, now_ms]))
                    .map_err(db)?;
                // A call whose current request is gone has none: its next call asks anew.
                w.conn
                    .prepare_cached(
                        "DELETE FROM approval_calls WHERE approval_id NOT IN \
                         (SELECT approval_id FROM approvals)",
                    )
                    .and_then(|mut s| s.execute([]))
                    .map_err(db)?;
                Ok((claims as u64, approvals as u64))
            })
            .await?;
        self.writer.commit().await?;
        Ok(removed)
    }

    async fn replay_cover(&self) -> StoreResult<Option<ReplayCover>> {
        self.writer
            .write(|w| {
                w.conn
                    .prepare_cached("SELECT record FROM replay_cover")
                    .and_then(|mut s| s.query_row([], |row| row.get::<_, String>(0)).optional())
                    .map_err(db)?
                    .map(|text| decode_record(&text))
                    .transpose()
            })
            .await
    }

    async fn set_replay_cover(&self, cover: &ReplayCover) -> StoreResult<()> {
        let record = encode_record(cover)?;
        self.writer
            .write(move |w| {
                changes_one(
                    &w.conn,
                    "INSERT INTO replay_cover (id, record) VALUES (1, ?1) \
                     ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                    params![record],
                )
                .map(|_| ())
            })
            .await?;
        self.writer.commit().await
    }

    fn restores_from_chain(&self) -> bool {
        true
    }

    fn restore(&self, recovered: Recovered) {
        for seen in &recovered.signatures {
            self.replay.remember(&seen.signature, seen.expires_at_ms);
        }
        for (key, window, at_ms) in &recovered.rate_admissions {
            // Replayed in order; an admission the window refuses now was refused then too.
            let _ = self.rates.admit(key, window, *at_ms);
        }
    }
}

/// Reads one batch of a listing, after the cursor when there is one: rows of (cursor, record text).
type BatchQuery<C> = fn(&Connection, Option<&C>, i64) -> rusqlite::Result<Vec<(C, Stored)>>;

impl SqliteStore {
    /// Fills one page of a listing from batches that the readers read with `query`, starting after
    /// `cursor`; `keep` runs here, on the records as they come.
    async fn page<C, T>(
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
                .read(move |conn| query(conn, from.as_ref(), int(batch as u64)).map_err(db))
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

    /// Fails when the writer has stopped (see [`threads`]): memory-only steps must not admit calls that
    /// nothing could record.
    fn check_running(&self) -> StoreResult<()> {
        match self.writer.failed() {
            Some(why) => Err(threads::stopped(why)),
            None => Ok(()),
        }
    }
}

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
        events: &[Value],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        let after = after.clone();
        let rows = events
            .iter()
            .map(|event| Ok((ChainHead::of_event(event)?, pack(&event.to_string())?)))
            .collect::<StoreResult<Vec<(ChainHead, Vec<u8>)>>>()?;
        let settlements = settlements
            .iter()
            .map(|s| Ok((s.pending.clone(), ClaimRow::of(&s.settled)?)))
            .collect::<StoreResult<Vec<(ClaimRecord, ClaimRow)>>>()?;
        let labels = crate::store::labels_of_batch(events);
        self.writer
            .write(move |w| {
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
                            .execute(params![session_id, name, int(*seq)])
                            .map_err(db)?;
                    }
                }
                let mut insert = w
                    .conn
                    .prepare_cached("INSERT INTO audit_events (seq, event) VALUES (?1, ?2)")
                    .map_err(db)?;
                for (head, packed) in &rows {
                    insert.execute(params![int(head.seq), packed]).map_err(db)?;
                }
                drop(insert);
                if let Some((head, _)) = rows.last() {
                    w.head = head.clone();
                }
                Ok(())
            })
            .await
    }

    async fn sync(&self) -> StoreResult<()> {
        self.writer.commit().await
    }

    async fn append_durably(
        &self,
        after: &ChainHead,
        events: &[Value],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        // `join!` polls the append first, and its first poll queues the write (nothing before it
        // awaits), so the commit queued next covers it: one wake of the writer for both.
        let (appended, committed) = tokio::join!(
            self.append(after, events, settlements),
            self.writer.commit()
        );
        appended.and(committed)
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        let before = before_seq.map_or(i64::MAX, int);
        let limit = int(limit as u64);
        self.read(move |conn| {
            let texts: Vec<Stored> = conn
                .prepare_cached(
                    "SELECT event FROM audit_events WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
                )
                .and_then(|mut s| {
                    s.query_map(params![before, limit], |row| row.get(0))?
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

    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        let (from, limit) = (int(from_seq), int(limit as u64));
        self.read(move |conn| {
            let texts: Vec<Stored> = conn
                .prepare_cached(
                    "SELECT event FROM audit_events WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
                )
                .and_then(|mut s| {
                    s.query_map(params![from, limit], |row| row.get(0))?
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

/// Writes a consistent copy of the store in `dir` to `file` (mode 0600, synced) with SQLite's online
/// backup, in one step, so the copy is one committed state even while a gateway writes. Returns how many
/// audit events the copy holds.
pub fn backup(dir: &Path, file: &Path) -> StoreResult<u64> {
    let source = threads::open_reader(&existing_database(dir)?)?;
    let mut target = create_backup_file(file)?;
    let copied = copy_into(&source, file, &mut target);
    if copied.is_err() {
        let _ = std::fs::remove_file(file);
    }
    copied
}

/// FILE, new, with `O_EXCL | O_NOFOLLOW` (SPEC 20 rule 14): the backup is written through this descriptor,
/// so a name swapped for a symlink after it was made cannot send the store's contents elsewhere.
fn create_backup_file(file: &Path) -> StoreResult<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(file)
        .map_err(|e| StoreError::unavailable(format!("cannot create {}: {e}", file.display())))
}

/// SQLite's backup API writes to a database it opens by name, so the copy is made in a private folder of
/// its own beside FILE (mode 0700: nobody else can reach into it), then copied into `target` and synced.
fn copy_into(source: &Connection, file: &Path, target: &mut std::fs::File) -> StoreResult<u64> {
    let beside = file.parent().filter(|p| !p.as_os_str().is_empty());
    let staging = tempfile::Builder::new()
        .prefix(".sealgate-backup-")
        .tempdir_in(beside.unwrap_or(Path::new(".")))
        .map_err(|e| {
            StoreError::unavailable(format!(
                "cannot make a folder beside {}: {e}",
                file.display()
            ))
        })?;
    let copy = staging.path().join(FILE_NAME);
    let events = backup_to(source, &copy)?;
    let mut staged = std::fs::File::open(&copy)
        .map_err(|e| StoreError::unavailable(format!("cannot read {}: {e}", copy.display())))?;
    std::io::copy(&mut staged, target)
        .and_then(|_| target.sync_all())
        .map_err(|e| StoreError::unavailable(format!("cannot write {}: {e}", file.display())))?;
    crate::files::sync_parent(file).map_err(StoreError::unavailable)?;
    Ok(events)
}

/// A consistent copy of `source` as a plain database at `copy` (no WAL beside it to lose); returns how many
/// audit events it holds.
fn backup_to(source: &Connection, copy: &Path) -> StoreResult<u64> {
    let mut target = Connection::open(copy).map_err(db)?;
    {
        let backup = rusqlite::backup::Backup::new(source, &mut target).map_err(db)?;
        match backup.step(-1).map_err(db)? {
            rusqlite::backup::StepResult::Done => {}
            _ => {
                return Err(StoreError::unavailable(
                    "the backup did not complete in one step",
                ))
            }
        }
    }
    target
        .query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
        .map_err(db)?;
    let events: i64 = target
        .query_row("SELECT count(*) FROM audit_events", [], |row| row.get(0))
        .map_err(db)?;
    Ok(u64::try_from(events).unwrap_or(0))
}

/// The database file in `dir`, which must exist (a command that only reads never creates one).
fn existing_database(dir: &Path) -> StoreResult<PathBuf> {
    let path = SqliteStore::path_in(dir);
    if !path.is_file() {
        return Err(StoreError::unavailable(format!(
            "no embedded store at {}",
            path.display()
        )));
    }
    Ok(path)
}

/// `sealgate store check`: SQLite's integrity check, then the audit chain walked from seq 1 (`visit`
/// gets each event's text, in seq order). Fails naming the first problem.
pub fn check(
    dir: &Path,
    visit: &mut dyn FnMut(String) -> Result<(), String>,
) -> Result<(), String> {
    let conn = threads::open_reader(&existing_database(dir).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let problems: Vec<String> = conn
        .prepare("PRAGMA integrity_check(10)")
        .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect())
        .map_err(|e| format!("integrity check could not run: {e}"))?;
    if problems != ["ok"] {
        return Err(format!("integrity check failed: {}", problems.join("; ")));
    }
    let mut events = conn
        .prepare("SELECT event FROM audit_events ORDER BY seq")
        .map_err(|e| e.to_string())?;
    let mut rows = events.query([]).map_err(|e| e.to_string())?;
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        let Stored(text) = row.get(0).map_err(|e| e.to_string())?;
        visit(text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

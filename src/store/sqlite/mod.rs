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
//!
//! The files mirror the PostgreSQL store's: `migrate.rs` (the schema), `sql.rs` (what every statement
//! shares, and the one paging loop), `admit.rs` ([`Store::admit`]), `audit.rs` ([`AuditBackend`]) and
//! `tests.rs`; and what only this store has: its threads (`threads.rs`), packed records (`packed.rs`), what
//! it keeps in memory (`memory.rs`), its folder lock (`folder_lock.rs`) and the `store` commands' reads of
//! the file (`commands.rs`).

mod admit;
mod audit;
mod commands;
mod folder_lock;
mod memory;
mod migrate;
mod packed;
mod sql;
mod threads;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value;

use self::folder_lock::FolderLock;
use self::memory::{BudgetCounts, RateWindows, ReplaySet};
use self::packed::Stored;
use self::sql::{
    all_records, changes_one, claim_insert, claim_replace, db, forget_tallies, get_record,
    insert_or_get, purge_then_insert, ClaimRow, APPROVAL_BY_ID, CLAIM_BY_ID, SESSION_BY_ID,
};
use self::threads::{Checkpointer, Readers, Writable, Writer};
use super::{
    decode_record, encode_record, sql_int, Admission, Admitted, ApprovalCursor, ApprovalRecord,
    ApprovalStatus, ChainHead, ClaimCursor, ClaimKind, ClaimRecord, ConsoleSessionRecord,
    LiveCounts, Recovered, SessionLabel, SessionRecord, ShadowTally, Shelf, SignInAttempt, Store,
    StoreError, StoreResult, StoredContext, ToolPin,
};
use crate::replay::ReplayCover;

pub use self::commands::{backup, check};

/// The database file in `data_dir`.
pub const FILE_NAME: &str = "sealgate.db";

/// Read connections: lookups and listings are rare next to writes, and the machine may have two cores.
const READERS: usize = 2;

/// The write-ahead log is started over once it holds this much (SQLite's own default is about 4 MiB).
const WAL_LIMIT_BYTES: u64 = 64 << 20;

/// What every connection of the writer sets. The writer never checkpoints by itself (the checkpointer
/// does, off the commit path); the WAL file is cut back to 64 MiB after each reset.
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
        migrate::migrate(&conn)?;
        let head = read_head(&conn)?;
        let budgets = Arc::new(BudgetCounts::default());
        let writer = Writer::start(
            Writable { conn, head },
            wal_limit,
            admit::unwritten_budgets(budgets.clone()),
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

    /// Fails when the writer has stopped (see [`threads`]): memory-only steps must not admit calls that
    /// nothing could record.
    fn check_running(&self) -> StoreResult<()> {
        match self.writer.failed() {
            Some(why) => Err(threads::stopped(why)),
            None => Ok(()),
        }
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

/// A session's expiry while it is not revoked (the live-sessions gauge's index).
fn live_until(record: &SessionRecord) -> Option<i64> {
    record.revoked_at_ms.is_none().then_some(record.expires_at)
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
        self.admit_with_memory(admission).await
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
                            sql_int(count.calls),
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
            .write_durably(move |w| {
                purge_then_insert(
                    &w.conn,
                    "DELETE FROM sign_in_attempts WHERE created_at_ms < ?1",
                    forget_before_ms,
                    "INSERT INTO sign_in_attempts (state, created_at_ms, record) VALUES (?1, ?2, ?3)",
                    params![state, created, record],
                )
            })
            .await
    }

    async fn sign_in_take(&self, state: &str) -> StoreResult<Option<SignInAttempt>> {
        let state = state.to_owned();
        // Durable before the code is exchanged, so that a restart cannot give the state back.
        self.writer
            .write_durably(move |w| {
                get_record(
                    &w.conn,
                    "DELETE FROM sign_in_attempts WHERE state = ?1 RETURNING record",
                    params![state],
                )
            })
            .await
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
            .write_durably(move |w| {
                purge_then_insert(
                    &w.conn,
                    "DELETE FROM console_sessions WHERE ends_at_ms < ?1",
                    now_ms,
                    "INSERT INTO console_sessions (id_hash, ends_at_ms, record) VALUES (?1, ?2, ?3)",
                    params![id_hash, ends, text],
                )
            })
            .await
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
        let through = sql_int(through);
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

#[cfg(test)]
mod tests;

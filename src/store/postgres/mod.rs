//! The shared store on PostgreSQL (SPEC 12): any number of replicas pointed at one database behave as
//! one gateway. Every decision is a single statement or one transaction, so it holds across processes:
//! insert-if-absent is `INSERT … ON CONFLICT DO NOTHING`, compare-and-set compares the stored record text,
//! `admit` locks its counter rows (the admissions of concurrent calls share one statement, [`admit`]), and
//! an audit append locks the chain head ([`audit`]).
//!
//! Every write is committed before it returns, so it is durable at once and `sync` has nothing to do.
//! Every failure is a [`StoreError`] (the gateway answers 5005); none is swallowed.
//!
//! The files mirror the embedded store's: `migrate.rs` (the schema), `sql.rs` (what every statement
//! shares, and the one paging loop), `admit.rs` ([`Store::admit`]), `audit.rs` ([`AuditBackend`]) and
//! `tests.rs`; and what only this store has: its TLS connector (`tls.rs`) and how a replica hears of
//! other replicas' changes (`changes.rs`).

mod admit;
mod audit;
mod changes;
mod migrate;
mod sql;
mod tls;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};

use self::admit::{budget_count, Admitter, REMEMBER_SIGNATURE};
use self::sql::{db, forget_tallies, Listing, Prepared};
use self::tls::{MakeRustls, PgTarget};
use super::{
    decode_record, encode_record, sql_int, Admission, Admitted, ApprovalCursor, ApprovalRecord,
    ClaimCursor, ClaimKind, ClaimRecord, ConsoleSessionRecord, LiveCounts, SessionLabel,
    SessionRecord, ShadowTally, Shelf, SignInAttempt, SigningKeyRecord, Store, StoreError,
    StoreResult, StoredContext, ToolPin,
};
use crate::replay::ReplayCover;

pub use self::changes::{CONTEXT_POLL, SESSION_NOTICE};

/// Connections per replica; concurrent calls beyond this wait for one (at most `WAIT`).
const POOL_SIZE: usize = 16;

/// How long a call waits for a connection, or for one to be made, before failing closed.
const WAIT: Duration = Duration::from_secs(5);

pub struct PgStore {
    pool: Pool,
    /// Admissions without a rate window, committed a batch at a time.
    admitter: Admitter,
    /// For the session listener's own connection (LISTEN needs one that the pool never lends out).
    config: tokio_postgres::Config,
    tls: MakeRustls,
}

impl PgStore {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`) and brings the schema up to date; refuses a
    /// schema newer than this build knows.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        let PgTarget { mut config, tls } = tls::target(url).map_err(StoreError::unavailable)?;
        config.connect_timeout(WAIT);
        config.application_name("sealgate");
        // No statement may hold a call longer than WAIT: a lock held elsewhere ends in an error (5005) on the
        // server's side, and a server that stops answering (a dead host, a cut network) on ours.
        config.options(format!("-c statement_timeout={}", WAIT.as_millis()));
        config.tcp_user_timeout(WAIT);
        config.keepalives_idle(WAIT);
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                // A connection the server closed (restart, pg_terminate_backend) is dropped, not reused.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(WAIT))
            .create_timeout(Some(WAIT))
            .recycle_timeout(Some(WAIT))
            .build()
            .map_err(db)?;
        let store = PgStore {
            admitter: Admitter::start(pool.clone()),
            pool,
            config,
            tls,
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn conn(&self) -> StoreResult<Object> {
        self.pool.get().await.map_err(db)
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn ping(&self) -> StoreResult<()> {
        self.conn()
            .await?
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(db)
    }

    async fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>> {
        let text = encode_record(record)?;
        self.insert_or_get(
            "INSERT INTO sessions (session_id, record) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&record.session_id, &text],
            "SELECT record FROM sessions WHERE session_id = $1",
            &[&record.session_id],
        )
        .await?
        .map(|existing| decode_record(&existing))
        .transpose()
    }

    async fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT record FROM sessions WHERE session_id = $1",
                &[&session_id],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(row.get(0))).transpose()
    }

    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        self.changes_one(
            "UPDATE sessions SET record = $3 WHERE session_id = $1 AND record = $2",
            &[&old.session_id, &encode_record(old)?, &encode_record(new)?],
        )
        .await
    }

    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)> {
        // Session ids are COLLATE "C": the same byte order as the embedded store's keys.
        let sessions = Listing {
            first: "SELECT session_id, record FROM sessions ORDER BY session_id LIMIT $1",
            after: "SELECT session_id, record FROM sessions WHERE session_id > $1 \
                    ORDER BY session_id LIMIT $2",
        };
        self.page(&sessions, limit, keep, after.map(str::to_owned))
            .await
    }

    async fn session_labels(&self, session_id: &str) -> StoreResult<Vec<SessionLabel>> {
        let rows = self
            .conn()
            .await?
            .query_prepared(
                "SELECT label, seq FROM session_labels WHERE session_id = $1 ORDER BY seq, label",
                &[&session_id],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(SessionLabel {
                    label: row.get(0),
                    seq: u64::try_from(row.get::<_, i64>(1))
                        .map_err(|_| StoreError::Corrupt("negative label seq".into()))?,
                })
            })
            .collect()
    }

    async fn counter_get(&self, key: &str) -> StoreResult<Option<i64>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT state FROM counters WHERE key = $1",
                &[&key.as_bytes()],
            )
            .await
            .map_err(db)?;
        match row.and_then(|row| row.get::<_, Option<Vec<u8>>>(0)) {
            None => Ok(None),
            Some(bytes) => budget_count(Some(&bytes)).map(Some),
        }
    }

    async fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool> {
        let inserted = self
            .conn()
            .await?
            .execute_prepared(REMEMBER_SIGNATURE, &[&signature, &expires_at_ms])
            .await
            .map_err(db)?;
        Ok(inserted == 1)
    }

    async fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize> {
        let purged = self
            .conn()
            .await?
            .execute_prepared(
                "DELETE FROM seen_signatures WHERE expires_at_ms < $1",
                &[&now_ms],
            )
            .await
            .map_err(db)?;
        Ok(usize::try_from(purged).unwrap_or(usize::MAX))
    }

    async fn admit(&self, admission: &Admission) -> StoreResult<Admitted> {
        match (&admission.rate, &admission.budget) {
            (None, Some((key, max))) => self.admit_batched(admission, (key, *max)).await,
            _ => self.admit_in_transaction(admission).await,
        }
    }

    async fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>> {
        let kind = record.kind.as_str();
        self.insert_or_get(
            "INSERT INTO claims (kind, request_id, claimed_at_ms, record) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
            &[
                &kind,
                &record.request_id,
                &record.claimed_at_ms,
                &encode_record(record)?,
            ],
            "SELECT record FROM claims WHERE kind = $1 AND request_id = $2",
            &[&kind, &record.request_id],
        )
        .await?
        .map(|existing| decode_record(&existing))
        .transpose()
    }

    async fn claim_get(
        &self,
        kind: ClaimKind,
        request_id: &str,
    ) -> StoreResult<Option<ClaimRecord>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT record FROM claims WHERE kind = $1 AND request_id = $2",
                &[&kind.as_str(), &request_id],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(row.get(0))).transpose()
    }

    async fn claim_replace(
        &self,
        old: &ClaimRecord,
        new: Option<&ClaimRecord>,
    ) -> StoreResult<bool> {
        let kind = old.kind.as_str();
        match new {
            Some(new) => {
                self.changes_one(
                    "UPDATE claims SET record = $4 \
                     WHERE kind = $1 AND request_id = $2 AND record = $3",
                    &[
                        &kind,
                        &old.request_id,
                        &encode_record(old)?,
                        &encode_record(new)?,
                    ],
                )
                .await
            }
            None => {
                self.changes_one(
                    "DELETE FROM claims WHERE kind = $1 AND request_id = $2 AND record = $3",
                    &[&kind, &old.request_id, &encode_record(old)?],
                )
                .await
            }
        }
    }

    async fn claim_page(
        &self,
        before: Option<&ClaimCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ClaimRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ClaimRecord>, bool)> {
        let claims = Listing {
            first: "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                    ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT $1",
            after: "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                    WHERE (claimed_at_ms, kind, request_id) < ($1, $2, $3) \
                    ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT $4",
        };
        let cursor = before.map(|c| {
            (
                c.claimed_at_ms,
                c.kind.as_str().to_owned(),
                c.request_id.clone(),
            )
        });
        self.page(&claims, limit, keep, cursor).await
    }

    async fn live_counts(&self, now_secs: i64) -> StoreResult<LiveCounts> {
        let row = self
            .conn()
            .await?
            .query_one_prepared(
                "SELECT (SELECT count(*) FROM sessions WHERE live_until > $1), \
                 (SELECT count(*) FROM claims WHERE pending), \
                 (SELECT count(*) FROM approvals WHERE pending)",
                &[&now_secs],
            )
            .await
            .map_err(db)?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok(LiveCounts {
            sessions: count(0),
            pending_claims: count(1),
            pending_approvals: count(2),
        })
    }

    async fn approval_insert(
        &self,
        record: &ApprovalRecord,
        replacing: Option<&str>,
    ) -> StoreResult<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        tx.execute_prepared(
            "INSERT INTO approvals (approval_id, requested_at_ms, record) VALUES ($1, $2, $3)",
            &[
                &record.approval_id,
                &record.requested_at_ms,
                &encode_record(record)?,
            ],
        )
        .await
        .map_err(db)?;
        // A concurrent request for the same call waits on the row and then finds it changed: 0 rows.
        let current = match replacing {
            None => tx
                .execute_prepared(
                    "INSERT INTO approval_calls (session_id, call_digest, approval_id) \
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&record.session_id, &record.call_digest, &record.approval_id],
                )
                .await
                .map_err(db)?,
            Some(previous) => tx
                .execute_prepared(
                    "UPDATE approval_calls SET approval_id = $3 \
                     WHERE session_id = $1 AND call_digest = $2 AND approval_id = $4",
                    &[
                        &record.session_id,
                        &record.call_digest,
                        &record.approval_id,
                        &previous,
                    ],
                )
                .await
                .map_err(db)?,
        };
        if current != 1 {
            tx.rollback().await.map_err(db)?;
            return Ok(false);
        }
        tx.commit().await.map_err(db)?;
        Ok(true)
    }

    async fn approval_current(
        &self,
        session_id: &str,
        call_digest: &str,
    ) -> StoreResult<Option<ApprovalRecord>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT a.record FROM approval_calls c JOIN approvals a USING (approval_id) \
                 WHERE c.session_id = $1 AND c.call_digest = $2",
                &[&session_id, &call_digest],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(row.get(0))).transpose()
    }

    async fn approval_get(&self, approval_id: &str) -> StoreResult<Option<ApprovalRecord>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT record FROM approvals WHERE approval_id = $1",
                &[&approval_id],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(row.get(0))).transpose()
    }

    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool> {
        self.changes_one(
            "UPDATE approvals SET record = $3 WHERE approval_id = $1 AND record = $2",
            &[&old.approval_id, &encode_record(old)?, &encode_record(new)?],
        )
        .await
    }

    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)> {
        let approvals = Listing {
            first: "SELECT requested_at_ms, approval_id, record FROM approvals \
                    ORDER BY requested_at_ms DESC, approval_id DESC LIMIT $1",
            after: "SELECT requested_at_ms, approval_id, record FROM approvals \
                    WHERE (requested_at_ms, approval_id) < ($1, $2) \
                    ORDER BY requested_at_ms DESC, approval_id DESC LIMIT $3",
        };
        let cursor = before.map(|c| (c.requested_at_ms, c.approval_id.clone()));
        self.page(&approvals, limit, keep, cursor).await
    }

    async fn context_put(&self, shelf: Shelf, context: &StoredContext) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        let put = match shelf {
            Shelf::Live => {
                "INSERT INTO contexts (name, record) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record"
            }
            Shelf::Shadow => {
                forget_tallies(&tx, &context.name).await?;
                "INSERT INTO context_shadows (name, record) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record"
            }
        };
        tx.execute_prepared(put, &[&context.name, &encode_record(context)?])
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn context_delete(&self, shelf: Shelf, name: &str) -> StoreResult<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        let delete = match shelf {
            Shelf::Live => "DELETE FROM contexts WHERE name = $1",
            Shelf::Shadow => {
                forget_tallies(&tx, name).await?;
                "DELETE FROM context_shadows WHERE name = $1"
            }
        };
        let deleted = tx.execute_prepared(delete, &[&name]).await.map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(deleted == 1)
    }

    async fn context_list(&self, shelf: Shelf) -> StoreResult<Vec<StoredContext>> {
        let list = match shelf {
            Shelf::Live => "SELECT record FROM contexts ORDER BY name",
            Shelf::Shadow => "SELECT record FROM context_shadows ORDER BY name",
        };
        let rows = self
            .conn()
            .await?
            .query_prepared(list, &[])
            .await
            .map_err(db)?;
        rows.iter().map(|row| decode_record(row.get(0))).collect()
    }

    async fn shadow_tally_add(&self, counts: &[ShadowTally]) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        for count in counts {
            tx.execute_prepared(
                "INSERT INTO shadow_tallies \
                 (context, version, tool, live, shadow, calls, first_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (context, version, tool, live, shadow) DO UPDATE SET \
                 calls = shadow_tallies.calls + EXCLUDED.calls, \
                 first_at_ms = LEAST(shadow_tallies.first_at_ms, EXCLUDED.first_at_ms)",
                &[
                    &count.context,
                    &count.version,
                    &count.tool,
                    &count.live,
                    &count.shadow,
                    &sql_int(count.calls),
                    &count.first_at_ms,
                ],
            )
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }

    async fn shadow_tallies(&self, context: &str, version: &str) -> StoreResult<Vec<ShadowTally>> {
        let rows = self
            .conn()
            .await?
            .query_prepared(
                "SELECT tool, live, shadow, calls, first_at_ms FROM shadow_tallies \
                 WHERE context = $1 AND version = $2 ORDER BY tool, live, shadow",
                &[&context, &version],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|row| ShadowTally {
                context: context.to_owned(),
                version: version.to_owned(),
                tool: row.get(0),
                live: row.get(1),
                shadow: row.get(2),
                calls: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
                first_at_ms: row.get(4),
            })
            .collect())
    }

    async fn tool_pin_first(&self, pin: &ToolPin) -> StoreResult<ToolPin> {
        // The statement's snapshot cannot see its own insert: the new row comes from RETURNING, an
        // existing one from the SELECT.
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "WITH inserted AS (INSERT INTO tool_pins (upstream, tool, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (upstream, tool) DO NOTHING RETURNING record) \
                 SELECT record FROM inserted UNION ALL \
                 SELECT record FROM tool_pins WHERE upstream = $1 AND tool = $2 LIMIT 1",
                &[&pin.upstream, &pin.tool, &encode_record(pin)?],
            )
            .await
            .map_err(db)?;
        match row {
            Some(row) => decode_record(&row.get::<_, String>(0)),
            None => Err(StoreError::unavailable("the tool's pin vanished")),
        }
    }

    async fn tool_pin_put(&self, pin: &ToolPin) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "INSERT INTO tool_pins (upstream, tool, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (upstream, tool) DO UPDATE SET record = EXCLUDED.record",
                &[&pin.upstream, &pin.tool, &encode_record(pin)?],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn tool_pins(&self) -> StoreResult<Vec<ToolPin>> {
        let rows = self
            .conn()
            .await?
            .query_prepared("SELECT record FROM tool_pins ORDER BY upstream, tool", &[])
            .await
            .map_err(db)?;
        rows.iter().map(|row| decode_record(row.get(0))).collect()
    }

    async fn tool_sighting_first(
        &self,
        upstream: &str,
        tool: &str,
        sha256: &str,
        seen_at_ms: i64,
    ) -> StoreResult<bool> {
        let inserted = self
            .conn()
            .await?
            .execute_prepared(
                "INSERT INTO tool_sightings (upstream, tool, definition_sha256, seen_at_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[&upstream, &tool, &sha256, &seen_at_ms],
            )
            .await
            .map_err(db)?;
        Ok(inserted == 1)
    }

    async fn sign_in_insert(
        &self,
        attempt: &SignInAttempt,
        forget_before_ms: i64,
    ) -> StoreResult<()> {
        self.purge_then_insert(
            "DELETE FROM sign_in_attempts WHERE created_at_ms < $1",
            forget_before_ms,
            "INSERT INTO sign_in_attempts (state, created_at_ms, record) VALUES ($1, $2, $3)",
            &[
                &attempt.state,
                &attempt.created_at_ms,
                &encode_record(attempt)?,
            ],
        )
        .await
    }

    async fn sign_in_take(&self, state: &str) -> StoreResult<Option<SignInAttempt>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "DELETE FROM sign_in_attempts WHERE state = $1 RETURNING record",
                &[&state],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(&row.get::<_, String>(0)))
            .transpose()
    }

    async fn console_session_insert(
        &self,
        record: &ConsoleSessionRecord,
        now_ms: i64,
    ) -> StoreResult<()> {
        self.purge_then_insert(
            "DELETE FROM console_sessions WHERE ends_at_ms < $1",
            now_ms,
            "INSERT INTO console_sessions (id_hash, ends_at_ms, record) VALUES ($1, $2, $3)",
            &[
                &record.id_hash,
                &record.ends_at_ms(),
                &encode_record(record)?,
            ],
        )
        .await
    }

    async fn console_session_get(
        &self,
        id_hash: &str,
    ) -> StoreResult<Option<ConsoleSessionRecord>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared(
                "SELECT record FROM console_sessions WHERE id_hash = $1",
                &[&id_hash],
            )
            .await
            .map_err(db)?;
        row.map(|row| decode_record(&row.get::<_, String>(0)))
            .transpose()
    }

    async fn console_session_touch(&self, record: &ConsoleSessionRecord) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "UPDATE console_sessions SET ends_at_ms = $2, record = $3 WHERE id_hash = $1",
                &[
                    &record.id_hash,
                    &record.ends_at_ms(),
                    &encode_record(record)?,
                ],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn console_session_delete(&self, id_hash: &str) -> StoreResult<bool> {
        let deleted = self
            .conn()
            .await?
            .execute_prepared(
                "DELETE FROM console_sessions WHERE id_hash = $1",
                &[&id_hash],
            )
            .await
            .map_err(db)?;
        Ok(deleted == 1)
    }

    async fn first_seq(&self) -> StoreResult<Option<u64>> {
        let row = self
            .conn()
            .await?
            .query_one_prepared("SELECT min(seq) FROM audit_events", &[])
            .await
            .map_err(db)?;
        Ok(row
            .get::<_, Option<i64>>(0)
            .and_then(|seq| u64::try_from(seq).ok()))
    }

    async fn events_remove_through(&self, through: u64) -> StoreResult<u64> {
        self.conn()
            .await?
            .execute_prepared(
                "DELETE FROM audit_events WHERE seq <= $1",
                &[&sql_int(through)],
            )
            .await
            .map_err(db)
    }

    async fn settled_remove_before(&self, before_ms: i64, now_ms: i64) -> StoreResult<(u64, u64)> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        let claims = tx
            .execute_prepared(
                "DELETE FROM claims WHERE NOT pending AND claimed_at_ms < $1",
                &[&before_ms],
            )
            .await
            .map_err(db)?;
        let approvals = tx
            .execute_prepared(
                "DELETE FROM approvals a USING \
                 (SELECT approval_id, replace(record, '\\u0000', '\\u0001')::json AS r FROM approvals \
                  WHERE NOT pending AND requested_at_ms < $1) old \
                 WHERE a.approval_id = old.approval_id AND old.r ->> 'status' <> 'granted' \
                 AND (old.r ->> 'expires_at_ms')::bigint + \
                     CASE old.r ->> 'status' \
                     WHEN 'expired' THEN (old.r ->> 'expires_secs')::bigint * 1000 ELSE 0 END \
                     <= $2",
                &[&before_ms, &now_ms],
            )
            .await
            .map_err(db)?;
        // A call whose current request is gone has none: its next call asks anew.
        tx.execute_prepared(
            "DELETE FROM approval_calls c WHERE NOT EXISTS \
             (SELECT 1 FROM approvals a WHERE a.approval_id = c.approval_id)",
            &[],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok((claims, approvals))
    }

    async fn retention_turn(&self, holder: &str, now_ms: i64, until_ms: i64) -> StoreResult<bool> {
        let taken = self
            .conn()
            .await?
            .execute_prepared(
                "UPDATE retention_lease SET holder = $1, until_ms = $3 \
                 WHERE id = 1 AND (holder = $1 OR until_ms < $2)",
                &[&holder, &now_ms, &until_ms],
            )
            .await
            .map_err(db)?;
        Ok(taken == 1)
    }

    async fn replay_cover(&self) -> StoreResult<Option<ReplayCover>> {
        let row = self
            .conn()
            .await?
            .query_opt_prepared("SELECT record FROM replay_cover", &[])
            .await
            .map_err(db)?;
        row.map(|row| decode_record(&row.get::<_, String>(0)))
            .transpose()
    }

    async fn set_replay_cover(&self, cover: &ReplayCover) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "INSERT INTO replay_cover (id, record) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                &[&encode_record(cover)?],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn signing_key_publish(&self, key: &SigningKeyRecord) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "INSERT INTO signing_keys (kid, public_key, replica_id) VALUES ($1, $2, $3) \
                 ON CONFLICT (kid) DO NOTHING",
                &[&key.kid, &key.public_key.as_slice(), &key.replica_id],
            )
            .await
            .map(|_| ())
            .map_err(db)
    }

    async fn signing_keys(&self) -> StoreResult<Vec<SigningKeyRecord>> {
        let rows = self
            .conn()
            .await?
            .query_prepared(
                "SELECT kid, public_key, replica_id FROM signing_keys ORDER BY published_at, kid",
                &[],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let bytes: Vec<u8> = row.get(1);
                Ok(SigningKeyRecord {
                    kid: row.get(0),
                    public_key: bytes.as_slice().try_into().map_err(|_| {
                        StoreError::Corrupt("a stored signing key is not 32 bytes".into())
                    })?,
                    replica_id: row.get(2),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

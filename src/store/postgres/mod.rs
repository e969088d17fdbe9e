//! The shared store on PostgreSQL (SPEC 12): any number of replicas pointed at one database behave as
//! one gateway. Every decision is a single statement or one transaction, so it holds across processes:
//! insert-if-absent is `INSERT … ON CONFLICT DO NOTHING`, compare-and-set compares the stored record text,
//! `admit` locks its counter rows (the admissions of concurrent calls share one statement, [`admit`]), and
//! an audit append locks the chain head ([`audit`]).
//!
//! Every write is committed before it returns, so it is durable at once and `sync` has nothing to do.
//! Every failure is a [`StoreError`] (the gateway answers 5005); none is swallowed.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::{
    Admission, Admitted, ApprovalCursor, ApprovalRecord, ClaimCursor, ClaimKind, ClaimRecord,
    ConsoleSessionRecord, LiveCounts, Page, SessionLabel, SessionRecord, ShadowTally, Shelf,
    SignInAttempt, SigningKeyRecord, Store, StoreError, StoreResult, StoredContext, StoredContexts,
    ToolPin,
};
use crate::replay::ReplayCover;
use admit::{AdmitRow, Admitter, PendingClaim};
use tls::{MakeRustls, PgTarget};

/// The migrations, in order: entry `i` brings the schema to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/postgres/0001_initial.sql"),
    include_str!("../migrations/postgres/0002_context_version.sql"),
    include_str!("../migrations/postgres/0003_counter_keys_bytea.sql"),
    include_str!("../migrations/postgres/0004_approvals.sql"),
    include_str!("../migrations/postgres/0005_signing_keys.sql"),
    include_str!("../migrations/postgres/0006_gauges_and_retention.sql"),
    include_str!("../migrations/postgres/0007_batch_functions.sql"),
    include_str!("../migrations/postgres/0008_replay_cover.sql"),
    include_str!("../migrations/postgres/0009_console_sign_in.sql"),
    include_str!("../migrations/postgres/0010_session_labels.sql"),
    include_str!("../migrations/postgres/0011_tool_pins.sql"),
    include_str!("../migrations/postgres/0012_context_shadows.sql"),
];

/// Taken by whichever replica migrates, so that replicas starting together migrate once.
const MIGRATION_LOCK: i64 = 0x5ea1_6a7e;

/// Connections per replica; concurrent calls beyond this wait for one (at most `WAIT`).
const POOL_SIZE: usize = 16;
/// How long a call waits for a connection, or for one to be made, before failing closed.
const WAIT: Duration = Duration::from_secs(5);

mod admit;
mod audit;
mod tls;

pub struct PgStore {
    pool: Pool,
    /// Admissions without a rate window, committed a batch at a time.
    admitter: Admitter,
    /// For the session listener's own connection (LISTEN needs one that the pool never lends out).
    config: tokio_postgres::Config,
    tls: MakeRustls,
}

/// The error with its causes: tokio-postgres's own text is only "db error", the server's message is its
/// source.
fn db(err: impl std::error::Error) -> StoreError {
    let mut text = format!("postgres: {err}");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    StoreError::unavailable(text)
}

fn encode<T: Serialize>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A budget cell's state: the count as 8 big-endian bytes (what `int8send` writes in SQL).
fn budget_bytes(count: i64) -> Vec<u8> {
    count.to_be_bytes().to_vec()
}

fn budget_count(bytes: Option<&[u8]>) -> StoreResult<i64> {
    match bytes {
        None => Ok(0),
        Some(raw) => raw
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| StoreError::Corrupt("budget counter is not 8 bytes".into())),
    }
}

/// SQL's bigint for a seq or a limit (both far below 2^63 in practice; clamped, never wrapped).
fn bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn seq_of(event: &Value) -> StoreResult<i64> {
    event
        .get("seq")
        .and_then(Value::as_u64)
        .map(bigint)
        .ok_or_else(|| StoreError::Corrupt("audit event without seq".into()))
}

/// Statements prepared once per connection and cached by the pool: tokio-postgres prepares a `&str` query
/// before every execution, so each statement would cost two round trips instead of one.
#[async_trait::async_trait]
trait Prepared: deadpool_postgres::GenericClient {
    async fn execute_prepared(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.execute(&statement, params).await
    }

    async fn query_prepared(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query(&statement, params).await
    }

    async fn query_one_prepared(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_one(&statement, params).await
    }

    async fn query_opt_prepared(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        self.query_opt(&statement, params).await
    }
}

impl<T: deadpool_postgres::GenericClient> Prepared for T {}

/// A shadow set again, or removed, starts its count over (SPEC 6.4 r4: calls decided since it was set).
async fn forget_tallies(tx: &impl Prepared, context: &str) -> StoreResult<()> {
    tx.execute_prepared("DELETE FROM shadow_tallies WHERE context = $1", &[&context])
        .await
        .map_err(db)?;
    Ok(())
}

impl PgStore {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`) and brings the schema up to date; refuses a
    /// schema newer than this build knows.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        let PgTarget { mut config, tls } =
            tls::target(url).map_err(StoreError::unavailable)?;
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

    /// Calls `changed` with the id of every session that any replica changes (revokes), within
    /// [`SESSION_NOTICE`] of the change, for as long as `changed` returns true. LISTEN/NOTIFY brings the
    /// change at once; after a lost connection, the changes made meanwhile are read from the table.
    pub async fn watch_sessions(
        &self,
        changed: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> StoreResult<()> {
        let (config, tls) = (self.config.clone(), self.tls.clone());
        // Server time (ms) up to which every change has been seen. Read before this replica caches any
        // session, so that the first connection catches up on revocations made while it was connecting.
        let mut seen_until: i64 = self
            .conn()
            .await?
            .query_one_prepared(SERVER_NOW_MS, &[])
            .await
            .map_err(db)?
            .get(0);
        tokio::spawn(async move {
            loop {
                match listen(&config, &tls, &mut seen_until, &changed).await {
                    Ok(Listening::Stopped) => return,
                    Ok(Listening::Lost) => {}
                    Err(e) => tracing::warn!(error = %e, "session change listener lost PostgreSQL"),
                }
                tokio::time::sleep(SESSION_NOTICE / 4).await;
            }
        });
        Ok(())
    }

    /// The change counter, the contexts and their shadows, when the counter differs from `seen`. The
    /// counter is read first: a change made between the reads moves it again, so the next poll reads once
    /// more.
    pub async fn contexts_if_changed(
        &self,
        seen: Option<i64>,
    ) -> StoreResult<Option<(i64, StoredContexts)>> {
        let version: i64 = self
            .conn()
            .await?
            .query_one_prepared("SELECT version FROM contexts_version WHERE id = 1", &[])
            .await
            .map_err(db)?
            .get(0);
        if seen == Some(version) {
            return Ok(None);
        }
        let contexts = StoredContexts {
            live: self.context_list(Shelf::Live).await?,
            shadows: self.context_list(Shelf::Shadow).await?,
        };
        Ok(Some((version, contexts)))
    }

    async fn conn(&self) -> StoreResult<Object> {
        self.pool.get().await.map_err(db)
    }

    /// Removes the rows that `purge` finds before `cutoff`, then inserts one row: the sign-in tables
    /// hold no more than their records' lifetimes.
    async fn purge_then_insert(
        &self,
        purge: &str,
        cutoff: i64,
        insert: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<()> {
        let conn = self.conn().await?;
        conn.execute_prepared(purge, &[&cutoff]).await.map_err(db)?;
        conn.execute_prepared(insert, params).await.map_err(db)?;
        Ok(())
    }

    /// Applies the migrations this database lacks, each with its version row, in one transaction.
    async fn migrate(&self) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(db)?;
        tx.execute_prepared("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                version integer PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await
        .map_err(db)?;
        let row = tx
            .query_one_prepared("SELECT coalesce(max(version), 0) FROM schema_version", &[])
            .await
            .map_err(db)?;
        let current = known_schema(row.get(0))?;
        for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
            tx.batch_execute(migration).await.map_err(db)?;
            let version = i32::try_from(index + 1).unwrap_or(i32::MAX);
            tx.execute_prepared(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[&version],
            )
            .await
            .map_err(db)?;
            tracing::info!(version, "store schema migrated");
        }
        tx.commit().await.map_err(db)
    }

    /// What `serve --check` can learn without changing anything: that `url` connects (TLS as asked,
    /// the database exists, the user may log in) and that the schema is not newer than this build
    /// knows. Returns the schema version found (0 for an empty database, which start-up sets up).
    pub async fn check(url: &str) -> StoreResult<usize> {
        let PgTarget { mut config, tls } =
            tls::target(url).map_err(StoreError::unavailable)?;
        config.connect_timeout(WAIT);
        let (client, connection) = config.connect(tls).await.map_err(db)?;
        tokio::spawn(connection);
        let exists: bool = client
            .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
            .await
            .map_err(db)?
            .get(0);
        if !exists {
            return Ok(0);
        }
        let row = client
            .query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[])
            .await
            .map_err(db)?;
        known_schema(row.get(0))
    }

    /// Inserts unless the key exists; returns the existing record text otherwise. `insert` ends in
    /// `ON CONFLICT DO NOTHING`; `select` reads the record of the same key.
    async fn insert_or_get(
        &self,
        insert: &str,
        insert_params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        select: &str,
        select_params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<Option<String>> {
        let conn = self.conn().await?;
        loop {
            let inserted = conn
                .execute_prepared(insert, insert_params)
                .await
                .map_err(db)?;
            if inserted == 1 {
                return Ok(None);
            }
            // The row exists, unless it was deleted (a released claim) in between: then insert again.
            if let Some(row) = conn
                .query_opt_prepared(select, select_params)
                .await
                .map_err(db)?
            {
                return Ok(Some(row.get(0)));
            }
        }
    }

    /// [`Store::admit`] without a rate window, in the statement of a batch of concurrent calls (see
    /// [`admit`]): the replay record, the budget charge and the claim insert commit together, each only
    /// when the one before it happened. (A rate window is computed here, not in SQL, so a call with one
    /// takes the transaction of [`Store::admit`].)
    async fn admit_batched(
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
                record: encode(claim)?,
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

    /// Runs a compare-and-set write (an UPDATE or DELETE conditioned on the record read before); true
    /// when it changed the one row, false when another writer got there first.
    async fn changes_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<bool> {
        let changed = self
            .conn()
            .await?
            .execute_prepared(sql, params)
            .await
            .map_err(db)?;
        Ok(changed == 1)
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

const REMEMBER_SIGNATURE: &str =
    "INSERT INTO seen_signatures (signature, expires_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// How soon a replica's session cache learns of a change made elsewhere (SPEC 12: revocation within 1 s).
pub const SESSION_NOTICE: Duration = Duration::from_millis(800);

/// How often a replica polls for context changes made elsewhere (SPEC 12: applied within 2 s).
pub const CONTEXT_POLL: Duration = Duration::from_secs(1);

enum Listening {
    /// The callback asked to stop (its gateway is gone).
    Stopped,
    /// The connection ended; listen again.
    Lost,
}

/// The schema version a database is at, refused when it is newer than this build's migrations.
fn known_schema(current: i32) -> StoreResult<usize> {
    let known = MIGRATIONS.len();
    let current = usize::try_from(current).unwrap_or(usize::MAX);
    if current > known {
        return Err(StoreError::Unavailable(format!(
            "the database schema is at version {current}, newer than the {known} this build knows: \
             refusing to start (upgrade this replica)"
        )));
    }
    Ok(current)
}

/// One connection's worth of listening for session changes; see [`PgStore::watch_sessions`].
/// The database server's clock, in ms since the epoch: the one clock that every replica's writes share.
const SERVER_NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

async fn listen(
    config: &tokio_postgres::Config,
    tls: &MakeRustls,
    seen_until: &mut i64,
    changed: &(impl Fn(&str) -> bool + Send + Sync),
) -> Result<Listening, tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    // The connection is driven by a task of its own, which hands over notifications; when it ends,
    // the channel closes and this listener reconnects.
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(notice) = message {
                if tx.send(notice.payload().to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    client.batch_execute("LISTEN sealgate_sessions").await?;
    let mut checkpoint: i64 = client.query_one(SERVER_NOW_MS, &[]).await?.get(0);
    // Changes committed while no listener was connected; a second of slack covers commits whose
    // timestamp was taken just before the connection was lost.
    let rows = client
        .query(
            "SELECT session_id FROM sessions WHERE changed_at_ms >= $1",
            &[&(*seen_until - 1_000)],
        )
        .await?;
    for row in rows {
        if !changed(row.get(0)) {
            return Ok(Listening::Stopped);
        }
    }
    *seen_until = checkpoint;
    let mut heartbeat = tokio::time::interval(SESSION_NOTICE / 2);
    loop {
        tokio::select! {
            notice = notices.recv() => match notice {
                Some(session_id) => {
                    if !changed(&session_id) {
                        return Ok(Listening::Stopped);
                    }
                }
                None => return Ok(Listening::Lost),
            },
            _ = heartbeat.tick() => {
                // A dead connection shows here within half the notice bound; the time read is the new
                // point up to which every change has been delivered.
                let reached: i64 = client.query_one(SERVER_NOW_MS, &[]).await?.get(0);
                *seen_until = checkpoint;
                checkpoint = reached;
            }
        }
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
        let text = encode(record)?;
        self.insert_or_get(
            "INSERT INTO sessions (session_id, record) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&record.session_id, &text],
            "SELECT record FROM sessions WHERE session_id = $1",
            &[&record.session_id],
        )
        .await?
        .map(|existing| decode(&existing))
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
        row.map(|row| decode(row.get(0))).transpose()
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

    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        self.changes_one(
            "UPDATE sessions SET record = $3 WHERE session_id = $1 AND record = $2",
            &[&old.session_id, &encode(old)?, &encode(new)?],
        )
        .await
    }

    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)> {
        let conn = self.conn().await?;
        // Session ids are COLLATE "C": the same byte order as the embedded store's keys.
        let mut cursor = after.map(str::to_string);
        let batch = i64::try_from(limit.saturating_add(1).max(64)).unwrap_or(i64::MAX);
        let mut page = Page::new(limit, keep);
        loop {
            let rows = match &cursor {
                None => conn
                    .query_prepared(
                        "SELECT session_id, record FROM sessions ORDER BY session_id LIMIT $1",
                        &[&batch],
                    )
                    .await
                    .map_err(db)?,
                Some(id) => conn
                    .query_prepared(
                        "SELECT session_id, record FROM sessions WHERE session_id > $1 \
                         ORDER BY session_id LIMIT $2",
                        &[id, &batch],
                    )
                    .await
                    .map_err(db)?,
            };
            let exhausted = (rows.len() as i64) < batch;
            for row in &rows {
                let record: SessionRecord = decode(row.get(1))?;
                cursor = Some(row.get(0));
                if page.offer(record) {
                    return Ok(page.done(true));
                }
            }
            if exhausted {
                return Ok(page.done(false));
            }
        }
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
        if let (None, Some((key, max))) = (&admission.rate, &admission.budget) {
            return self.admit_batched(admission, (key, *max)).await;
        }
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
                        &encode(claim)?,
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
                existing_claim = Some(decode(row.get(0))?);
            }
        }
        tx.commit().await.map_err(db)?;
        Ok(Admitted::Charged { existing_claim })
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
                &encode(record)?,
            ],
            "SELECT record FROM claims WHERE kind = $1 AND request_id = $2",
            &[&kind, &record.request_id],
        )
        .await?
        .map(|existing| decode(&existing))
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
        row.map(|row| decode(row.get(0))).transpose()
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
                    &[&kind, &old.request_id, &encode(old)?, &encode(new)?],
                )
                .await
            }
            None => {
                self.changes_one(
                    "DELETE FROM claims WHERE kind = $1 AND request_id = $2 AND record = $3",
                    &[&kind, &old.request_id, &encode(old)?],
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
        let conn = self.conn().await?;
        let mut cursor = before.map(|c| (c.claimed_at_ms, c.kind.as_str(), c.request_id.clone()));
        let batch = i64::try_from(limit.saturating_add(1).max(64)).unwrap_or(i64::MAX);
        let mut page = Page::new(limit, keep);
        loop {
            let rows = match &cursor {
                None => conn
                    .query_prepared(
                        "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                         ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT $1",
                        &[&batch],
                    )
                    .await
                    .map_err(db)?,
                Some((ms, kind, id)) => conn
                    .query_prepared(
                        "SELECT claimed_at_ms, kind, request_id, record FROM claims \
                         WHERE (claimed_at_ms, kind, request_id) < ($1, $2, $3) \
                         ORDER BY claimed_at_ms DESC, kind DESC, request_id DESC LIMIT $4",
                        &[ms, kind, id, &batch],
                    )
                    .await
                    .map_err(db)?,
            };
            let exhausted = (rows.len() as i64) < batch;
            for row in &rows {
                let record: ClaimRecord = decode(row.get(3))?;
                cursor = Some((row.get(0), record.kind.as_str(), row.get(2)));
                if page.offer(record) {
                    return Ok(page.done(true));
                }
            }
            if exhausted {
                return Ok(page.done(false));
            }
        }
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
                &encode(record)?,
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
        row.map(|row| decode(row.get(0))).transpose()
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
        row.map(|row| decode(row.get(0))).transpose()
    }

    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool> {
        self.changes_one(
            "UPDATE approvals SET record = $3 WHERE approval_id = $1 AND record = $2",
            &[&old.approval_id, &encode(old)?, &encode(new)?],
        )
        .await
    }

    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)> {
        let conn = self.conn().await?;
        let mut cursor = before.map(|c| (c.requested_at_ms, c.approval_id.clone()));
        let batch = i64::try_from(limit.saturating_add(1).max(64)).unwrap_or(i64::MAX);
        let mut page = Page::new(limit, keep);
        loop {
            let rows = match &cursor {
                None => conn
                    .query_prepared(
                        "SELECT requested_at_ms, approval_id, record FROM approvals \
                         ORDER BY requested_at_ms DESC, approval_id DESC LIMIT $1",
                        &[&batch],
                    )
                    .await
                    .map_err(db)?,
                Some((ms, id)) => conn
                    .query_prepared(
                        "SELECT requested_at_ms, approval_id, record FROM approvals \
                         WHERE (requested_at_ms, approval_id) < ($1, $2) \
                         ORDER BY requested_at_ms DESC, approval_id DESC LIMIT $3",
                        &[ms, id, &batch],
                    )
                    .await
                    .map_err(db)?,
            };
            let exhausted = (rows.len() as i64) < batch;
            for row in &rows {
                let record: ApprovalRecord = decode(row.get(2))?;
                cursor = Some((row.get(0), row.get(1)));
                if page.offer(record) {
                    return Ok(page.done(true));
                }
            }
            if exhausted {
                return Ok(page.done(false));
            }
        }
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
        tx.execute_prepared(put, &[&context.name, &encode(context)?])
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
                    &bigint(count.calls),
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
                &[&pin.upstream, &pin.tool, &encode(pin)?],
            )
            .await
            .map_err(db)?;
        match row {
            Some(row) => decode(&row.get::<_, String>(0)),
            None => Err(StoreError::unavailable("the tool's pin vanished")),
        }
    }

    async fn tool_pin_put(&self, pin: &ToolPin) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "INSERT INTO tool_pins (upstream, tool, record) VALUES ($1, $2, $3) \
                 ON CONFLICT (upstream, tool) DO UPDATE SET record = EXCLUDED.record",
                &[&pin.upstream, &pin.tool, &encode(pin)?],
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
        rows.iter().map(|row| decode(row.get(0))).collect()
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
            &[&attempt.state, &attempt.created_at_ms, &encode(attempt)?],
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
        row.map(|row| decode(&row.get::<_, String>(0))).transpose()
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
            &[&record.id_hash, &record.ends_at_ms(), &encode(record)?],
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
        row.map(|row| decode(&row.get::<_, String>(0))).transpose()
    }

    async fn console_session_touch(&self, record: &ConsoleSessionRecord) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "UPDATE console_sessions SET ends_at_ms = $2, record = $3 WHERE id_hash = $1",
                &[&record.id_hash, &record.ends_at_ms(), &encode(record)?],
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
                &[&bigint(through)],
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
        row.map(|row| decode(&row.get::<_, String>(0))).transpose()
    }

    async fn set_replay_cover(&self, cover: &ReplayCover) -> StoreResult<()> {
        self.conn()
            .await?
            .execute_prepared(
                "INSERT INTO replay_cover (id, record) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                &[&encode(cover)?],
            )
            .await
            .map_err(db)?;
        Ok(())
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
        rows.iter().map(|row| decode(row.get(0))).collect()
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
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::window::SlidingWindow;
    use crate::store::conformance::{self, claim};
    use crate::store::testing::TestDatabase;
    use crate::store::{AuditBackend, ChainHead, SeenSignature};

    #[tokio::test]
    async fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set() {
        let db = TestDatabase::create().await;
        conformance::claim_insert_is_insert_if_absent_and_replace_is_compare_and_set(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn a_sign_in_is_taken_once_and_old_ones_are_forgotten() {
        let db = TestDatabase::create().await;
        conformance::a_sign_in_is_taken_once_and_old_ones_are_forgotten(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn shadows_are_kept_apart_and_their_tallies_add_up() {
        let db = TestDatabase::create().await;
        conformance::shadows_are_kept_apart_and_their_tallies_add_up(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn tool_pins_are_first_wins_then_replaced_and_sightings_count_once() {
        let db = TestDatabase::create().await;
        conformance::tool_pins_are_first_wins_then_replaced_and_sightings_count_once(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn console_sessions_are_kept_touched_and_ended() {
        let db = TestDatabase::create().await;
        conformance::console_sessions_are_kept_touched_and_ended(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn the_two_claim_namespaces_never_meet_and_pages_run_newest_first() {
        let db = TestDatabase::create().await;
        conformance::the_two_claim_namespaces_never_meet_and_pages_run_newest_first(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn approvals_change_by_compare_and_set_and_one_request_is_current_per_call() {
        let db = TestDatabase::create().await;
        conformance::approvals_change_by_compare_and_set_and_one_request_is_current_per_call(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn retention_removes_only_what_is_finished() {
        let db = TestDatabase::create().await;
        conformance::retention_removes_only_what_is_finished(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn sessions_insert_once_and_replace_by_compare_and_set() {
        let db = TestDatabase::create().await;
        conformance::sessions_insert_once_and_replace_by_compare_and_set(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn a_revocation_made_while_the_listener_connects_is_caught_up() {
        let db = TestDatabase::create().await;
        let store = PgStore::connect(&db.url).await.unwrap();
        let live = conformance::session("s-1", "ctx", None);
        assert!(store.session_insert(&live).await.unwrap().is_none());
        let (heard, mut notices) = tokio::sync::mpsc::unbounded_channel();
        store
            .watch_sessions(move |id| heard.send(id.to_owned()).is_ok())
            .await
            .unwrap();
        // At once: almost always before the listener's own connection is up, so no NOTIFY reaches it;
        // its first connection must read the change from the table.
        let revoked = SessionRecord {
            revoked_at_ms: Some(2),
            ..live.clone()
        };
        assert!(store.session_replace(&live, &revoked).await.unwrap());
        let heard = tokio::time::timeout(std::time::Duration::from_secs(5), notices.recv()).await;
        assert_eq!(heard.unwrap().as_deref(), Some("s-1"));
    }

    #[tokio::test]
    async fn session_pages_run_in_id_order_and_live_counts_count() {
        let db = TestDatabase::create().await;
        conformance::session_pages_run_in_id_order_and_live_counts_count(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn signatures_are_remembered_once_and_purged_after_their_window() {
        let db = TestDatabase::create().await;
        conformance::signatures_are_remembered_once_and_purged_after_their_window(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing() {
        let db = TestDatabase::create().await;
        conformance::admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn a_settlement_is_written_with_its_batch_and_only_then() {
        let db = TestDatabase::create().await;
        conformance::a_settlement_is_written_with_its_batch_and_only_then(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn labels_are_written_with_their_batch_and_only_then() {
        let db = TestDatabase::create().await;
        conformance::labels_are_written_with_their_batch_and_only_then(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn admit_writes_the_replay_record_first_and_keeps_it_on_refusal() {
        let db = TestDatabase::create().await;
        conformance::admit_writes_the_replay_record_first_and_keeps_it_on_refusal(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    #[tokio::test]
    async fn admit_without_a_rate_window_charges_the_budget_and_the_claim_together() {
        let db = TestDatabase::create().await;
        conformance::admit_without_a_rate_window_charges_the_budget_and_the_claim_together(
            &PgStore::connect(&db.url).await.unwrap(),
        )
        .await;
    }

    /// One event chained after `head`, named by its seq (`h1`, `h2`, …).
    fn next_event(head: &ChainHead) -> Vec<Value> {
        let seq = head.seq + 1;
        vec![serde_json::json!({"seq": seq, "hash": format!("h{seq}"), "prev": head.hash})]
    }

    /// Two pools on one database stand for two replicas.
    async fn two_replicas(db: &TestDatabase) -> [Arc<PgStore>; 2] {
        [
            Arc::new(PgStore::connect(&db.url).await.unwrap()),
            Arc::new(PgStore::connect(&db.url).await.unwrap()),
        ]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_stores_on_one_database_admit_as_one() {
        // The counters and claims of two replicas are one.
        let db = TestDatabase::create().await;
        let stores = two_replicas(&db).await;
        let mut tasks = Vec::new();
        for n in 0..40 {
            let store = Arc::clone(&stores[n % 2]);
            tasks.push(tokio::spawn(async move {
                let admission = Admission {
                    rate: Some(("rate".into(), SlidingWindow::new(30, 60_000))),
                    budget: Some(("budget".into(), 20)),
                    claim: Some(claim(ClaimKind::Invoke, "one", n as i64)),
                    now_ms: 5_000,
                    ..Admission::default()
                };
                store.admit(&admission).await.unwrap()
            }));
        }
        let mut charged_new = 0;
        let mut charged_existing = 0;
        let mut exhausted = 0;
        for task in tasks {
            match task.await.unwrap() {
                Admitted::Charged {
                    existing_claim: None,
                } => charged_new += 1,
                Admitted::Charged {
                    existing_claim: Some(_),
                } => charged_existing += 1,
                Admitted::BudgetExhausted => exhausted += 1,
                other => panic!("no signature and a rate above the budget: {other:?}"),
            }
        }
        assert_eq!((charged_new, charged_existing, exhausted), (1, 19, 20));
        assert_eq!(stores[1].counter_get("budget").await.unwrap(), Some(20));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admissions_batched_across_calls_and_replicas_admit_as_one_at_a_time_would() {
        // No rate window: every admission goes through the batches of `sealgate_admit`. Each envelope is
        // sent to both replicas; pairs of envelopes share a request id; one budget of 40 over 60 envelopes.
        let db = TestDatabase::create().await;
        let stores = two_replicas(&db).await;
        let mut tasks = Vec::new();
        for n in 0..120usize {
            let store = Arc::clone(&stores[n % 2]);
            let request_id = format!("call-{}", n / 4);
            tasks.push(tokio::spawn(async move {
                let admission = Admission {
                    signature: Some(SeenSignature {
                        signature: [u8::try_from(n / 2).unwrap(); 64],
                        expires_at_ms: 60_000,
                    }),
                    budget: Some(("budget".into(), 40)),
                    claim: Some(claim(ClaimKind::Invoke, &request_id, 5_000)),
                    now_ms: 5_000,
                    ..Admission::default()
                };
                (request_id, store.admit(&admission).await.unwrap())
            }));
        }
        let (mut replayed, mut exhausted, mut new_claims) = (0, 0, 0);
        let mut charged_ids = std::collections::BTreeSet::new();
        for task in tasks {
            match task.await.unwrap() {
                (_, Admitted::Replayed) => replayed += 1,
                (_, Admitted::BudgetExhausted) => exhausted += 1,
                (id, Admitted::Charged { existing_claim }) => {
                    new_claims += usize::from(existing_claim.is_none());
                    if let Some(existing) = existing_claim {
                        assert_eq!(existing.request_id, id);
                    }
                    charged_ids.insert(id);
                }
                (_, other) => panic!("no rate window: {other:?}"),
            }
        }
        assert_eq!((replayed, exhausted), (60, 20));
        assert_eq!(stores[0].counter_get("budget").await.unwrap(), Some(40));
        // Each request id that was charged is claimed exactly once; the other charged calls found it.
        assert_eq!(new_claims, charged_ids.len());
        for id in &charged_ids {
            assert!(stores[1]
                .claim_get(ClaimKind::Invoke, id)
                .await
                .unwrap()
                .is_some());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_are_compare_and_set_on_the_head_across_pools() {
        let db = TestDatabase::create().await;
        let a = PgStore::connect(&db.url).await.unwrap();
        let b = PgStore::connect(&db.url).await.unwrap();
        assert_eq!(a.head().await.unwrap(), None);
        let genesis = ChainHead::genesis();
        let event = |seq: u64, hash: &str| serde_json::json!({"seq": seq, "hash": hash});
        a.append(&genesis, &[event(1, "h1"), event(2, "h2")], &[])
            .await
            .unwrap();
        // The other replica still believes the store is empty: refused, nothing stored.
        assert_eq!(
            b.append(&genesis, &[event(1, "other")], &[]).await,
            Err(StoreError::HeadMoved)
        );
        let head = b.head().await.unwrap().unwrap();
        assert_eq!((head.seq, head.hash.as_str()), (2, "h2"));
        b.append(&head, &[event(3, "h3")], &[]).await.unwrap();
        let newest = a.events_newest_first(None, 2).await.unwrap();
        assert_eq!(newest, [event(3, "h3"), event(2, "h2")]);
        let oldest = a.events_oldest_first(2, 10).await.unwrap();
        assert_eq!(oldest, [event(2, "h2"), event(3, "h3")]);
        assert_eq!(
            a.events_newest_first(Some(2), 10).await.unwrap(),
            [event(1, "h1")]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_taking_turns_chain_after_each_other() {
        let db = TestDatabase::create().await;
        let stores = two_replicas(&db).await;
        // 40 turns from two pools at once: each is chained after the head it finds under the lock, so
        // none is refused and the chain has no gap and no fork.
        let mut tasks = Vec::new();
        for n in 0..40 {
            let store = Arc::clone(&stores[n % 2]);
            tasks.push(tokio::spawn(async move {
                store.append_in_turn(&mut next_event, &[]).await.unwrap()
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap().len(), 1);
        }
        let events = stores[0].events_oldest_first(1, 100).await.unwrap();
        assert_eq!(events.len(), 40);
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event["seq"], i + 1);
            let prev = if i == 0 {
                crate::store::GENESIS_HASH.to_owned()
            } else {
                format!("h{i}")
            };
            assert_eq!(event["prev"], prev, "event {}", i + 1);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turn_that_fails_holding_the_head_leaves_it_to_the_next_writer() {
        let db = TestDatabase::create().await;
        let stores = two_replicas(&db).await;
        // Chained after the lock was taken, then refused before the write: the transaction must not go
        // back to the pool still open and holding the head, or the other replica would wait for it.
        let mut unhashed = |head: &ChainHead| vec![serde_json::json!({"seq": head.seq + 1})];
        assert!(matches!(
            stores[0].append_in_turn(&mut unhashed, &[]).await,
            Err(StoreError::Corrupt(_))
        ));
        for store in [&stores[1], &stores[0]] {
            let appended = store.append_in_turn(&mut next_event, &[]).await.unwrap();
            assert_eq!(appended.len(), 1);
        }
        let events = stores[0].events_oldest_first(1, 10).await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1]["prev"], "h1");
    }

    #[tokio::test]
    async fn signing_keys_are_kept_once_per_kid_for_every_replica() {
        let db = TestDatabase::create().await;
        let (a, b) = (
            PgStore::connect(&db.url).await.unwrap(),
            PgStore::connect(&db.url).await.unwrap(),
        );
        let key = |kid: &str, byte: u8, replica: &str| SigningKeyRecord {
            kid: kid.into(),
            public_key: [byte; 32],
            replica_id: replica.into(),
        };
        a.signing_key_publish(&key("aaaa", 1, "r0")).await.unwrap();
        b.signing_key_publish(&key("bbbb", 2, "r1")).await.unwrap();
        // A restart publishes again; the first record stays.
        b.signing_key_publish(&key("aaaa", 1, "r1")).await.unwrap();
        let kept = a.signing_keys().await.unwrap();
        assert_eq!(kept, [key("aaaa", 1, "r0"), key("bbbb", 2, "r1")]);
    }

    #[tokio::test]
    async fn migrations_run_once_and_a_newer_schema_is_refused() {
        let db = TestDatabase::create().await;
        let store = PgStore::connect(&db.url).await.unwrap();
        store
            .context_put(
                Shelf::Live,
                &StoredContext {
                    name: "kept".into(),
                    spec: serde_json::json!({"name": "kept"}),
                },
            )
            .await
            .unwrap();
        drop(store);
        // A restart finds the schema current and keeps the data.
        let store = PgStore::connect(&db.url).await.unwrap();
        assert_eq!(store.context_list(Shelf::Live).await.unwrap().len(), 1);
        store
            .conn()
            .await
            .unwrap()
            .execute_prepared("INSERT INTO schema_version (version) VALUES (99)", &[])
            .await
            .unwrap();
        let refused = PgStore::connect(&db.url).await.err();
        assert!(
            matches!(&refused, Some(StoreError::Unavailable(m)) if m.contains("version 99")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_database_is_an_error_not_a_hang() {
        // Port 1 refuses at once; the pool reports it as Unavailable (5005 at the edge).
        let refused = PgStore::connect("postgres://postgres@127.0.0.1:1/none")
            .await
            .err();
        assert!(
            matches!(refused, Some(StoreError::Unavailable(_))),
            "{refused:?}"
        );
    }
}

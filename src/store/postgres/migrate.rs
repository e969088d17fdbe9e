//! The shared store's schema: the migrations of `src/store/migrations/postgres`, applied in order by
//! whichever replica starts first, each with its row in `schema_version`.

use super::sql::{db, Prepared};
use super::tls::{self, PgTarget};
use super::{PgStore, WAIT};
use crate::store::{StoreError, StoreResult};

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

impl PgStore {
    /// Applies the migrations this database lacks, each with its version row, in one transaction.
    pub(super) async fn migrate(&self) -> StoreResult<()> {
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
        let PgTarget { mut config, tls } = tls::target(url).map_err(StoreError::unavailable)?;
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

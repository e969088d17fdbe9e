//! What the shared store's statements share: the error of a failed statement, statements prepared once
//! per connection, insert-if-absent, compare-and-set, and the one loop that fills a page of a listing.

use serde::de::DeserializeOwned;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::PgStore;
use crate::store::{decode_record, Page, StoreError, StoreResult};

/// The error with its causes: tokio-postgres's own text is only "db error", the server's message is its
/// source.
pub(super) fn db(err: impl std::error::Error) -> StoreError {
    let mut text = format!("postgres: {err}");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    StoreError::unavailable(text)
}

/// Statements prepared once per connection and cached by the pool: tokio-postgres prepares a `&str` query
/// before every execution, so each statement would cost two round trips instead of one.
#[async_trait::async_trait]
pub(super) trait Prepared: deadpool_postgres::GenericClient {
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
pub(super) async fn forget_tallies(tx: &impl Prepared, context: &str) -> StoreResult<()> {
    tx.execute_prepared("DELETE FROM shadow_tallies WHERE context = $1", &[&context])
        .await
        .map_err(db)?;
    Ok(())
}

impl PgStore {
    /// Removes the rows that `purge` finds before `cutoff`, then inserts one row: the sign-in tables
    /// hold no more than their records' lifetimes.
    pub(super) async fn purge_then_insert(
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

    /// Inserts unless the key exists; returns the existing record text otherwise. `insert` ends in
    /// `ON CONFLICT DO NOTHING`; `select` reads the record of the same key.
    pub(super) async fn insert_or_get(
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

    /// Runs a compare-and-set write (an UPDATE or DELETE conditioned on the record read before); true
    /// when it changed the one row, false when another writer got there first.
    pub(super) async fn changes_one(
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
}

/// A listing's two statements: the first batch (`$1` the batch size), and the batch after a cursor (its
/// columns, then the batch size). Each row holds the cursor's columns, then the record text.
pub(super) struct Listing {
    pub first: &'static str,
    pub after: &'static str,
}

/// Where a listing stopped: the leading columns of the last row read.
pub(super) trait Cursor: Send + Sync + Sized {
    fn of_row(row: &Row) -> Self;
    /// The parameters of [`Listing::after`] that read on from here.
    fn params(&self) -> Vec<&(dyn ToSql + Sync)>;
}

impl Cursor for String {
    fn of_row(row: &Row) -> Self {
        row.get(0)
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![self]
    }
}

impl Cursor for (i64, String) {
    fn of_row(row: &Row) -> Self {
        (row.get(0), row.get(1))
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![&self.0, &self.1]
    }
}

impl Cursor for (i64, String, String) {
    fn of_row(row: &Row) -> Self {
        (row.get(0), row.get(1), row.get(2))
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![&self.0, &self.1, &self.2]
    }
}

impl PgStore {
    /// Fills one page of `listing`, starting after `cursor`, from batches of at least 64 rows; `keep` runs
    /// here, on the records as they come.
    pub(super) async fn page<C: Cursor, T: DeserializeOwned + Send>(
        &self,
        listing: &Listing,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r T) -> bool + Sync),
        mut cursor: Option<C>,
    ) -> StoreResult<(Vec<T>, bool)> {
        let conn = self.conn().await?;
        let batch = i64::try_from(limit.saturating_add(1).max(64)).unwrap_or(i64::MAX);
        let mut page = Page::new(limit, keep);
        loop {
            let rows = match &cursor {
                None => conn.query_prepared(listing.first, &[&batch]).await,
                Some(at) => {
                    let mut params = at.params();
                    params.push(&batch);
                    conn.query_prepared(listing.after, &params).await
                }
            }
            .map_err(db)?;
            let exhausted = (rows.len() as i64) < batch;
            for row in &rows {
                let record: T = decode_record(row.get(row.len() - 1))?;
                cursor = Some(C::of_row(row));
                if page.offer(record) {
                    return Ok(page.done(true));
                }
            }
            if exhausted {
                return Ok(page.done(false));
            }
        }
    }
}

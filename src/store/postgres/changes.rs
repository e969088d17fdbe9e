//! How a replica hears of what the others changed: sessions (revocations) by LISTEN/NOTIFY with a catch-up
//! read after a lost connection, and contexts by polling their change counter.

use std::time::Duration;

use super::sql::{db, Prepared};
use super::tls::MakeRustls;
use super::PgStore;
use crate::store::{Shelf, Store, StoreResult, StoredContexts};

/// How soon a replica's session cache learns of a change made elsewhere (SPEC 12: revocation within 1 s).
pub const SESSION_NOTICE: Duration = Duration::from_millis(800);

/// How often a replica polls for context changes made elsewhere (SPEC 12: applied within 2 s).
pub const CONTEXT_POLL: Duration = Duration::from_secs(1);

impl PgStore {
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
}

enum Listening {
    /// The callback asked to stop (its gateway is gone).
    Stopped,
    /// The connection ended; listen again.
    Lost,
}

/// The database server's clock, in ms since the epoch: the one clock that every replica's writes share.
const SERVER_NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// One connection's worth of listening for session changes; see [`PgStore::watch_sessions`].
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

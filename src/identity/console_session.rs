//! Console sessions (SPEC 16): what a sign-in starts. The identifier (256 random bits) goes to the person
//! once, in the `__Host-sealgate` cookie or as the bearer credential of `sealgate login`; the store keeps
//! only its SHA-256, so that every replica honours the session and a copy of the store signs nobody in.

use crate::envelope::{random_secret, sha256_hex};
use crate::store::{ConsoleSessionRecord, Store, StoreError};

/// The console session cookie. `__Host-` makes a browser refuse it unless it is `Secure`, has `Path=/`
/// and no `Domain`: no other host, nor a page over plain http elsewhere, can set or overwrite it.
pub const COOKIE_NAME: &str = "__Host-sealgate";

/// A session's last use is written at most this often, so that a console's many reads stay reads.
const TOUCH_EVERY_MS: i64 = 60_000;

/// Who signed in, as the provider vouched for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub iss: String,
    pub sub: String,
    /// `name`, else `email`, else `preferred_username`: shown beside the identity.
    pub name: Option<String>,
    pub groups: Vec<String>,
}

/// A session just started: the identifier to hand out (never stored) and its record.
pub struct Started {
    pub id: String,
    pub record: ConsoleSessionRecord,
}

/// The expiry rules of `operator_auth.oidc`.
#[derive(Debug, Clone, Copy)]
pub struct ConsoleSessions {
    idle_ms: i64,
    max_ms: i64,
}

impl ConsoleSessions {
    pub fn new(idle_secs: u64, max_secs: u64) -> ConsoleSessions {
        let ms = |secs: u64| i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        ConsoleSessions {
            idle_ms: ms(idle_secs),
            max_ms: ms(max_secs),
        }
    }

    pub async fn start(
        &self,
        store: &dyn Store,
        person: &Person,
        now_ms: i64,
    ) -> Result<Started, StoreError> {
        let id = random_secret().map_err(StoreError::Unavailable)?;
        let record = ConsoleSessionRecord {
            id_hash: sha256_hex(id.as_bytes()),
            iss: person.iss.clone(),
            sub: person.sub.clone(),
            name: person.name.clone(),
            groups: person.groups.clone(),
            csrf_token: random_secret().map_err(StoreError::Unavailable)?,
            created_at_ms: now_ms,
            last_used_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(self.max_ms),
            idle_ms: self.idle_ms,
        };
        store.console_session_insert(&record, now_ms).await?;
        Ok(Started { id, record })
    }

    /// The live session of identifier `id`, its last use noted (at most once a minute); None when
    /// there is none, or it has ended (idle too long, or past its absolute end).
    pub async fn find(
        &self,
        store: &dyn Store,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<ConsoleSessionRecord>, StoreError> {
        let Some(mut record) = store
            .console_session_get(&sha256_hex(id.as_bytes()))
            .await?
        else {
            return Ok(None);
        };
        if now_ms >= record.ends_at_ms() {
            return Ok(None);
        }
        if now_ms - record.last_used_ms >= TOUCH_EVERY_MS {
            record.last_used_ms = now_ms;
            store.console_session_touch(&record).await?;
        }
        Ok(Some(record))
    }

    /// Ends the session of identifier `id`; false when there was none.
    pub async fn end(&self, store: &dyn Store, id: &str) -> Result<bool, StoreError> {
        store
            .console_session_delete(&sha256_hex(id.as_bytes()))
            .await
    }

    /// How long a new session may live at most, for the cookie's `Max-Age`.
    pub fn max_secs(&self) -> i64 {
        self.max_ms / 1000
    }
}

/// Whether a credential has the shape of a console session identifier (43 base64url characters), as
/// opposed to a JWT (which holds dots): how a bearer credential of `sealgate login` is told apart.
pub fn looks_like_session_id(credential: &str) -> bool {
    credential.len() == 43
        && credential
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann() -> Person {
        Person {
            iss: "https://idp".into(),
            sub: "ann".into(),
            name: Some("Ann".into()),
            groups: vec!["security".into()],
        }
    }

    #[tokio::test]
    async fn a_session_ends_when_idle_or_at_its_absolute_end_and_is_touched_once_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).unwrap();
        let sessions = ConsoleSessions::new(300, 600);
        let started = sessions.start(&store, &ann(), 0).await.unwrap();
        assert!(looks_like_session_id(&started.id));
        assert_ne!(started.record.id_hash, started.id);
        assert_ne!(started.record.csrf_token, started.id);
        // Read within the minute: no write.
        let seen = sessions
            .find(&store, &started.id, 30_000)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.last_used_ms, 0);
        // Each use after a minute moves the idle end; the absolute end stays.
        for at in [240_000, 480_000] {
            let seen = sessions
                .find(&store, &started.id, at)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(seen.last_used_ms, at);
        }
        assert!(sessions
            .find(&store, &started.id, 600_000)
            .await
            .unwrap()
            .is_none());
        // Idle: 300 s without use.
        let idle = sessions.start(&store, &ann(), 0).await.unwrap();
        assert!(sessions
            .find(&store, &idle.id, 299_999)
            .await
            .unwrap()
            .is_some());
        assert!(sessions
            .find(&store, &idle.id, 600_000)
            .await
            .unwrap()
            .is_none());
        // Ended by hand, and never found by a guess.
        assert!(sessions.end(&store, &idle.id).await.unwrap());
        assert!(sessions.find(&store, &idle.id, 1).await.unwrap().is_none());
        assert!(sessions.find(&store, "x", 1).await.unwrap().is_none());
    }

    #[test]
    fn a_jwt_is_not_taken_for_a_session_id() {
        assert!(!looks_like_session_id(
            "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln"
        ));
        assert!(!looks_like_session_id(""));
    }
}

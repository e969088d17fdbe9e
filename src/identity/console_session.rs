//! Console sessions (SPEC 16): what a sign-in starts. The identifier (256 random bits) goes to the person
//! once, in the `__Host-sealgate` cookie or as the bearer credential of `sealgate login`; the store keeps
//! only its SHA-256, so that every replica honours the session and a copy of the store signs nobody in.

use serde::{Deserialize, Serialize};

use crate::envelope::{random_secret, sha256_hex};

/// The console session cookie. `__Host-` makes a browser refuse it unless it is `Secure`, has `Path=/`
/// and no `Domain`: no other host, nor a page over plain http elsewhere, can set or overwrite it.
pub const COOKIE_NAME: &str = "__Host-sealgate";

/// A session's last use is written at most this often (or every half of a shorter idle allowance, so
/// that a session in use never ends as idle), so that a console's many reads stay reads.
const TOUCH_EVERY_MS: i64 = 60_000;

/// A console session (SPEC 16), found by the SHA-256 of its identifier: the store never holds the
/// identifier itself, so that whoever reads the store cannot sign in with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleSessionRecord {
    /// hex(SHA-256(identifier)).
    pub id_hash: String,
    pub iss: String,
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The person's groups at sign-in; their scopes follow from the roles in force at each request.
    pub groups: Vec<String>,
    /// What `X-CSRF-Token` must carry on a change made with this session's cookie.
    pub csrf_token: String,
    pub created_at_ms: i64,
    pub last_used_ms: i64,
    /// The absolute end (`session_max_secs` after sign-in).
    pub expires_at_ms: i64,
    /// The idle allowance (`session_idle_secs`) in force when it was made.
    pub idle_ms: i64,
}

impl ConsoleSessionRecord {
    /// When it ends unless it is used again: after its idle allowance, or at its absolute end.
    pub fn ends_at_ms(&self) -> i64 {
        self.last_used_ms
            .saturating_add(self.idle_ms)
            .min(self.expires_at_ms)
    }
}

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

    /// A new session for `person`: its identifier (for them) and its record (for the store).
    pub fn start(&self, person: &Person, now_ms: i64) -> Result<Started, String> {
        let id = random_secret()?;
        let record = ConsoleSessionRecord {
            id_hash: id_hash(&id),
            iss: person.iss.clone(),
            sub: person.sub.clone(),
            name: person.name.clone(),
            groups: person.groups.clone(),
            csrf_token: random_secret()?,
            created_at_ms: now_ms,
            last_used_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(self.max_ms),
            idle_ms: self.idle_ms,
        };
        Ok(Started { id, record })
    }

    /// How long a new session may live at most, for the cookie's `Max-Age`.
    pub fn max_secs(&self) -> i64 {
        self.max_ms / 1000
    }
}

/// What becomes of a stored session used at `now_ms`.
#[derive(Debug, PartialEq, Eq)]
pub enum Use {
    /// Idle too long, or past its absolute end: as if there were none.
    Ended,
    /// Live; its last use was noted less than a minute ago, so nothing is written.
    Live(ConsoleSessionRecord),
    /// Live; the record with this use noted, to be written back (at most once a minute, so that a
    /// console's many reads stay reads).
    Touched(ConsoleSessionRecord),
}

/// The rules of a session's end (SPEC 16: `session_idle_secs`, `session_max_secs`).
pub fn used(mut record: ConsoleSessionRecord, now_ms: i64) -> Use {
    if now_ms >= record.ends_at_ms() {
        return Use::Ended;
    }
    if now_ms - record.last_used_ms < TOUCH_EVERY_MS.min(record.idle_ms / 2) {
        return Use::Live(record);
    }
    record.last_used_ms = now_ms;
    Use::Touched(record)
}

/// What the store finds a session by: hex(SHA-256(identifier)).
pub fn id_hash(id: &str) -> String {
    sha256_hex(id.as_bytes())
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

    #[test]
    fn a_session_ends_when_idle_or_at_its_absolute_end_and_is_touched_once_a_minute() {
        let sessions = ConsoleSessions::new(300, 600);
        let started = sessions.start(&ann(), 0).unwrap();
        assert!(looks_like_session_id(&started.id));
        assert_eq!(started.record.id_hash, id_hash(&started.id));
        assert_ne!(started.record.id_hash, started.id);
        assert_ne!(started.record.csrf_token, started.id);
        let record = started.record;
        // Used within the minute: nothing to write.
        assert_eq!(used(record.clone(), 59_999), Use::Live(record.clone()));
        // Each use after a minute moves the idle end; the absolute end stays.
        let Use::Touched(touched) = used(record.clone(), 240_000) else {
            panic!("not touched")
        };
        assert_eq!(touched.last_used_ms, 240_000);
        assert!(matches!(used(touched.clone(), 480_000), Use::Touched(_)));
        assert_eq!(used(touched.clone(), 600_000), Use::Ended, "absolute end");
        // Idle: 300 s without use.
        assert!(matches!(used(record.clone(), 299_999), Use::Touched(_)));
        assert_eq!(used(record, 300_000), Use::Ended, "idle");
        // A short idle allowance is renewed within it, however often the session is read.
        let brief = ConsoleSessions::new(2, 600)
            .start(&ann(), 0)
            .unwrap()
            .record;
        assert_eq!(used(brief.clone(), 999), Use::Live(brief.clone()));
        assert!(matches!(used(brief, 1_000), Use::Touched(_)));
    }

    #[test]
    fn a_jwt_is_not_taken_for_a_session_id() {
        assert!(!looks_like_session_id(
            "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln"
        ));
        assert!(!looks_like_session_id(""));
    }
}

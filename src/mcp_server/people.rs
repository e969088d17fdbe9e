//! People's sessions (SPEC 17): the `people` rules that name a person's context, and the one session a
//! person has at a time. A person's sessions are numbered: the n-th has the id `mcp-<person>-<n>`, made
//! by whichever replica first needs it (the store's insert-once decides a race), never removed (sessions
//! are kept), so the current one is the last that exists and no table of its own is needed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};

use super::config::{McpServerConfig, PeopleRule, Surroundings};
use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::identity::{Identity, Via};
use crate::policy::ContextRegistry;
use crate::session::{self, LiveSession, PersonContext, SessionCache};
use crate::store::{Person, SessionRecord, Store, StoreResult};
use crate::token::{AccessClaims, KeySource};

/// Why a person gets no session.
#[derive(Debug)]
pub enum NoSession {
    /// Their session was revoked less than `session.expires_secs` ago.
    Revoked {
        until_ms: i64,
    },
    /// The rule names a context the gateway does not have.
    NoContext(String),
    Store(String),
}

/// Most people whose current session number is kept in memory; past it the map starts afresh (a miss
/// only costs a few reads).
const KNOWN_PEOPLE_CAPACITY: usize = 100_000;

/// What making and finding people's sessions reads and writes: the gateway's parts, not the gateway.
pub struct Parts<'a> {
    pub store: &'a dyn Store,
    pub sessions: &'a SessionCache,
    pub contexts: &'a ContextRegistry,
    pub audit: &'a AuditLog,
}

pub struct People {
    rules: Vec<PeopleRule>,
    groups_claim: String,
    expires_secs: i64,
    budget: Option<u64>,
    /// The number of each person's current session, as last seen.
    current: Mutex<HashMap<Person, u64>>,
}

impl People {
    pub fn new(config: &McpServerConfig, around: &Surroundings) -> Result<People, String> {
        for (index, rule) in config.people.iter().enumerate() {
            check_rule(rule).map_err(|why| format!("mcp_server.people[{index}]: {why}"))?;
        }
        let expires_secs = config.session.expires_secs;
        if expires_secs < 1 || expires_secs > around.max_lifetime_secs {
            return Err(format!(
                "mcp_server.session.expires_secs: {expires_secs} must be 1 to sessions.max_lifetime_secs ({})",
                around.max_lifetime_secs
            ));
        }
        Ok(People {
            rules: config.people.clone(),
            groups_claim: around.groups_claim.to_owned(),
            expires_secs,
            budget: config.session.budget,
            current: Mutex::new(HashMap::new()),
        })
    }

    /// The context the first matching rule names.
    pub fn context_for(&self, claims: &Map<String, Value>) -> Option<&str> {
        self.rules
            .iter()
            .find(|rule| self.matches(rule, claims))
            .map(|rule| rule.context.as_str())
    }

    fn matches(&self, rule: &PeopleRule, claims: &Map<String, Value>) -> bool {
        if let Some(group) = &rule.group {
            return match claims.get(&self.groups_claim) {
                Some(Value::Array(groups)) => groups.iter().any(|g| g.as_str() == Some(group)),
                Some(Value::String(one)) => one == group,
                _ => false,
            };
        }
        match (&rule.claim, &rule.pattern) {
            (Some(claim), Some(pattern)) => claims
                .get(claim)
                .and_then(Value::as_str)
                .is_some_and(|value| whole_match(pattern, value)),
            _ => false,
        }
    }

    /// The person's current session, made now when they have none; `context` is the one their first
    /// matching rule names.
    pub async fn session_of(
        &self,
        parts: &Parts<'_>,
        person: &AccessClaims,
        context: &str,
    ) -> Result<Arc<LiveSession>, NoSession> {
        let who = Person {
            iss: person.iss.clone(),
            sub: person.sub.clone(),
        };
        let key = person_key(&who);
        let known = self.known(&who);
        let mut number = match known {
            Some(number) => number,
            None => last_number(parts.store, &key).await.map_err(store)?,
        };
        let mut started = false;
        loop {
            let id = session_id(&key, number);
            let found = parts.sessions.get(parts.store, &id).await.map_err(store)?;
            let Some(live) = found else {
                if started {
                    return Err(NoSession::Store("the new session could not be read".into()));
                }
                // Made now, or by another replica a moment before: either way, read it next.
                self.start(parts, person, id, context).await?;
                started = true;
                continue;
            };
            match self.standing(&live.record, &who) {
                Standing::Current => {
                    self.remember(who, number);
                    return Ok(live);
                }
                Standing::Over => number += 1,
                Standing::Revoked { until_ms } => return Err(NoSession::Revoked { until_ms }),
            }
        }
    }

    fn standing(&self, record: &SessionRecord, who: &Person) -> Standing {
        let now_ms = crate::clock::now_millis();
        if record.person.as_ref() != Some(who) {
            // An id some registration took first: not this person's, so never theirs to use.
            return Standing::Over;
        }
        if let Some(revoked_ms) = record.revoked_at_ms {
            let until_ms = revoked_ms.saturating_add(self.expires_secs.saturating_mul(1000));
            return if now_ms < until_ms {
                Standing::Revoked { until_ms }
            } else {
                Standing::Over
            };
        }
        if now_ms / 1000 >= record.expires_at {
            return Standing::Over;
        }
        Standing::Current
    }

    /// Makes the session `id` and records its event, unless another replica made it first.
    async fn start(
        &self,
        parts: &Parts<'_>,
        person: &AccessClaims,
        id: String,
        context: &str,
    ) -> Result<(), NoSession> {
        let Some(found) = parts.contexts.get(context) else {
            return Err(NoSession::NoContext(context.to_owned()));
        };
        let registrant = Identity {
            iss: person.iss.clone(),
            sub: person.sub.clone(),
            name: person
                .claims
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            via: match person.key_source {
                KeySource::Configured => Via::Key,
                KeySource::Fetched => Via::Jwks,
            },
        };
        let record = session::for_person(
            registrant,
            id,
            PersonContext {
                name: context,
                team: found.team(),
                expires_secs: self.expires_secs,
                budget: self.budget,
                now_ms: crate::clock::now_millis(),
            },
        );
        if parts
            .store
            .session_insert(&record)
            .await
            .map_err(store)?
            .is_some()
        {
            return Ok(());
        }
        let mut event = AuditEvent::new(EventType::SessionCreated)
            .session_id(&record.session_id)
            .scp(&record.security_context)
            .team(&record.team)
            .auth("oauth")
            .iss(&person.iss)
            .sub(&person.sub);
        if let Some(client_id) = &person.client_id {
            event = event.client_id(client_id);
        }
        if let Some(jti) = &person.jti {
            event = event.jti(jti);
        }
        parts.audit.record(event).await.map_err(store)?;
        Ok(())
    }

    fn known(&self, who: &Person) -> Option<u64> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.get(who).copied()
    }

    fn remember(&self, who: Person, number: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.len() >= KNOWN_PEOPLE_CAPACITY {
            current.clear();
        }
        current.insert(who, number);
    }
}

enum Standing {
    Current,
    /// Expired, revoked long enough ago, or not theirs: the next number is the one to look at.
    Over,
    Revoked {
        until_ms: i64,
    },
}

fn store(error: impl std::fmt::Display) -> NoSession {
    NoSession::Store(error.to_string())
}

fn check_rule(rule: &PeopleRule) -> Result<(), String> {
    if rule.context.is_empty() {
        return Err("context: name the security context of the person's session".into());
    }
    match (&rule.group, &rule.claim, &rule.pattern) {
        (Some(group), None, None) if !group.is_empty() => Ok(()),
        (None, Some(claim), Some(pattern)) if !claim.is_empty() && !pattern.is_empty() => Ok(()),
        _ => Err("give either `group`, or `claim` with `pattern`".into()),
    }
}

/// Whether `pattern` matches the whole of `text`, each `*` standing for any run of characters. Between
/// the fixed first and last pieces, the leftmost place for each piece is as good as any, so this is
/// linear and never backtracks.
fn whole_match(pattern: &str, text: &str) -> bool {
    let pieces: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = pieces.as_slice() else {
        return pattern == text; // no `*` at all
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A person's part of their session ids: hex of SHA-256 over JCS of `[iss, sub]`, cut to 128 bits.
fn person_key(who: &Person) -> String {
    let digest = crate::envelope::jcs_sha256_hex(&serde_json::json!([who.iss, who.sub]));
    digest[..32].to_owned()
}

fn session_id(person_key: &str, number: u64) -> String {
    format!("mcp-{person_key}-{number}")
}

/// The number of the person's last session, 0 when they have none: found by doubling, then halving,
/// so a person with n sessions behind them costs about 2·log2(n) reads after a restart.
async fn last_number(store: &dyn Store, person_key: &str) -> StoreResult<u64> {
    let exists = |number: u64| {
        let id = session_id(person_key, number);
        async move { Ok::<_, crate::store::StoreError>(store.session_get(&id).await?.is_some()) }
    };
    if !exists(0).await? {
        return Ok(0);
    }
    let (mut low, mut high) = (0u64, 1u64);
    while exists(high).await? {
        low = high;
        high = high.saturating_mul(2);
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if exists(middle).await? {
            low = middle;
        } else {
            high = middle;
        }
    }
    Ok(low)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pattern_matches_the_whole_value() {
        assert!(whole_match("*@example.com", "pat@example.com"));
        assert!(!whole_match("*@example.com", "pat@example.com.evil"));
        assert!(!whole_match("*@example.com", "pat@evilexample.com"));
        assert!(whole_match("a*b*c", "abc"));
        assert!(whole_match("a*b*c", "axxbyyc"));
        assert!(!whole_match("a*b*c", "axxbyy"));
        assert!(
            !whole_match("ab*ba", "aba"),
            "the fixed ends may not overlap"
        );
        assert!(whole_match("exact", "exact"));
        assert!(!whole_match("exact", "exactly"));
        assert!(whole_match("*", ""));
    }

    fn people(rules: Value) -> People {
        let config = McpServerConfig {
            people: serde_json::from_value(rules).unwrap(),
            ..McpServerConfig::default()
        };
        let around = Surroundings {
            base_dir: std::path::Path::new("/"),
            groups_claim: "roles",
            skew_secs: 60,
            max_lifetime_secs: 86_400,
        };
        People::new(&config, &around).unwrap()
    }

    #[test]
    fn the_first_matching_rule_names_the_context() {
        let people = people(json!([
            {"group": "payments", "context": "payments-agent"},
            {"claim": "email", "pattern": "*@example.com", "context": "default-agent"}]));
        let claims = |v: Value| v.as_object().unwrap().clone();
        let both = claims(json!({"roles": ["staff", "payments"], "email": "pat@example.com"}));
        assert_eq!(people.context_for(&both), Some("payments-agent"));
        let email = claims(json!({"roles": ["payments-x"], "email": "bob@example.com"}));
        assert_eq!(people.context_for(&email), Some("default-agent"));
        // The groups claim is the configured one; a `groups` claim is not read.
        let other = claims(json!({"groups": ["payments"], "email": "eve@example.org"}));
        assert_eq!(people.context_for(&other), None);
    }

    #[test]
    fn a_rule_needs_a_group_or_a_claim_with_a_pattern() {
        let rule = |v: Value| serde_json::from_value::<PeopleRule>(v).unwrap();
        assert!(check_rule(&rule(json!({"group": "g", "context": "c"}))).is_ok());
        assert!(check_rule(&rule(json!({"claim": "email", "context": "c"}))).is_err());
        assert!(check_rule(&rule(
            json!({"group": "g", "claim": "e", "pattern": "*", "context": "c"})
        ))
        .is_err());
        assert!(check_rule(&rule(json!({"group": "g", "context": ""}))).is_err());
    }
}
